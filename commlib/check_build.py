"""``commlibrun --check-build``: report what commlib can use on this machine.

Every probe catches its own failures and reports them as text, so the report
is useful precisely when something is missing or broken.
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

from . import mpi_discovery

NCCL_LIBRARY = "libnccl.so.2"
FRAMEWORKS = ("torch", "tensorflow")

# Run in a separate interpreter: importing mpi4py.MPI would otherwise
# initialise MPI in (or crash) the calling process.
_MPI4PY_PROBE = mpi_discovery.MPI4PY_LIBRARY_PROBE


def _error(e):
    return f"{type(e).__name__}: {e}"


def mpi_launcher_status():
    """Flavour and version of the MPI launcher commlibrun would use."""
    try:
        mpiexec = mpi_discovery.find_mpiexec(python=sys.executable)
        flavour = mpi_discovery.detect_flavour(mpi_discovery.mpiexec_version_text(mpiexec))
        return f"{flavour} ({mpiexec})"
    except mpi_discovery.LauncherError as e:
        return f"not usable ({e})"


def _probe(code: str, timeout: float):
    """Runs ``code`` in a child interpreter: (True, its stdout) or (False,
    what went wrong: the last line of its stderr, or why it could not run)."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, _error(e)
    if out.returncode != 0:
        lines = out.stderr.decode(errors="replace").strip().splitlines()
        return False, lines[-1] if lines else f"exit code {out.returncode}"
    return True, out.stdout.decode(errors="replace")


def mpi_library_status():
    """First line of ``MPI.Get_library_version()`` as seen by mpi4py."""
    ok, text = _probe(_MPI4PY_PROBE, 60)
    return " ".join(text.split()) if ok else f"unknown (mpi4py: {text})"


def _nccl_candidates():
    """``libnccl.so.2`` via the loader path, then inside a ``nvidia.nccl`` wheel."""
    yield NCCL_LIBRARY
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for location in (spec.submodule_search_locations or []) if spec else []:
        yield os.path.join(location, "lib", NCCL_LIBRARY)


def _nccl_version(lib):
    version = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(version)) != 0:
        return "unknown version"
    v = version.value
    # NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older major*1000 + ...
    major, rest = divmod(v, 10000) if v >= 10000 else divmod(v, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_status():
    errors = []
    for candidate in _nccl_candidates():
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            errors.append(str(e))
            continue
        try:
            version = _nccl_version(lib)
        except AttributeError:
            version = "unknown version"
        return f"available {version} ({candidate})"
    return f"not available ({'; '.join(errors)})"


def framework_status(name):
    """Whether framework ``name`` is installed, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        return f"unknown ({_error(e)})"
    if spec is None:
        return "not installed"
    try:
        return f"installed {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return "installed"


# As commlib loads it (commlib._lib): mpi4py first, so that the core binds to
# the MPI library mpi4py loaded; in a separate interpreter for the same reason
# as the mpi4py probe.
_CORE_PROBE = "import commlib._lib, commlib._core as c; print(c.__file__)"


def core_status():
    """Whether the compiled core ``commlib._core`` loads as commlib loads it."""
    ok, text = _probe(_CORE_PROBE, 120)
    return f"built ({text.strip()})" if ok else f"not built or not loadable ({text})"


def report():
    """The multi-line ``--check-build`` report."""
    rows = [("MPI flavour", mpi_launcher_status()),
            ("MPI library", mpi_library_status()),
            ("NCCL", nccl_status())]
    rows += [(name, framework_status(name)) for name in FRAMEWORKS]
    rows.append(("commlib._core", core_status()))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(["commlib build check:"] + [f"  {label + ':':<{width}}{value}" for label, value in rows])
