"""Horovod's build queries (``mpi_built``, ``nccl_built``, ...) answered for
commlib. Re-exported by the framework frontends."""


def mpi_enabled() -> bool:
    """MPI carries all of commlib's communication (always, today)."""
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """The NCCL version compiled in, as Horovod reports it: 0, none yet."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
