"""Files a model lives in: the safetensors container with JSON metadata (``checkpoint``), what a
model file holds (``model_file``), and the reader of format 1 (``checkpoint_v1``)."""
