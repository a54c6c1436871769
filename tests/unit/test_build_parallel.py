"""The core's build compiles its sources in parallel (bindings/build_core.py):
the patched distutils compile still builds every object, raises a failing
source's CompileError, and COMMLIB_BUILD_JOBS is checked."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build_core():
    spec = importlib.util.spec_from_file_location("commlib_build_core_p", ROOT / "bindings" / "build_core.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except RuntimeError as exc:  # no MPI compiler wrapper
        pytest.skip(f"no toolchain for the core: {exc}")
    return module


def test_parallel_compile_builds_every_object_and_reports_errors(build_core, tmp_path, monkeypatch):
    from distutils import ccompiler
    from distutils.errors import CompileError

    assert getattr(ccompiler.CCompiler.compile, "_commlib_parallel", False)
    monkeypatch.setenv("COMMLIB_BUILD_JOBS", "3")
    sources = []
    for i in range(5):
        src = tmp_path / f"s{i}.c"
        src.write_text(f"int f{i}(void) {{ return {i}; }}\n")
        sources.append(str(src))
    compiler = ccompiler.new_compiler()
    objects = compiler.compile(sources, output_dir=str(tmp_path / "obj"))
    assert len(objects) == 5 and all(Path(o).stat().st_size > 0 for o in objects)

    bad = tmp_path / "bad.c"
    bad.write_text("int g(void) { return undeclared_name; }\n")
    with pytest.raises(CompileError):
        compiler.compile(sources[:2] + [str(bad)], output_dir=str(tmp_path / "obj2"))


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_build_jobs_refuses_bad_values(build_core, monkeypatch, value):
    monkeypatch.setenv("COMMLIB_BUILD_JOBS", value)
    with pytest.raises(ValueError, match="COMMLIB_BUILD_JOBS"):
        build_core.build_jobs()


def test_build_jobs_defaults_to_the_usable_cores(build_core, monkeypatch):
    import os

    monkeypatch.delenv("COMMLIB_BUILD_JOBS", raising=False)
    assert build_core.build_jobs() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("COMMLIB_BUILD_JOBS", "7")
    assert build_core.build_jobs() == 7
