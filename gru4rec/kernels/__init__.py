"""Fast paths for the CPU (fused C kernels) and the GPU (CUDA-graph replay), each behind one probe."""
