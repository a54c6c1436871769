"""Finding the MPI launcher (``mpiexec``/``mpirun``) and telling which MPI it,
and the library that mpi4py loads, belong to: MPICH (hydra) or Open MPI.

Used by ``commlibrun`` (commlib.launch.launcher) and ``commlibrun --check-build``
(commlib.launch.check_build). Only the standard library is imported, and mpi4py is
only probed in a separate interpreter.
"""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

MPIEXEC_ENV = "COMMLIB_MPIEXEC"
MPICH = "mpich"
OPENMPI = "openmpi"


class LauncherError(Exception):
    """A problem with the command line or the MPI installation."""


@dataclass(frozen=True)
class MPIFlavour:
    """The MPI implementation behind ``mpiexec``."""

    name: str  # MPICH (hydra) or OPENMPI
    version: str  # e.g. "4.1.5"; "" if the text did not say

    @property
    def major(self):
        m = re.match(r"\d+", self.version)
        return int(m.group()) if m else 0

    def __str__(self):
        label = "MPICH (hydra)" if self.name == MPICH else "Open MPI"
        return f"{label} {self.version}".rstrip()


def detect_flavour(version_text):
    """Identify the MPI from the output of ``mpiexec --version``.

    Raises :class:`LauncherError` for an unrecognised launcher.
    """
    if "HYDRA" in version_text:
        m = re.search(r"^\s*Version:\s*(\S+)", version_text, re.MULTILINE)
        return MPIFlavour(MPICH, m.group(1) if m else "")
    m = re.search(r"\((?:Open MPI|OpenRTE)\)\s*(\S+)", version_text)
    if m:
        return MPIFlavour(OPENMPI, m.group(1))
    if re.search(r"\bprte|\bPRRTE", version_text, re.IGNORECASE):
        # A bare PRRTE launcher reports the PRRTE version, not Open MPI's;
        # PRRTE-based launching means Open MPI 5 command-line semantics.
        return MPIFlavour(OPENMPI, "5")
    first = version_text.strip().splitlines()[:1]
    raise LauncherError(
        f"unrecognised MPI launcher (expected MPICH hydra or Open MPI): {first[0] if first else 'no output'!r}"
    )


# Run in a separate interpreter: importing mpi4py.MPI would otherwise load
# (and, by default, initialise) MPI in the launcher.
MPI4PY_LIBRARY_PROBE = (
    "import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
    "from mpi4py import MPI\n"
    "print(MPI.Get_library_version().strip().splitlines()[0])\n"
)


def library_flavour(version_line):
    """MPICH or OPENMPI from the first line of ``MPI_Get_library_version``, else None."""
    if version_line.startswith("Open MPI"):
        return OPENMPI
    if version_line.startswith("MPICH"):
        return MPICH
    return None


def mpi4py_library_flavour(python=sys.executable):
    """Flavour of the MPI library that ``python``'s mpi4py (and so commlib) loads, or None."""
    try:
        out = subprocess.run([python, "-c", MPI4PY_LIBRARY_PROBE], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=60,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return library_flavour(out.stdout.decode(errors="replace").strip())


def mpiexec_candidates(environ=os.environ):
    """Every mpiexec, then every mpirun, on PATH, in PATH order, each file once."""
    found, seen = [], set()
    for name in ("mpiexec", "mpirun"):
        for directory in (environ.get("PATH") or "").split(os.pathsep):
            path = shutil.which(name, path=directory) if directory else None
            if path and os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                found.append(path)
    return found


def find_mpiexec(environ=os.environ, python=None):
    """Path of the MPI launcher: ``$COMMLIB_MPIEXEC``, else mpiexec/mpirun on PATH.

    With ``python`` (an interpreter whose mpi4py commlib uses) and more than one
    launcher on PATH, the first one of the same MPI as that mpi4py's library
    is chosen: another MPI's mpiexec earlier on PATH (e.g. the PyPI MPICH
    wheel's, next to a system Open MPI) would start every rank as a singleton
    or, through a wrapper script, in another environment.
    """
    override = environ.get(MPIEXEC_ENV)
    if override:
        return override
    candidates = mpiexec_candidates(environ)
    if not candidates:
        raise LauncherError(f"no mpiexec or mpirun found on PATH (set {MPIEXEC_ENV} to its path)")
    if python is None or len(candidates) == 1:
        return candidates[0]
    wanted = mpi4py_library_flavour(python)
    if wanted is None:
        return candidates[0]
    for candidate in candidates:
        try:
            if detect_flavour(mpiexec_version_text(candidate)).name == wanted:
                return candidate
        except LauncherError:
            continue
    return candidates[0]


def mpiexec_version_text(mpiexec):
    """Output (stdout and stderr) of ``<mpiexec> --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LauncherError(f"cannot run {mpiexec} --version: {e}") from e
    return out.stdout.decode(errors="replace")
