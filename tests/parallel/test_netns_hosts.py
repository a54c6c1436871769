"""Multi-host runs for real: two hosts made of Linux network namespaces joined
by a bridge (tests/parallel/netns_hosts.py), 2 ranks each, launched by
MPICH's hydra over its ssh launcher (netns_exec.py stands in for ssh), MPI
talking TCP (UCX) over the veth links. Covers the hierarchical allreduce,
the response cache across hosts, a cut link (every rank fails within
COMMLIB_TIMEOUT + 10 s with a CommlibError naming the unreachable ranks; the
job ends non-zero with nothing left behind) and a short cut that heals.
Skipped where network namespaces cannot be made (not root, no iproute2,
not MPICH, or `ip netns add` refused)."""
import re
import shutil
import time

import pytest
from netns_hosts import NetnsHosts, unavailable_reason

_WHY = unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"multi-host tests need network namespaces: {_WHY}")

TIMEOUT = 5  # COMMLIB_TIMEOUT for the cut tests (seconds)
RAISED = re.compile(r"rank (\d): RAISED (\w+) at ([\d.]+) after \d+ steps: (.*)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    h = NetnsHosts(2, tmp_path_factory.mktemp("netns"))
    try:
        yield h.setup()
    finally:
        h.teardown()


def run_on_hosts(ranks, hosts, script, *args, timeout=60, env=None):
    return ranks(4, script, *args, timeout=timeout, env={**hosts.env(), **(env or {})},
                 launcher_args=("-H", hosts.host_list(2)))


def wait_for(path, seconds):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_hierarchical_allreduce_across_hosts(ranks, hosts):
    sent0, _ = hosts.link_bytes(0)
    run = run_on_hosts(ranks, hosts, "netns_hier.py", *hosts.hosts)
    run.assert_ok(4)
    assert "link bytes / (K*N)" in run.stdout, run
    # (and MPI's traffic did cross the links: 4 x 8 MiB at least)
    assert hosts.link_bytes(0)[0] - sent0 > 4 * (8 << 20), run


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("tc") is None, reason="limiting a link's rate needs tc (iproute2)")
def test_async_transfer_leaves_the_cores(ranks, hosts):
    """An allreduce over a 200 Mbit/s link (one rank per host), first polled
    (nobody waits: the background thread runs it), then waited for (the
    waiting thread runs it): the threads nap between MPI progress calls
    after their spin budgets, so the rank's process uses a fraction of a
    core while the transfer crawls (yielding through it, as before, took a
    whole core: CPU/wall 0.9-1.0)."""
    hosts.set_rate(1, "200mbit")
    try:
        run = ranks(2, "netns_async_idle.py", timeout=60, env=hosts.env(),
                    launcher_args=("-H", hosts.host_list(1)))
    finally:
        hosts.set_rate(1, None)
    run.assert_ok(2)
    found = re.findall(r"rank (\d): \w+ transfer (\d): wall ([\d.]+) s, cpu ([\d.]+) s",
                       run.stdout)
    assert len(found) == 8, run
    for rank, rep, wall, cpu in found:
        assert float(wall) > 0.3, f"rank {rank} transfer {rep} took {wall} s: the link was not slow\n{run}"
        assert float(cpu) < 0.5 * float(wall), f"rank {rank} transfer {rep}: {cpu} s CPU in {wall} s\n{run}"


@pytest.mark.timeout(120)
def test_response_cache_across_hosts(ranks, hosts):
    run_on_hosts(ranks, hosts, "netns_cache.py").assert_ok(4)


@pytest.mark.timeout(150)
def test_short_cut_heals(ranks, hosts, tmp_path):
    import threading

    def cut_briefly():
        wait_for(tmp_path / "ready", 60)
        hosts.set_link(1, up=False)
        time.sleep(1.5)
        hosts.set_link(1, up=True)
        time.sleep(1.5)
        (tmp_path / "stop").write_text("")

    cutter = threading.Thread(target=cut_briefly, daemon=True)
    cutter.start()
    try:
        run = run_on_hosts(ranks, hosts, "netns_cut.py", "heal", str(tmp_path), "1000",
                           env={"COMMLIB_TIMEOUT": str(TIMEOUT)})
    finally:
        cutter.join(10)
        hosts.set_link(1, up=True)
    run.assert_ok(4)
    longest = [float(x) for x in re.findall(r"the longest took ([\d.]+) s", run.stdout)]
    assert len(longest) == 4 and min(longest) >= 1.0, run  # the cut did hold every rank up


