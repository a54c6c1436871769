"""commlib.bench's timing loop: aligned mode lines the ranks up (a barrier,
outside the timed span) before every call; the default only once."""
from commlib.bench.timing import time_calls


class Comm:
    def __init__(self, log):
        self.log = log

    def Barrier(self):
        self.log.append("barrier")


def test_aligned_calls_barrier_before_each_call_untimed():
    log = []
    times = time_calls(lambda: log.append("call"), 3, Comm(log), aligned=True)
    assert log == ["barrier"] + ["barrier", "call"] * 3
    assert len(times) == 3 and all(t >= 0 for t in times)


def test_default_lines_up_once():
    log = []
    time_calls(lambda: log.append("call"), 3, Comm(log))
    assert log == ["barrier", "call", "call", "call"]
