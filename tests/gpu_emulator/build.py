"""Builds the GPU emulator (test infrastructure) and gives the environment
that makes commlib load it in place of the CUDA runtime and NCCL.

The emulator is one shared library exporting the CUDA runtime and NCCL entry
points commlib's loader binds (csrc/backends/nccl/loader.cc), written here
from their public API documentation: "device" memory is host memory, a
stream is a thread running its queued work in order, NCCL calls run on those
streams and move data between the ranks' processes of one host
(emu_stream.h, emu_cuda.cc, emu_nccl.cc). It lets CI run the core's NCCL
executor (ready and completion events, fusion in a device buffer, grouped
calls, PreMulSum, communicators per process set, the GPU-side timeout and
ncclCommAbort) on a machine without a GPU. It does not stand for real GPU
runs: tests/gpu/ needs one.

The directory holds ``libcudart.so.13`` and ``libnccl.so.2``, both links to
the library: with it first on LD_LIBRARY_PATH and COMMLIB_NCCL_LIBRARY naming
the NCCL link, commlib's loader finds both (one library, loaded once).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("emu_cuda.cc", "emu_nccl.cc")
LIBRARY = "libcommlib_gpu_emulator.so"


def build(out: Path, cxx: str) -> dict:
    """Compiles the emulator into out with the C++ compiler cxx; returns the
    environment variables that select it. RuntimeError with the compiler's
    output if it does not build."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / LIBRARY
    cmd = [cxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared", "-pthread",
           *(str(HERE / s) for s in SOURCES), "-o", str(target), "-lrt"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    for name in ("libcudart.so.13", "libnccl.so.2"):
        link = out / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(LIBRARY)
    path = os.environ.get("LD_LIBRARY_PATH", "")
    # (CONNECT: a communicator's first collective of each kind blocks the
    # issuing thread until every member has issued one, as NCCL's does)
    return {"LD_LIBRARY_PATH": os.pathsep.join([str(out)] + ([path] if path else [])),
            "COMMLIB_NCCL_LIBRARY": str(out / "libnccl.so.2"), "COMMLIB_GPU_EMULATOR_CONNECT": "1"}
