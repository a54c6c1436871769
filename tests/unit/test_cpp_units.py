"""Builds and runs the C++ unit tests of the core (tests/cpp/test_*.cc).

Each test file names the core sources it links in a ``// csrc: a.cc dir/b.cc``
line (paths relative to csrc/; ``(header-only)`` for none). Everything is
compiled with the compiler, flags and include directories the core itself is
built with (bindings/build_core.py), once per session into a temporary
directory: every core source once, all compiles in parallel. Each test file
then is one pytest case that runs its binary and expects exit status 0.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "tests" / "cpp"
CSRC = ROOT / "csrc"
TESTS = sorted(p.name for p in CPP.glob("test_*.cc"))
DEPS_LINE = re.compile(r"^// csrc:(.*)$", re.M)


def _load_build_core():
    spec = importlib.util.spec_from_file_location("commlib_build_core", ROOT / "bindings" / "build_core.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def csrc_deps(test: str) -> list[Path]:
    """The core sources test links in, from its ``// csrc:`` line."""
    match = DEPS_LINE.search((CPP / test).read_text())
    assert match, f"tests/cpp/{test} lacks a '// csrc: ...' line naming the core sources it needs"
    deps = [CSRC / tok for tok in match.group(1).split() if tok.endswith(".cc")]
    for dep in deps:
        assert dep.exists(), f"tests/cpp/{test} names {dep.relative_to(ROOT)}, which does not exist"
    return deps


def _run(cmd: list[str]) -> str | None:
    """None on success, else the command and its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"


class Build:
    """Compiles every test and the core sources they need, in parallel."""

    def __init__(self, out: Path):
        try:
            build_core = _load_build_core()
        except RuntimeError as exc:  # no MPI compiler wrapper: the core cannot be built either
            pytest.skip(f"no toolchain for the core: {exc}")
        flags = build_core.mpi_flags()
        self.cxx = build_core.cxx_compiler(flags)
        if not self.cxx:
            pytest.skip("no C++ compiler")
        includes = [f"-I{d}" for d in build_core.include_dirs(flags)] + [f"-I{CPP}"]
        # -O1: these binaries test logic, not speed, and build with 30% less CPU
        # than at the core's -O3 (this is the suite's slowest setup).
        self.cflags = [("-O1" if f == "-O3" else f) for f in build_core.compile_flags()] + includes
        self.out = out
        self.errors: dict[str, str] = {}  # test -> compile/link output
        self.binaries: dict[str, Path] = {}
        self._build()

    def _obj(self, src: Path) -> Path:
        rel = src.relative_to(ROOT).with_suffix(".o")
        return self.out / str(rel).replace(os.sep, "__")

    def _build(self) -> None:
        deps = {t: csrc_deps(t) for t in TESTS}
        sources = sorted({d for ds in deps.values() for d in ds} | {CPP / t for t in TESTS})
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            compiled = dict(zip(sources, pool.map(
                lambda s: _run([self.cxx, *self.cflags, "-c", str(s), "-o", str(self._obj(s))]), sources)))
            for test in TESTS:
                failed = [compiled[s] for s in [CPP / test, *deps[test]] if compiled[s]]
                if failed:
                    self.errors[test] = "\n".join(failed)
            linkable = [t for t in TESTS if t not in self.errors]
            linked = pool.map(lambda t: _run([self.cxx, *self.cflags, *map(str, self._objects(t, deps[t])),
                                              "-pthread", "-o", str(self._binary(t))]), linkable)
            for test, err in zip(linkable, linked):
                if err:
                    self.errors[test] = err
                else:
                    self.binaries[test] = self._binary(test)

    def _objects(self, test: str, deps: list[Path]) -> list[Path]:
        return [self._obj(CPP / test)] + [self._obj(d) for d in deps]

    def _binary(self, test: str) -> Path:
        return self.out / Path(test).stem


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Build:
    return Build(tmp_path_factory.mktemp("cpp_units"))


def test_every_test_file_is_collected():
    assert TESTS, "no tests/cpp/test_*.cc found"


@pytest.mark.parametrize("test", TESTS)
def test_cpp_unit(build: Build, test: str):
    assert test not in build.errors, f"building tests/cpp/{test} failed:\n{build.errors[test]}"
    proc = subprocess.run([str(build.binaries[test])], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"tests/cpp/{test} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    assert " 0 failed" in proc.stdout, proc.stdout