@pytest.mark.timeout(150)
@pytest.mark.parametrize("count", [1000, 1 << 20], ids=["8KB", "8MB"])
def test_cut_link_fails_every_rank_in_time(ranks, hosts, tmp_path, count):
    import threading

    cut_at = []

    def cut():
        wait_for(tmp_path / "ready", 60)
        cut_at.append(time.time())
        hosts.set_link(1, up=False)

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        run = run_on_hosts(ranks, hosts, "netns_cut.py", "cut", str(tmp_path), str(count), timeout=90,
                           env={"COMMLIB_TIMEOUT": str(TIMEOUT)})
        ended = time.time()
        cutter.join(10)
        left = hosts.wait_no_leftovers(2)
    finally:
        hosts.set_link(1, up=True)
    assert cut_at, run
    assert run.returncode not in (0, 124), run  # failed, and not by commlibrun's --timeout
    # commlibrun names the failed rank(s): from their statuses, or from their notes of the abort
    assert re.search(r"commlibrun: job failed: ranks? \d", run.stderr), run
    assert not left, f"processes left in the namespaces: {left}\n{run}"
    lines = [(tmp_path / f"raised{r}").read_text() if (tmp_path / f"raised{r}").exists() else "" for r in range(4)]
    for r, line in enumerate(lines):
        m = RAISED.match(line)
        assert m, f"rank {r} raised nothing\n{run}"
        _, kind, at, msg = m.groups()
        assert kind == "CollectiveTimeoutError", line
        assert float(at) - cut_at[0] <= TIMEOUT + 10, f"{line}: {float(at) - cut_at[0]:.1f} s after the cut"
    # Each host's ranks name ranks beyond the cut (rank 0 alone, for a worker whose
    # coordinator went silent). In the hierarchical allreduce, a rank may instead time
    # out waiting for its host's peer, which is stuck in the step across hosts: that
    # peer names the far ranks.
    for host, far in (((0, 1), {2, 3}), ((2, 3), {0, 1})):
        named_by = {}
        for r in host:
            msg = RAISED.match(lines[r]).group(4)
            named = {int(x) for lst in re.findall(r"ranks? \[([\d, ]+)\]", msg) for x in lst.split(",")}
            named |= {int(x) for x in re.findall(r"rank (\d) \(the coordinator\)", msg)}
            named_by[r] = named & far
            assert named_by[r] or "the other ranks of this host" in msg, lines[r]
        assert any(named_by.values()), f"no rank of host {host} named a rank beyond the cut: {lines}"
    # rank 0 waits up to COMMLIB_TIMEOUT + 10 s for silent ranks before aborting
    assert ended - cut_at[0] <= 2 * TIMEOUT + 30, f"the job ended {ended - cut_at[0]:.1f} s after the cut\n{run}"


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("tc") is None, reason="limiting a link's rate needs tc (iproute2)")
def test_command_line_runs_a_program_on_emulated_hosts():
    """``python tests/parallel/netns_hosts.py --rate R -- PROGRAM``: the
    program's ranks see one host each, and the hosts are gone afterwards."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "netns_hosts.py"
    code = ("import socket, commlib; commlib.init(); "
            "print('rank', commlib.rank(), 'of', commlib.size(), 'cross', commlib.cross_size(), "
            "'local', commlib.local_size(), 'host', socket.gethostname(), flush=True)")
    run = subprocess.run([sys.executable, str(script), "--rate", "100mbit", "--", sys.executable,
                          "-c", code], capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run
    lines = re.findall(r"rank (\d) of 2 cross 2 local 1 host (cln\w+h\d)", run.stdout)
    assert sorted(r for r, _ in lines) == ["0", "1"], run
    assert len({h for _, h in lines}) == 2, run
    leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h in leftover for _, h in lines), leftover
