"""Counting a training step's allreduced bytes in the core's timeline, for
torch_powersgd_bytes.py and tf_powersgd_bytes.py."""
import commlib
from commlib.timeline import load_events, rank_file
from _common import fail


def step_bytes(stem, rank, steps, what):
    """Runs ``steps()`` (an iterator over training steps) with the timeline
    on for the last one; returns this rank's allreduced bytes in it."""
    todo = list(steps)
    for step in todo[:-1]:
        step()
    commlib.start_timeline(f"{stem}.json")
    todo[-1]()
    commlib.stop_timeline()
    events = [e for e in load_events(rank_file(f"{stem}.json", rank)) if e.get("ph") == "X" and e["name"] == "allreduce"]
    if not events:
        fail(f"{what}: no allreduce in the timeline")
    return sum(e["args"]["bytes"] for e in events)


def report(rank, what, params, sync, psgd):
    """Prints the bytes of both and fails below 20x fewer for PowerSGD."""
    ratio = sync / psgd
    print(f"rank {rank}: {what}: parameters {params}, bytes per step: sync {sync}, powersgd "
          f"rank 2 {psgd}, ratio {ratio:.1f}", flush=True)
    if sync < 4 * params:
        fail(f"{what}: sync step allreduced {sync} bytes, fewer than the {4 * params} of the "
             "gradients")
    if ratio < 20:
        fail(f"{what}: PowerSGD rank 2 sends only {ratio:.1f}x fewer bytes than sync")
