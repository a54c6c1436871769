"""commlib.DistributedOptimizer dispatches through the frontends' registry
(commlib.dispatch), in one process without MPI."""
import subprocess
import sys

import pytest

from commlib import dispatch


@pytest.fixture
def registry(monkeypatch):
    """A registry of this test's own, emptied of the real frontends."""
    monkeypatch.setattr(dispatch, "_registry", {})
    return dispatch


def fake_optimizer(module):
    return type("Opt", (), {"__module__": module})()


def test_dispatches_to_the_frontend_that_accepts(registry):
    registry.register_optimizer("fake.a", lambda o: type(o).__module__ == "fw_a.optim",
                                lambda o, *a, **k: ("a", o, a, k))
    registry.register_optimizer("fake.b", lambda o: type(o).__module__ == "fw_b.optim",
                                lambda o, *a, **k: ("b", o, a, k))
    opt = fake_optimizer("fw_b.optim")
    assert registry.DistributedOptimizer(opt, 1, x=2) == ("b", opt, (1,), {"x": 2})
    assert registry.registered_frontends() == ["fake.a", "fake.b"]
    # registering a name again replaces its entry
    registry.register_optimizer("fake.b", lambda o: True, lambda o: "b2")
    assert registry.DistributedOptimizer(opt) == "b2"
    assert registry.registered_frontends() == ["fake.a", "fake.b"]


def test_unknown_optimizer_names_what_to_import(registry):
    with pytest.raises(TypeError, match=r"import commlib\.torch.*import commlib\.tensorflow"):
        registry.DistributedOptimizer(object())


def test_frontend_of_the_framework_imported_by_name(registry, monkeypatch, tmp_path):
    """An optimizer of a known framework whose frontend is not imported yet
    loads it by name, once; the frontend registers itself while it loads."""
    (tmp_path / "fake_frontend_c.py").write_text(
        "from commlib.dispatch import register_optimizer\n"
        "LOADS = globals().get('LOADS', 0) + 1\n"
        "register_optimizer(__name__, lambda o: type(o).__module__.startswith('fw_c.optim'),\n"
        "                   lambda o: ('wrapped', type(o).__module__))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_frontend_c", raising=False)
    monkeypatch.setitem(dispatch.FRONTEND_OF_FRAMEWORK, "fw_c", "fake_frontend_c")
    assert registry.DistributedOptimizer(fake_optimizer("fw_c.optim.sgd")) == (
        "wrapped", "fw_c.optim.sgd")
    assert registry.DistributedOptimizer(fake_optimizer("fw_c.optim.adam")) == (
        "wrapped", "fw_c.optim.adam")
    assert sys.modules["fake_frontend_c"].LOADS == 1
    with pytest.raises(TypeError):  # the frontend refuses it: a clear error
        registry.DistributedOptimizer(fake_optimizer("fw_c.data"))
    before = set(sys.modules)
    with pytest.raises(TypeError):  # other frameworks' objects load nothing
        registry.DistributedOptimizer(fake_optimizer("numpy"))
    assert set(sys.modules) == before


def test_torch_optimizer_without_importing_commlib_torch():
    """commlib.DistributedOptimizer(torch optimizer) works without importing
    commlib.torch first, as before frontends registered themselves; and
    commlib alone imports no frontend."""
    pytest.importorskip("torch")
    code = ("import sys, commlib, torch\n"
            "commlib.init()\n"
            "assert 'commlib.torch' not in sys.modules\n"
            "opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)\n"
            "d = commlib.DistributedOptimizer(opt)\n"
            "import commlib.torch\n"
            "assert isinstance(d, torch.optim.SGD) and hasattr(d, 'synchronize'), type(d)\n"
            "from commlib import dispatch\n"
            "assert dispatch.registered_frontends() == ['commlib.torch']\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
