"""``commlibrun --check-build``: report what commlib can use on this machine.

Every probe catches its own failures and reports them as text, so the report
is useful precisely when something is missing or broken.
"""

import importlib.metadata
import importlib.util
import subprocess
import sys

from . import mpi_discovery

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


# NCCL and the CUDA runtime as the core loads them (commlib.gpu), in a
# separate interpreter for the same reason as the core probe below.
_GPU_PROBE = ("import commlib.gpu as g; s = g.load(); "
              "print(g.describe(s.nccl, 'NCCL')); print(g.describe(s.cuda, 'CUDA'))")


def gpu_status():
    """``(NCCL line, CUDA runtime line)``: version and path, or why unusable."""
    ok, text = _probe(_GPU_PROBE, 120)
    lines = text.strip().splitlines()
    if not ok or len(lines) != 2:
        why = f"unknown (the core could not probe it: {text.strip() or 'no answer'})"
        return why, why
    return lines[0], lines[1]


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
    nccl, cuda = gpu_status()
    rows = [("MPI flavour", mpi_launcher_status()),
            ("MPI library", mpi_library_status()),
            ("NCCL", nccl),
            ("CUDA runtime", cuda)]
    rows += [(name, framework_status(name)) for name in FRAMEWORKS]
    rows.append(("commlib._core", core_status()))
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join(["commlib build check:"] + [f"  {label + ':':<{width}}{value}" for label, value in rows])
