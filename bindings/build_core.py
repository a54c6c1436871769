"""cffi builder for commlib._core (API mode).

Compiles every C++ source under csrc/ together with the cffi glue into one
extension module. MPI is found through the MPI compiler wrapper: the one named
by COMMLIB_MPICXX, else ``mpicxx`` on PATH (the PyPI ``mpich`` wheel puts one
there; so does Debian's Open MPI). Its flags (``-show`` for MPICH,
``--showme`` for Open MPI) give the include and library directories.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from cffi import FFI
from concurrent.futures import ThreadPoolExecutor

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
HEADER = CSRC / "include" / "commlib" / "c_api.h"


def cdef_from_header(text: str) -> str:
    """The declarations of c_api.h without preprocessor lines and extern "C"."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    keep = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or stripped.startswith('extern "C"') or stripped == "}":
            continue
        keep.append(line)
    return "\n".join(keep)


def _mpi_wrapper() -> str:
    explicit = os.environ.get("COMMLIB_MPICXX")
    if explicit:
        return explicit
    for name in ("mpicxx", "mpic++", "mpiCC"):
        found = shutil.which(name)
        if found:
            return found
    candidate = Path(sys.prefix) / "bin" / "mpicxx"
    if candidate.exists():
        return str(candidate)
    raise RuntimeError(
        "commlib needs an MPI C++ compiler wrapper (mpicxx) to build. "
        "Install the PyPI MPICH wheel (`pip install mpich`) or a system MPI, "
        "or set COMMLIB_MPICXX to the wrapper's path."
    )


