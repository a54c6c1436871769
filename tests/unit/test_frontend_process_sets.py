"""commlib.frontend_utils' process-set helpers in one process (size 1, no
launcher; multi-rank behaviour is in tests/parallel/test_process_sets.py):
the core's classes re-exported, sets checked (type, registration,
membership) before anything is sent, sizes and names taken per set, and no
framework imported."""
import subprocess
import sys

import pytest

import commlib
from commlib import frontend_utils as fu

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def initialized():
    commlib.init()
    yield


def test_reexports_the_core_process_sets():
    assert fu.ProcessSet is commlib.ProcessSet
    assert fu.global_process_set is commlib.global_process_set
    assert fu.add_process_set is commlib.add_process_set
    assert fu.remove_process_set is commlib.remove_process_set
    assert not hasattr(fu, "GlobalProcessSet")


def test_check_process_set():
    assert fu.check_process_set(None) is commlib.global_process_set
    assert fu.check_process_set(commlib.global_process_set) is commlib.global_process_set
    with pytest.raises(TypeError, match="ProcessSet"):
        fu.check_process_set(object())
    with pytest.raises(TypeError):
        fu.check_process_set([0])
    for member in (True, False):
        with pytest.raises(ValueError, match="not registered"):
            fu.check_process_set(commlib.ProcessSet([0]), member=member)


def test_sizes_splits_and_roots_of_the_global_set():
    for ps in (None, commlib.global_process_set):
        assert fu.set_size(ps) == 1 and fu.set_rank(ps) == 0 and fu.included(ps)
        assert fu.even_splits(4, ps) == [4]
        assert fu.reducescatter_rows(5, ps) == 5
        assert fu.check_root(0, ps) == 0
        with pytest.raises(ValueError):
            fu.check_root(1, ps)
    assert fu.process_set_by_id(0) is commlib.global_process_set
    with pytest.raises(ValueError, match="no process set"):
        fu.process_set_by_id(12345)


def test_auto_names_count_per_kind_and_set():
    a = fu.auto_name("unit_kind")
    b = fu.auto_name("unit_kind", None, commlib.global_process_set)
    c = fu.auto_name("other_unit_kind")
    assert (a, b, c) == ("unit_kind.noname.0", "unit_kind.noname.1", "other_unit_kind.noname.0")
    assert fu.auto_name("unit_kind", "given") == "given"
    with pytest.raises(ValueError):
        fu.auto_name("unit_kind", "")
    with pytest.raises(ValueError, match="not registered"):
        fu.auto_name("unit_kind", None, commlib.ProcessSet([0]))
    assert fu.auto_name("unit_kind") == "unit_kind.noname.2"  # the refusal did not count


def test_init_rejects_process_sets_of_the_wrong_type():
    with pytest.raises(TypeError):
        fu.init(process_sets=[[0]])


def test_no_framework_imported():
    code = ("import sys, commlib.frontend_utils, commlib.objects\n"
            "assert not {'torch', 'tensorflow', 'keras'} & set(sys.modules), sys.modules.keys()\n")
    subprocess.run([sys.executable, "-c", code], check=True)
