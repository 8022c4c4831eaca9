"""Fast paths, each behind one probe: the fused CPU kernels (``cpu`` on tensors, ``build``
compiles ``cpu_kernels.c``), glibc's thresholds for freed memory (``memory``), the CPU's features
(``cpu_features``) and CUDA-graph replay of the training step (``gpu``). Nothing here imports
:mod:`gru4rec.training`: the training code uses these, never the reverse."""
