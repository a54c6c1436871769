"""frontends/torch/optim/_dispatch.py recognises torch optimizers without
importing torch (one process, no MPI)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

DISPATCH = Path(__file__).resolve().parents[2] / "frontends" / "torch" / "optim" / "_dispatch.py"


def load():
    spec = importlib.util.spec_from_file_location("_torch_dispatch", DISPATCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_does_not_import_torch():
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('d', {str(DISPATCH)!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"assert m.is_torch_optimizer(object()) is False\n"
            f"assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_recognises_torch_optimizers():
    torch = pytest.importorskip("torch")
    mod = load()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert mod.is_torch_optimizer(opt)
    assert not mod.is_torch_optimizer(torch.ones(2))
    assert not mod.is_torch_optimizer("sgd")
