"""NCCL and the CUDA runtime loaded at run time (commlib.gpu, the core's
csrc/backends/nccl/loader.cc), the COMMLIB_GPU_BACKEND choice and the
``--check-build`` lines. Loading is kept per process once NCCL loads, so the
cases with another COMMLIB_NCCL_LIBRARY run in a fresh interpreter."""
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import commlib.config
import commlib.gpu as gpu
from commlib.launch import check_build

REPO = Path(__file__).resolve().parents[2]
WHEEL = gpu.wheel_library()
needs_wheel = pytest.mark.skipif(not WHEEL, reason="no nvidia-nccl-cu* wheel installed (pip install nvidia-nccl-cu13)")


def wheel_version():
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.startswith("nvidia-nccl-cu"):
            return dist.version
    raise AssertionError("nvidia-nccl wheel without metadata")


def load_in_child(env_extra):
    """commlib.gpu.load() in a fresh interpreter with env_extra: its status as a dict."""
    code = ("import json, commlib.gpu as g; s = g.load(); "
            "print(json.dumps({k: v._asdict() for k, v in s._asdict().items()}))")
    env = dict(os.environ, PYTHONPATH=str(REPO), **env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_wheel
def test_nccl_from_the_wheel_reports_the_wheels_version(monkeypatch):
    monkeypatch.delenv("COMMLIB_NCCL_LIBRARY", raising=False)
    status = gpu.load()
    assert status.nccl.usable, status.nccl.error
    assert status.nccl.error == ""
    assert os.path.realpath(status.nccl.path) == os.path.realpath(WHEEL)
    assert status.nccl.version_text == wheel_version()


@needs_wheel
def test_explicit_library_is_used_and_nothing_else():
    status = load_in_child({"COMMLIB_NCCL_LIBRARY": WHEEL})
    assert status["nccl"]["usable"] and os.path.realpath(status["nccl"]["path"]) == os.path.realpath(WHEEL)
    bad = "/nonexistent/libnccl.so.2"
    status = load_in_child({"COMMLIB_NCCL_LIBRARY": bad})
    assert not status["nccl"]["usable"]
    assert status["nccl"]["error"].startswith(f"COMMLIB_NCCL_LIBRARY='{bad}': ")
    assert "No such file" in status["nccl"]["error"]


def test_a_library_that_is_not_nccl_is_refused_by_name():
    not_nccl = str(next((REPO / "commlib").glob("_core*.so")))
    status = load_in_child({"COMMLIB_NCCL_LIBRARY": not_nccl})
    assert not status["nccl"]["usable"]
    assert status["nccl"]["error"] == (f"COMMLIB_NCCL_LIBRARY='{not_nccl}': {not_nccl} is not a usable NCCL: "
                                       "it lacks ncclGetVersion")


def test_cuda_runtime_line_matches_what_torch_sees():
    torch = pytest.importorskip("torch")
    status = gpu.load()
    assert status.cuda.usable == torch.cuda.is_available()
    assert (status.cuda.error == "") == status.cuda.usable
    if not status.cuda.usable:
        assert "CUDA runtime" in status.cuda.error or "cudaGetDeviceCount" in status.cuda.error or \
            "no CUDA device" in status.cuda.error


def test_check_build_names_the_reason(monkeypatch):
    monkeypatch.setenv("COMMLIB_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nccl, cuda = check_build.gpu_status()
    assert nccl.startswith("not usable (COMMLIB_NCCL_LIBRARY='/nonexistent/libnccl.so.2': ")
    assert cuda.startswith("usable ") or cuda.startswith("not usable (")


@needs_wheel
def test_check_build_reports_version_and_path(monkeypatch):
    monkeypatch.delenv("COMMLIB_NCCL_LIBRARY", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nccl, _ = check_build.gpu_status()
    assert nccl == f"usable {wheel_version()} ({WHEEL})"


def test_gpu_backend_is_in_the_config_table():
    defaults = {e.name: e.default for e in commlib.config.table()}
    assert defaults["COMMLIB_GPU_BACKEND"] == "auto"
    assert defaults["COMMLIB_NCCL_LIBRARY"] == ""
    for good in gpu.BACKENDS:
        commlib.config.check("COMMLIB_GPU_BACKEND", good)
        assert gpu.backend({"COMMLIB_GPU_BACKEND": good}) == good
    assert gpu.backend({}) == "auto"
    with pytest.raises(ValueError, match="COMMLIB_GPU_BACKEND='cuda'"):
        gpu.backend({"COMMLIB_GPU_BACKEND": "cuda"})


def lib(usable, error="", version=0, path=""):
    return gpu.Library(usable, version, path, error)


def test_choose_path():
    ready = gpu.GpuStatus(lib(True, version=22809, path="/x/libnccl.so.2"), lib(True, version=13000))
    no_cuda = gpu.GpuStatus(lib(True, version=22809), lib(False, "no CUDA device visible"))
    no_nccl = gpu.GpuStatus(lib(False, "libnccl.so.2: cannot open"), lib(True))
    assert gpu.choose_path("auto", ready) == ("nccl", "NCCL 2.28.9 (/x/libnccl.so.2)")
    assert gpu.choose_path("nccl", ready)[0] == "nccl"
    assert gpu.choose_path("host", ready) == ("host", "COMMLIB_GPU_BACKEND=host")
    assert gpu.choose_path("auto", no_cuda) == ("host", "NCCL is not usable (CUDA runtime: no CUDA device visible)")
    assert gpu.choose_path("auto", no_nccl) == ("host", "NCCL is not usable (libnccl.so.2: cannot open)")
    with pytest.raises(RuntimeError, match="COMMLIB_GPU_BACKEND=nccl, but NCCL cannot run: libnccl.so.2: cannot"):
        gpu.choose_path("nccl", no_nccl)


def test_version_texts():
    assert gpu.Library(True, 23203, "", "").version_text == "2.32.3"
    assert gpu.Library(True, 2708, "", "").version_text == "2708"  # (pre-2.9 codes: not loaded, too old)
    assert gpu.cuda_version_text(12040) == "12.4"
    assert gpu.cuda_version_text(13000) == "13.0"


def test_bench_device_cuda_without_a_gpu_says_why():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the benchmark would run")
    out = subprocess.run([sys.executable, "-m", "commlib.bench", "--device", "cuda"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 2, out
    assert out.stderr.strip() == f"commlib.bench: --device cuda needs a CUDA device, and torch {torch.__version__} sees none"
    assert "Traceback" not in out.stderr
