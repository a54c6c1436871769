"""Two (or more) real hosts on one machine, for multi-host tests: each "host"
is a Linux network namespace joined to a bridge in the root namespace by a
veth pair, and every process launched there (netns_exec.py, through MPICH
hydra's ssh launcher) also gets its own host name, /etc/hosts, /dev/shm and
PID namespace. MPI and commlib see separate machines talking TCP over the
veth links, which a test can cut (``ip link set ... down``) and heal.

Needs root, ``ip`` (iproute2), ``unshare`` (util-linux) and MPICH's hydra
``mpiexec``; :func:`unavailable_reason` says what is missing (tests skip).

Every name starts with ``cln`` and six random hex digits, and a record of
them is kept under ``/run/commlib-netns/`` until teardown, so that a run that
was killed before its teardown is cleaned up by the next one (records whose
creating process is gone).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXEC_WRAPPER = HERE / "netns_exec.py"
RECORDS = Path("/run/commlib-netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why network-namespace hosts cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    from commlib.launch.mpi_discovery import MPICH, LauncherError, detect_flavour, find_mpiexec, mpiexec_version_text
    try:
        # (the launcher commlibrun picks for this interpreter's mpi4py, as the tests' jobs use)
        if detect_flavour(mpiexec_version_text(find_mpiexec(python=sys.executable))).name != MPICH:
            return "the multi-host tests launch through MPICH's hydra (HYDRA_LAUNCHER_EXEC)"
    except LauncherError as e:
        return f"no usable mpiexec: {e}"
    probe = "cln" + secrets.token_hex(3) + "t"
    try:
        if _ip("netns", "add", probe, check=False).returncode != 0:
            return "'ip netns add' is not permitted here"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILLs what runs in network namespace ns (only ever our launches)."""
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove(names: dict) -> None:
    for ns in names["hosts"]:
        _kill_namespace_processes(ns)
    for link in names["links"] + [names["bridge"]]:
        _ip("link", "del", link, check=False)  # (a veth's peer goes with it)
    for ns in names["hosts"]:
        _ip("netns", "del", ns, check=False)


def sweep_stale_records() -> None:
    """Removes what runs killed before their teardown left behind."""
    if not RECORDS.is_dir():
        return
    for rec in RECORDS.glob("cln*.json"):
        try:
            names = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(int(names.get("pid", 0))):
            _remove(names)
            rec.unlink(missing_ok=True)


def _free_subnet() -> str:
    """A 10.x.y.0/24 prefix ("10.x.y") no route of this machine uses."""
    routes = _ip("-4", "route", "show", "table", "all").stdout
    while True:
        prefix = f"10.{secrets.randbelow(150) + 100}.{secrets.randbelow(250) + 1}"
        if prefix + "." not in routes:
            return prefix


