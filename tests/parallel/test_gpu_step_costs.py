"""What a training step's CUDA collectives cost the process, counted by the
GPU emulator (tests/gpu_emulator/, commlib_gpu_emulator_count) while the
core's NCCL executor runs them (tests/parallel/workers/gpu_emulated_costs.py):

- the first step of an N-parameter model (DistributedOptimizer's in-place
  Average allreduces) creates one NCCL communicator, one stream and one
  fusion buffer whatever N, waits on no stream or event from the host, and
  allocates no pinned memory; events come from a pool, so the next two
  steps create few (not one per gradient and launch) and allocate nothing;
- a model's parameters broadcast together (broadcast_parameters) go out in a
  few fused NCCL broadcasts, not one per tensor (at 3 ranks also on a process
  set without rank 0, mixed dtypes, from its last rank); a lone broadcast repeated
  costs one NCCL call each and nothing else;
- gradients that arrive one by one during a backward pass go out in
  buckets of COMMLIB_GPU_BUCKET_BYTES, the full ones before anyone waits
  (few NCCL launches per step, as DDP's buckets), not one launch per gradient;
- the timeline shows the first step's phases (communicator creation,
  negotiation, execution on the device)."""
import json

import pytest

SMALL, LARGE = 10, 160
HELD = {"COMMLIB_BATCH_GAP_US": "100000", "COMMLIB_CYCLE_TIME": "200"}


def counts(run) -> dict:
    out = {}
    for line in run.stdout.splitlines():
        if "COUNTS " in line:  # ("[0]: COUNTS <phase> <json>", from rank 0)
            _, phase, values = line[line.index("COUNTS "):].split(" ", 2)
            out[phase] = json.loads(values)
    return out


def run_case(ranks, gpu_emulator, case, count, env=None, n=2):
    run = ranks(n, "gpu_emulated_costs.py", case, str(count), timeout=120, env=dict(gpu_emulator, **(env or {})))
    run.assert_ok(n)
    return counts(run)


@pytest.mark.timeout(300)
def test_first_step_costs_do_not_grow_with_the_parameters(ranks, gpu_emulator, tmp_path):
    trace = tmp_path / "trace.json"
    by_n = {SMALL: run_case(ranks, gpu_emulator, "step", SMALL, env={"COMMLIB_TIMELINE": str(trace)}),
            LARGE: run_case(ranks, gpu_emulator, "step", LARGE)}
    for n, c in by_n.items():
        first, later = c["step1"], c["later"]
        assert first["comm_init"] == 1, (n, first)
        assert first["stream_create"] == 1, (n, first)
        assert first["malloc"] <= 1 and first["free"] == 0, (n, first)  # (one fusion buffer, with headroom)
        assert first["sync"] == 0 and first["host_alloc"] == 0, (n, first)
        assert first["event_create"] <= n + first["allreduce"], (n, first)  # (at most the requests alive at once)
        for kind in ("comm_init", "stream_create", "malloc", "free", "host_alloc", "sync"):
            assert later[kind] == 0, (n, kind, later)
        # The pool holds what one step kept alive at once: all the steps
        # together never create more events than one step can have alive (its
        # requests and launches), however the load spreads them (without the
        # pool every request and launch made its own: 22 events for 2 steps
        # of 10 gradients, on top of the first step's).
        alive = n + max(first["allreduce"], later["allreduce"])
        assert first["event_create"] + later["event_create"] <= alive, (n, first, later)
    assert by_n[SMALL]["step1"]["malloc"] == by_n[LARGE]["step1"]["malloc"], by_n
    check_timeline(trace)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_parameters_broadcast_in_few_fused_calls(ranks, gpu_emulator, n):
    # (requests in flight together are held until the submissions stop, so a
    # loaded machine's slow Python between two submissions splits no batch)
    c = run_case(ranks, gpu_emulator, "broadcast", LARGE, n=n, env=HELD)
    for phase in ("parameters1", "parameters2"):
        assert c[phase]["broadcast"] <= LARGE // 8, (phase, c[phase])
        assert c[phase]["sync"] == 0 and c[phase]["free"] == 0, (phase, c[phase])
    # Events come from the pool: both rounds together create no more than one
    # round can have alive at once (its requests and launches), however the
    # load spreads them; without it every broadcast and launch made its own.
    alive = LARGE + max(c["parameters1"]["broadcast"], c["parameters2"]["broadcast"])
    assert c["parameters1"]["event_create"] + c["parameters2"]["event_create"] <= alive, c
    assert c["parameters2"]["malloc"] == 0, c["parameters2"]
    lone = c["broadcast10"]
    assert lone["broadcast"] == lone["nccl_call"] == 10, lone
    assert lone["malloc"] == lone["event_create"] == lone["sync"] == lone["comm_init"] == 0, lone


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_gradients_go_out_in_buckets(ranks, gpu_emulator, n):
    # 160 gradients (1.1 MB) 200 us apart, buckets of 256 KiB: 4 close during
    # the "backward pass", the rest goes when the step waits. (The hold's gap
    # and cap are the cycle time, 200 ms here: a bucket ends early only where
    # the load stops this Python for that long.)
    env = dict(gpu_emulator, COMMLIB_GPU_BUCKET_BYTES=str(256 << 10), COMMLIB_CYCLE_TIME="200")
    run = ranks(n, "gpu_emulated_costs.py", "backward", str(LARGE), timeout=120, env=env)
    run.assert_ok(n)
    lines = [line[line.index("BUCKETS "):].split()[1:] for line in run.stdout.splitlines() if "BUCKETS " in line]
    assert len(lines) == 2, run.stdout
    for step, full, before_wait, launches in (map(int, line) for line in lines):
        assert full == 4, (step, full)
        # (buckets that close while the background thread is slow can go
        # together: fewer launches; on a loaded machine a step from the
        # response cache may split some: 7 seen with two CPU hogs. The CPU
        # rule: one launch per few gradients, 11 or more.)
        assert 1 <= before_wait and launches <= 2 * full, (step, full, before_wait, launches)


def check_timeline(path):
    """Every rank's timeline shows the communicator's creation, and each
    gradient's negotiation and execution on the NCCL stream, in every step."""
    from commlib.timeline import load_events, rank_files

    files = rank_files(str(path))
    assert len(files) == 2, files
    for f in files:
        events = load_events(f)
        names = {e["name"] for e in events}
        assert "NCCL_INIT" in names, sorted(names)
        for phase in ("NEGOTIATE", "allreduce"):
            spans = [e for e in events if e["name"] == phase and e.get("ph") == "X"]
            assert len(spans) >= 3 * SMALL, (phase, len(spans))
        runs = [e for e in events if e["name"] == "allreduce"]
        assert all(e["args"]["algorithm"] == "nccl" for e in runs), runs[:2]
