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
