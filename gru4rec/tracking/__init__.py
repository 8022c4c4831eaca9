"""What a training run leaves behind as it goes: run folders (``runs``) and TensorBoard scalars
(``tensorboard``), both plain ``fit`` callbacks."""
