"""The GPU libraries commlib loads at run time, and which path CUDA tensors take.

NCCL and the CUDA runtime are never needed to build or install commlib: the
core ``dlopen``s them on first use (csrc/backends/nccl/loader.h). NCCL comes
from ``COMMLIB_NCCL_LIBRARY`` when it is set (nothing else is tried), else the
``nvidia-nccl-cu*`` wheel's ``nvidia/nccl/lib/libnccl.so.2`` (found here and
passed in), else the system's ``libnccl.so.2``; the CUDA runtime is the one the
framework already loaded, else ``libcudart.so.13/.12/...``.

    import commlib.gpu
    status = commlib.gpu.load()
    status.nccl.usable, status.nccl.version_text, status.nccl.path, status.nccl.error
    commlib.gpu.cuda_path()        # "nccl" or "host", per COMMLIB_GPU_BACKEND

Framework-free: frontends ask :func:`cuda_path` which path a CUDA tensor takes.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import NamedTuple

from ._lib import check as _check
from ._lib import ffi, lib
from .config import check as _check_config

NCCL_SONAME = "libnccl.so.2"
BACKENDS = ("auto", "nccl", "host")


class Library(NamedTuple):
    usable: bool
    version: int        # ncclGetVersion's / cudaRuntimeGetVersion's code (0: unknown)
    path: str           # where it was loaded from ("" if it was not)
    error: str          # why it is not usable ("" when it is)

    @property
    def version_text(self) -> str:
        return "" if not self.version else _version_text(self.version)


class GpuStatus(NamedTuple):
    nccl: Library
    cuda: Library


def _version_text(code: int) -> str:
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code >= 10000 else f"{code}"


def cuda_version_text(code: int) -> str:
    """cudaRuntimeGetVersion's 12040 as "12.4"."""
    return f"{code // 1000}.{code % 1000 // 10}"


def wheel_library() -> str:
    """The nvidia-nccl-cu* wheel's libnccl.so.2, or "" when no such wheel is installed."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return ""
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(location, "lib", NCCL_SONAME)
        if os.path.exists(candidate):
            return candidate
    return ""


def _library(which: int) -> Library | None:
    version, path, error = ffi.new("int*"), ffi.new("const char**"), ffi.new("const char**")
    rc = lib.commlib_gpu_library(which, version, path, error)
    if rc < 0:
        return None
    text = lambda p: ffi.string(p[0]).decode("utf-8", "replace")  # noqa: E731
    return Library(rc == 1, version[0], text(path), text(error))


def load() -> GpuStatus:
    """Loads NCCL and the CUDA runtime (once per process; an unusable result
    is retried) and says what was found. No ``init()`` needed."""
    explicit = os.environ.get("COMMLIB_NCCL_LIBRARY", "")
    _check(lib.commlib_gpu_load(explicit.encode(), wheel_library().encode()))
    return GpuStatus(_library(0), _library(1))


def backend(environ=None) -> str:
    """``COMMLIB_GPU_BACKEND`` (auto|nccl|host); ValueError for another value."""
    env = os.environ if environ is None else environ
    value = env.get("COMMLIB_GPU_BACKEND") or "auto"
    _check_config("COMMLIB_GPU_BACKEND", value)
    return value


_sync_mode: list = []


def sync_mode() -> str:
    """``COMMLIB_CUDA_SYNC`` (stream|host, read once per process): how
    frontends synchronize collectives on CUDA tensors that run through NCCL.
    ValueError for another value."""
    if not _sync_mode:
        value = os.environ.get("COMMLIB_CUDA_SYNC") or "stream"
        _check_config("COMMLIB_CUDA_SYNC", value)
        _sync_mode.append(value)
    return _sync_mode[0]


def choose_path(backend_name: str, status: GpuStatus) -> tuple[str, str]:
    """``(path, why)``: "nccl" or "host" for CUDA tensors under
    ``backend_name`` given what loaded; RuntimeError when nccl is asked for and
    cannot run."""
    nccl_ready = status.nccl.usable and status.cuda.usable
    if backend_name == "host":
        return "host", "COMMLIB_GPU_BACKEND=host"
    if nccl_ready:
        return "nccl", f"NCCL {status.nccl.version_text} ({status.nccl.path})"
    reason = status.nccl.error if not status.nccl.usable else f"CUDA runtime: {status.cuda.error}"
    if backend_name == "nccl":
        raise RuntimeError(f"COMMLIB_GPU_BACKEND=nccl, but NCCL cannot run: {reason}")
    return "host", f"NCCL is not usable ({reason})"


_announced: dict[str, str] = {}


def cuda_path() -> str:
    """The path CUDA tensors take in this process, "nccl" or "host"; the first
    call prints which one and why (stderr, once per process)."""
    if "path" not in _announced:
        path, why = choose_path(backend(), load())
        route = "through NCCL" if path == "nccl" else "staged through pinned host memory and the CPU path"
        print(f"commlib: CUDA tensors go {route}: {why}", file=sys.stderr, flush=True)
        _announced["path"] = path
    return _announced["path"]


def unique_id(process_set: int = 0) -> bytes:
    """An NCCL unique id made on rank 0 of the set and received by every
    member over MPI (128 bytes). Collective, with no collective of the set in
    flight; needs ``init()`` and a usable NCCL (``load()``)."""
    out = ffi.new("uint8_t[128]")
    _check(lib.commlib_nccl_unique_id(process_set, out))
    return bytes(ffi.buffer(out, 128))


def describe(library: Library, name: str) -> str:
    """One line for ``commlibrun --check-build``."""
    if library is None:
        return "not loaded"
    version = library.version_text if name == "NCCL" else (
        cuda_version_text(library.version) if library.version else "")
    if library.usable:
        return f"usable {version} ({library.path})"
    return f"not usable ({library.error})"