def mpi_flags() -> dict:
    """Include dirs, library dirs, libraries and extra link args of the MPI
    wrapper, and the compiler it wraps ("compiler")."""
    wrapper = _mpi_wrapper()
    out = None
    for flag in ("-show", "--showme"):
        try:
            proc = subprocess.run([wrapper, flag], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if proc.returncode == 0 and proc.stdout.strip():
            out = proc.stdout
            break
    if out is None:
        raise RuntimeError(f"could not read compile flags from {wrapper} (-show / --showme)")
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
    tokens = shlex.split(out)
    flags["compiler"] = tokens[0] if tokens else ""
    tokens = tokens[1:]  # first token is the underlying compiler
    skip_next = False
    for tok in tokens:
        # The wrapper's own rpath may point into a temporary build
        # environment; rpaths() below decides where libmpi is looked up.
        if skip_next:
            skip_next = False
            continue
        if tok == "-Wl,-rpath":
            skip_next = True
            continue
        if tok.startswith("-Wl,-rpath,") or tok.startswith("-Wl,-R"):
            continue
        if tok.startswith("-I"):
            flags["include_dirs"].append(tok[2:])
        elif tok.startswith("-L"):
            flags["library_dirs"].append(tok[2:])
        elif tok.startswith("-l"):
            flags["libraries"].append(tok[2:])
        elif tok.startswith("-Wl,") or tok == "-pthread":
            flags["extra_link_args"].append(tok)
    return flags


def split_libraries(libraries: list[str], library_dirs: list[str]) -> tuple[list[str], list[str]]:
    """``(paths, names)``: the wrapper's libraries found in its own ``-L``
    directories, as file paths to link directly, and the rest as ``-l`` names.

    A plain ``-lmpi`` is looked up in every ``-L`` directory of the link line,
    and the interpreter's own flags (sysconfig's LDSHARED, e.g.
    ``-L<python prefix>/lib``) come first there. When that directory holds a
    different MPI's ``libmpi.so`` (the PyPI MPICH wheel installs one into the
    prefix of the interpreter it is installed in), ``-lmpi`` would bind the core
    to that MPI while it is compiled against the wrapper's headers. Linking the
    wrapper's own library file by path avoids that; the extension still records
    the library's soname (e.g. libmpi.so.40), found at run time through
    rpaths() and the library mpi4py already loaded.
    """
    paths, names = [], []
    for name in libraries:
        for directory in library_dirs:
            candidate = Path(directory) / f"lib{name}.so"
            if candidate.exists():
                paths.append(str(candidate))
                break
        else:
            names.append(name)
    return paths, names


def rpaths(library_dirs: list[str]) -> list[str]:
    """Where the extension looks for libmpi at run time.

    ``$ORIGIN/../../..`` is ``<prefix>/lib`` for an installed package
    (``<prefix>/lib/pythonX.Y/site-packages/commlib``), where the PyPI MPICH
    wheel keeps libmpi.so.12; the build-time directories cover system MPIs.
    commlib also imports mpi4py first, so the library mpi4py loaded is the one
    the extension binds to (same soname).
    """
    paths = ["$ORIGIN/../../.."]
    prefix_lib = Path(sys.prefix) / "lib"
    if any(prefix_lib.glob("libmpi.so*")):
        paths.append(str(prefix_lib))
    paths += [d for d in library_dirs if "pip-build-env" not in d]
    return [f"-Wl,-rpath,{p}" for p in dict.fromkeys(paths)]


# Compile flags of every C++ source of the core (the C++ unit tests in
# tests/cpp use the same ones, through compile_flags()).
CXX_FLAGS = [
    "-std=c++17", "-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function",
    "-DOMPI_SKIP_MPICXX", "-DMPICH_SKIP_MPICXX",
]


def compile_flags() -> list[str]:
    """The compile flags the core is built with (besides include directories)."""
    return list(CXX_FLAGS)


def include_dirs(flags: dict | None = None) -> list[str]:
    """The include directories of the core's sources: csrc/include, csrc/ and
    MPI's (from mpi_flags(), or the given result of it)."""
    flags = flags if flags is not None else mpi_flags()
    return [str(CSRC / "include"), str(CSRC)] + flags["include_dirs"]


def cxx_compiler(flags: dict | None = None) -> str:
    """A C++ compiler for code built like the core: the one the MPI wrapper
    wraps (e.g. ``c++``), else $CXX, c++, g++ or clang++; "" if none exists."""
    flags = flags if flags is not None else mpi_flags()
    for name in (flags.get("compiler"), os.environ.get("CXX"), "c++", "g++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return ""


def build_jobs() -> int:
    """How many sources are compiled at once: COMMLIB_BUILD_JOBS, else the
    cores this process may run on."""
    value = os.environ.get("COMMLIB_BUILD_JOBS", "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"COMMLIB_BUILD_JOBS must be a positive integer, not {value!r}")
        return int(value)
    return max(1, len(os.sched_getaffinity(0)))


def compile_sources_in_parallel() -> None:
    """Make setuptools compile an extension's sources on build_jobs() threads.

    distutils compiles one source after another; the core has ~70 of them, so
    on a 16-core machine the build waits on one core. This replaces
    ``CCompiler.compile`` by the same steps (its private ``_setup_compile``,
    ``_get_cc_args`` and ``_compile``, unchanged for decades) run on a thread
    pool; each ``_compile`` is one compiler process. Where those methods are
    missing the serial compile stays."""
    try:
        import setuptools  # noqa: F401  (puts setuptools' distutils in place)
        from distutils import ccompiler
    except ImportError:
        return
    base = ccompiler.CCompiler
    if getattr(base.compile, "_commlib_parallel", False):
        return
    if not all(hasattr(base, name) for name in ("_setup_compile", "_get_cc_args", "_compile")):
        return

    def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [(obj, *build[obj]) for obj in objects if obj in build]
        with ThreadPoolExecutor(max_workers=build_jobs()) as pool:
            for done in [pool.submit(self._compile, obj, src, ext, cc_args, extra_postargs, pp_opts)
                         for obj, src, ext in todo]:
                done.result()  # (raises the first CompileError)
        return objects

    compile._commlib_parallel = True
    base.compile = compile


def make_ffi() -> FFI:
    flags = mpi_flags()
    library_paths, library_names = split_libraries(flags["libraries"] or ["mpi"], flags["library_dirs"])
    sources = sorted(str(p.relative_to(ROOT)) for p in CSRC.rglob("*.cc"))
    ffi = FFI()
    ffi.cdef(cdef_from_header(HEADER.read_text()))
    ffi.set_source(
        "commlib._core",
        '#include "commlib/c_api.h"\n',
        source_extension=".cpp",
        sources=sources,
        include_dirs=include_dirs(flags),
        library_dirs=flags["library_dirs"],
        libraries=library_names,
        extra_objects=library_paths,
        extra_compile_args=compile_flags(),
        extra_link_args=flags["extra_link_args"] + rpaths(flags["library_dirs"]) + ["-lstdc++"],
    )
    return ffi


compile_sources_in_parallel()
ffibuilder = make_ffi()

if __name__ == "__main__":
    os.chdir(ROOT)
    ffibuilder.compile(verbose=True)
