"""commlib.torch.pipelining at 2 and 4 ranks (see workers/torch_pipeline.py):
GPipe, 1F1B and interleaved 1F1B (4 and 8 microbatches at 2 ranks, 4 at 4
ranks) train an 8-module MLP for 10 SGD steps on batches whose size changes
every step and end within 1e-5 relative of one process on the whole batches
(outputs and losses too); 1F1B's live activations stay within p - r; broken
schedules raise ScheduleError on every rank; a one-rank pipeline works."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,args", [(2, ()), (4, ("--quick",))])
def test_schedules_match_one_process(ranks, n, args):
    run = ranks(n, "torch_pipeline.py", *args, timeout=150)
    run.assert_ok(n)
    errors = re.findall(r"(Schedule\w+) p=\d m=(\d) \S+: max relative parameter error (\S+)",
                        run.stdout)
    names = {e[0] for e in errors}
    assert names == {"ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"}, run
    assert len(errors) == (6 if n == 2 else 3), run
    assert all(float(e[2]) <= 1e-5 for e in errors), run
