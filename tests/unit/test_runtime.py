"""commlib.runtime: the one counter of generated collective names, restarted
by init() and shutdown() (one process, size 1, in a subprocess so that the
test's own init/shutdown leave other tests alone)."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_names_restart_when_the_job_starts_again():
    code = """
import numpy as np
import commlib
from commlib import ops, runtime
commlib.init()
commlib.allreduce(np.ones(2))                      # allreduce.noname.0
assert ops.auto_name("kind") == "kind.noname.0"
assert runtime.auto_name("allreduce") == "allreduce.noname.1"
commlib.init()                                     # already initialised: nothing restarts
assert ops.auto_name("kind") == "kind.noname.1"
commlib.shutdown()
assert runtime.auto_name("kind") == "kind.noname.0"
runtime.auto_name("kind")
commlib.init()                                     # a new job: every counter from 0
assert ops.auto_name("kind") == "kind.noname.0"
commlib.allreduce(np.ones(2))
assert runtime.auto_name("allreduce") == "allreduce.noname.1"
commlib.shutdown()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=100)


def test_generated_names_are_checked():
    from commlib import runtime

    assert runtime.auto_name("kind", "given") == "given"
    for bad in ("", 3):
        with pytest.raises(ValueError):
            runtime.auto_name("kind", bad)


def test_owned_names_are_kept_until_the_counters_restart():
    code = """
import copy, gc
import commlib
from commlib import ops, runtime

class Layer:
    pass

commlib.init()
a, b = Layer(), Layer()
assert ops.owned_name(a, "bn") == "bn.noname.0"
assert ops.owned_name(b, "bn") == "bn.noname.1"
assert ops.owned_name(a, "bn") == "bn.noname.0"      # kept: the same calls, the same name
assert ops.owned_name(a, "grad") == "grad.noname.0"  # one per kind
assert ops.auto_name("bn") == "bn.noname.2"          # kept names do not move the counter
assert ops.owned_name(copy.deepcopy(a), "bn") == "bn.noname.3"  # a copy draws its own
for bad in (3, "layer", (1, 2)):
    try:
        ops.owned_name(bad, "bn")
    except TypeError as e:
        assert "can be weakly referenced" in str(e), e
    else:
        raise AssertionError(f"owned_name({bad!r}) did not raise")
assert ops.auto_name("bn") == "bn.noname.4"          # a refused owner draws nothing
assert runtime.owned_name(a, "bn", 5) == "bn.noname.0" and ops.auto_name("bn") == "bn.noname.5"
# (on another set: that set's own counter, and a name of its own)
n = len(runtime._owned_names)
del b
gc.collect()
assert len(runtime._owned_names) == n - 1           # kept beside the owner, not keeping it
runtime.names_after_join()                          # a join: drawn again, in the new epoch
assert ops.owned_name(a, "bn") == "bn.noname.j1.0"
commlib.shutdown()
commlib.init()                                      # a new job: drawn again from 0
assert ops.owned_name(a, "grad") == "grad.noname.0"
assert ops.owned_name(a, "bn") == "bn.noname.0"
commlib.shutdown()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=100)