class NetnsHosts:
    """``n`` hosts named ``<prefix>h0``.. (also their namespaces' names) at
    ``10.x.y.2``.., joined by bridge ``<prefix>br`` (10.x.y.1, where mpiexec
    listens) over veth pairs ``<prefix>v<i>`` (root side) / ``<prefix>p<i>``."""

    def __init__(self, n: int, workdir: Path):
        self.prefix = "cln" + secrets.token_hex(3)
        self.hosts = [f"{self.prefix}h{i}" for i in range(n)]
        self.bridge = f"{self.prefix}br"
        self.links = [f"{self.prefix}v{i}" for i in range(n)]
        self.inner_links = [f"{self.prefix}p{i}" for i in range(n)]
        self.workdir = Path(workdir)
        self.record = RECORDS / f"{self.prefix}.json"

    def setup(self) -> "NetnsHosts":
        sweep_stale_records()
        RECORDS.mkdir(parents=True, exist_ok=True)
        self.record.write_text(json.dumps({"pid": os.getpid(), "hosts": self.hosts, "links": self.links,
                                           "bridge": self.bridge}))
        net = _free_subnet()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        lines = ["127.0.0.1 localhost", f"{net}.1 {self.prefix}root"]
        for i, (host, outer, inner) in enumerate(zip(self.hosts, self.links, self.inner_links)):
            _ip("netns", "add", host)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", host, "addr", "add", f"{net}.{i + 2}/24", "dev", inner)
            _ip("-n", host, "link", "set", inner, "up")
            _ip("-n", host, "link", "set", "lo", "up")
            lines.append(f"{net}.{i + 2} {host}")
        self.etc_hosts = self.workdir / "hosts"
        self.etc_hosts.write_text("\n".join(lines) + "\n")
        self.launcher_exec = self.workdir / "netns_ssh"
        self.launcher_exec.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{EXEC_WRAPPER}" "$@"\n')
        self.launcher_exec.chmod(0o755)
        return self

    def teardown(self) -> None:
        _remove({"hosts": self.hosts, "links": self.links, "bridge": self.bridge})
        self.record.unlink(missing_ok=True)

    def env(self) -> dict:
        """Environment for commlibrun/mpiexec: hydra starts its proxies through
        netns_exec.py and listens on the bridge; MPICH's UCX netmod talks TCP."""
        return {"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": str(self.launcher_exec),
                "HYDRA_IFACE": self.bridge, "NETNS_ETC_HOSTS": str(self.etc_hosts),
                "MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "self,tcp", "OMP_NUM_THREADS": "1"}

    def host_list(self, per_host: int) -> str:
        """The -H argument: every host with per_host slots."""
        return ",".join(f"{h}:{per_host}" for h in self.hosts)

    def set_link(self, i: int, up: bool) -> None:
        """Cuts (up=False) or heals host i's link to the bridge."""
        _ip("link", "set", self.links[i], "up" if up else "down")

    def set_rate(self, i: int, rate: str | None) -> None:
        """Limits host i's link to ``rate`` (tc's units: "200mbit") both ways,
        or lifts the limit (None). Needs ``tc`` (iproute2)."""
        for dev, ns in ((self.links[i], None), (self.inner_links[i], self.hosts[i])):
            where = ["-n", ns] if ns else []
            subprocess.run(["tc", *where, "qdisc", "del", "dev", dev, "root"], capture_output=True)
            if rate:
                subprocess.run(["tc", *where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                                "burst", "256kb", "latency", "10ms"], check=True, capture_output=True)

    def link_bytes(self, i: int) -> tuple[int, int]:
        """(bytes sent towards host i, bytes received from it) on its link."""
        stats = Path("/sys/class/net") / self.links[i] / "statistics"
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())

    def leftover_pids(self) -> list[int]:
        """Processes still running in any of the hosts' namespaces."""
        pids = []
        for ns in self.hosts:
            pids += [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        return pids

    def wait_no_leftovers(self, seconds: float) -> list[int]:
        """Waits up to `seconds` for the namespaces to empty; what is left."""
        deadline = time.monotonic() + seconds
        while (left := self.leftover_pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def main(argv: list[str] | None = None) -> int:
    """``python tests/parallel/netns_hosts.py [--hosts 2] [--per-host 1]
    [--rate 4gbit] -- PROGRAM ARGS...``: runs PROGRAM under ``commlibrun``
    on emulated hosts (one link each limited to --rate if given), then
    removes them. For benchmarks across hosts on one machine, e.g.
    ``-- python examples/pytorch_synthetic_benchmark.py --mode sync,staleness1``."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", type=int, default=1, help="ranks on each host")
    p.add_argument("--rate", default=None, help="limit every host's link (tc units: 4gbit, 200mbit)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    args = p.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        p.error("give the program to run after --")
    root = str(HERE.parent.parent)
    sys.path.insert(0, root)  # (commlib, for finding mpiexec, also when not installed)
    why = unavailable_reason()
    if why:
        p.error(f"cannot make network-namespace hosts here: {why}")
    with tempfile.TemporaryDirectory() as workdir:
        hosts = NetnsHosts(args.hosts, Path(workdir)).setup()
        try:
            for i in range(args.hosts if args.rate else 0):
                hosts.set_rate(i, args.rate)
            env = {**os.environ, **hosts.env(),
                   "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
            cmd = [sys.executable, "-m", "commlib.launch", "-np", str(args.hosts * args.per_host),
                   "-H", hosts.host_list(args.per_host), *program]
            return subprocess.run(cmd, env=env).returncode
        finally:
            hosts.teardown()


if __name__ == "__main__":
    sys.exit(main())
