"""Set-up of GPU workers (tests/gpu/): several ranks share one GPU as
../shared/GPU.md describes, each with its own NCCL_HOSTID (set here, before
NCCL starts)."""
import os

import torch
from mpi4py import MPI

RANK = MPI.COMM_WORLD.Get_rank()
os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
os.environ["NCCL_HOSTID"] = f"commlibtest{RANK}"
torch.set_num_threads(1)
DEVICE = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(DEVICE)
