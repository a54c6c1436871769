"""Pipeline schedules as data (commlib.pipeline), without MPI: every built
schedule passes the checker; 1F1B keeps at most p-r activations live on rank
r while GPipe keeps all m; and each broken schedule (unmatched send or
receive, a cycle, an action before its data, a missing or repeated compute)
raises ScheduleError naming the rank, the action and the microbatch."""
import pytest

from commlib.pipeline.actions import Action
from commlib.pipeline.checker import ScheduleError, check
from commlib.pipeline.schedules import build


def live_peak(actions):
    live = peak = 0
    for a in actions:
        live += (a.kind == "F") - (a.kind == "B")
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("name,v", [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2),
                                    ("Interleaved1F1B", 3)])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [4, 8, 12])
def test_built_schedules_pass_the_checker(name, v, p, m):
    if name == "Interleaved1F1B" and m % p:
        pytest.skip("interleaving needs m to be a multiple of p")
    lists = build(name, p, v, m)
    check(lists, p * v, m)
    for r, actions in enumerate(lists):
        assert sum(a.kind == "F" for a in actions) == m * v
        if name == "1F1B":
            assert live_peak(actions) == min(p - r, m)
        if name == "GPipe":
            assert live_peak(actions) == m


def test_unmatched_send_names_rank_action_microbatch():
    lists = build("1F1B", 2, 1, 4)
    lists[1].remove(Action("RECV_F", 1, 2))
    with pytest.raises(ScheduleError, match=r"rank 0: SEND_F\(stage 0, microbatch 2\) to rank 1 "
                                            r"has no matching receive"):
        check(lists, 2, 4)


def test_receive_without_send():
    lists = build("GPipe", 2, 1, 4)
    lists[1].remove(Action("SEND_B", 1, 3))
    with pytest.raises(ScheduleError, match=r"rank 0: RECV_B\(stage 0, microbatch 3\) from rank 1 "
                                            r"has no matching send"):
        check(lists, 2, 4)


def test_cycle_is_a_deadlock_naming_every_blocked_rank():
    lists = build("1F1B", 2, 1, 4)
    r0 = lists[0]
    # rank 0 waits for microbatch 0's gradient before sending its activation
    r0.remove(Action("RECV_B", 0, 0))
    r0.insert(r0.index(Action("SEND_F", 0, 0)), Action("RECV_B", 0, 0))
    with pytest.raises(ScheduleError) as e:
        check(lists, 2, 4)
    msg = str(e.value)
    assert "deadlock" in msg
    assert "rank 0 waits in RECV_B(stage 0, microbatch 0) for rank 1" in msg
    assert "rank 1 waits in RECV_F(stage 1, microbatch 0) for rank 0" in msg


def test_action_before_its_data():
    lists = build("GPipe", 2, 1, 2)
    r1 = lists[1]
    r1.remove(Action("B", 1, 1))
    r1.insert(0, Action("B", 1, 1))
    with pytest.raises(ScheduleError, match=r"rank 1: B\(stage 1, microbatch 1\) needs F\(stage 1, microbatch 1\)"):
        check(lists, 2, 2)


def test_missing_and_repeated_compute():
    lists = build("GPipe", 2, 1, 3)
    lists[0].remove(Action("B", 0, 2))
    with pytest.raises(ScheduleError, match=r"rank 0: B\(stage 0, microbatch 2\) is missing"):
        check(lists, 2, 3)
    lists = build("GPipe", 2, 1, 3)
    lists[1].append(Action("F", 1, 0))
    with pytest.raises(ScheduleError, match=r"rank 1: F\(stage 1, microbatch 0\) appears 2 times"):
        check(lists, 2, 3)
    lists = build("GPipe", 2, 1, 3)
    lists[1].append(Action("F", 0, 0))
    with pytest.raises(ScheduleError, match=r"rank 1: F\(stage 0, microbatch 0\) names a stage"):
        check(lists, 2, 3)


def test_unsupported_pipeline_shapes():
    with pytest.raises(ValueError, match="multiple of the number of pipeline ranks"):
        build("Interleaved1F1B", 4, 2, 6)
    with pytest.raises(ValueError, match="one stage per rank"):
        build("1F1B", 2, 2, 4)
    with pytest.raises(ValueError, match="unknown schedule"):
        build("ZeroBubble", 2, 1, 4)
    with pytest.raises(ValueError, match="at least 1"):
        build("GPipe", 2, 1, 0)
