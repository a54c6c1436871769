"""CUDA tensors: collectives through NCCL (cuda_nccl, routed by
cuda_dispatch), point-to-point (cuda_p2p) and host staging where NCCL cannot
take a tensor (cuda_staging). Nothing is imported here."""
