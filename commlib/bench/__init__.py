"""The benchmark CLI (``python -m commlib.bench``, ``commlib-bench``):
collectives in the style of nccl-tests against raw MPI and gloo (bench), and
on CUDA buffers against torch.distributed's NCCL (bench_cuda). The only part
of commlib/ that imports a framework (torch, when installed).
"""
