"""Several worker scripts, one after the other, in this one job: a framework
(torch, TensorFlow) starts once on each rank for all of them.

    in_one_job.py SCRIPT[:ARG,ARG...] ...

Each script runs as __main__ with its own sys.argv (commlib.init() again is
a no-op); after each one that returns, the line "rank R: SCRIPT[:ARGS] OK"
(RankRun.assert_script_ok), the script as given. A script that fails ends
the job (fail() exits), so the scripts after it do not run."""
import os
import runpy
import sys

import commlib

HERE = os.path.dirname(os.path.abspath(__file__))

for spec in sys.argv[1:]:
    script, _, args = spec.partition(":")
    sys.argv = [os.path.join(HERE, script)] + (args.split(",") if args else [])
    runpy.run_path(sys.argv[0], run_name="__main__")
    print(f"rank {commlib.rank()}: {spec} OK", flush=True)
