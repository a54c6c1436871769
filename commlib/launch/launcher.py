"""``commlibrun``: launch a commlib job through the installed MPI.

Example::

    commlibrun -np 4 -H host1:2,host2:2 python train.py --epochs 10

builds and runs (for MPICH hydra)::

    mpiexec -n 4 -hosts host1:2,host2:2 -genv COMMLIB_X value ... \\
        <python> -I .../commlib/launch/_rankwrap.py -- python train.py --epochs 10

Every rank runs through :mod:`commlib.launch._rankwrap`, which prefixes output lines
with the rank and records each rank's exit status, so that ``commlibrun`` can
exit with the code of the rank that failed first and name it. The wrappers of
ranks on the launcher's host send their lines to ``commlibrun`` over a Unix
socket (:class:`OutputRelay`), so that lines stay whole whatever the MPI
launcher does with output.

Only the standard library is imported here: the launcher must work (and
``--check-build`` must be able to report problems) without numpy or the
compiled core.
"""

import argparse
import functools
import math
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .. import failure_notes
from . import _rankwrap, horovod_flags
from .job_cleanup import JOB_ENV, JobReaper
from .launch_checks import MAX_RANKS, MAX_SLOTS, check_hostfile, check_hosts, check_np  # noqa: F401
from .restarts import ELASTIC_DIR_ENV, RESTART_ENV, Attempt, run_with_restarts
from .mpi_discovery import (MPI4PY_LIBRARY_PROBE, MPICH, MPIEXEC_ENV,  # noqa: F401 - re-exported
                            OPENMPI, LauncherError, MPIFlavour, detect_flavour, find_mpiexec,
                            library_flavour, mpi4py_library_flavour, mpiexec_candidates,
                            mpiexec_version_text)

ENV_PREFIX = "COMMLIB_"
STATUS_DIR_ENV = _rankwrap.STATUS_DIR_ENV
OUTPUT_SOCKET_ENV = _rankwrap.OUTPUT_SOCKET_ENV
# Seconds to wait, after mpiexec exited, for the wrappers' output connections to close.
OUTPUT_DRAIN_SECONDS = 5.0
# Exit code for --timeout, as used by coreutils' timeout(1).
TIMEOUT_EXIT_CODE = 124
# Seconds the ranks get to write their Python stacks when the --timeout expires.
STACK_DUMP_SECONDS = 2.0
# Seconds between forwarding SIGTERM/SIGINT to the job and SIGKILLing it.
KILL_GRACE_SECONDS = 5.0
# Seconds after a failed rank's grace period before commlibrun ends a job that
# mpiexec has not ended (see _Job).
FAILURE_TEARDOWN_SLACK = 10.0
# Interval at which the supervision loop re-checks deadlines.
_POLL_SECONDS = 0.2


def parse_env_assignments(items, environ=os.environ):
    """Turn ``-x`` arguments (``NAME=VALUE`` or ``NAME``) into a dict.

    A bare ``NAME`` forwards the variable's current value.
    """
    result = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LauncherError(f"invalid environment variable name in -x {item!r}")
        if not sep:
            if name not in environ:
                raise LauncherError(f"-x {name}: variable is not set")
            value = environ[name]
        result[name] = value
    return result


def forwarded_env(environ, extra=None):
    """Variables to forward to every rank: all ``COMMLIB_*`` and
    ``HOROVOD_*`` (read as COMMLIB_*: commlib.horovod_env) plus ``extra``."""
    env = {k: v for k, v in environ.items() if k.startswith((ENV_PREFIX, "HOROVOD_"))}
    env.update(extra or {})
    return dict(sorted(env.items()))


def default_thread_env(environ, np, hosts=None, hostfile=None, cpus=None):
    """OMP_NUM_THREADS for ranks that share this host, unless the user set it.

    Like torchrun: N ranks of one host each running a thread pool as wide as
    the machine (OpenBLAS, OpenMP, MKL all read OMP_NUM_THREADS) oversubscribe
    it; on 2 cores the numpy demo ran 10x slower. Only single-host jobs (no
    -H/--hostfile) get a default: cores // ranks, at least 1.
    """
    if "OMP_NUM_THREADS" in environ or hosts or hostfile:
        return {}
    cpus = cpus or len(os.sched_getaffinity(0))
    return {"OMP_NUM_THREADS": str(max(1, cpus // max(1, np)))}


def flavour_env(flavour, environ):
    """Settings an MPI needs for commlib's results to be right, unless the user
    chose otherwise. Open MPI's AVX reduction component saturates small
    integer sums (int8/uint8/int16: 100 + 100 gives 127, not -56) where C and
    every other MPI wrap around (open-mpi/ompi#8045, not to be fixed):
    ``OMPI_MCA_op=^avx`` leaves reductions to its plain C component."""
    if flavour.name == OPENMPI and "OMPI_MCA_op" not in environ:
        return {"OMPI_MCA_op": "^avx"}
    return {}


def rank_wrapper_command(python=sys.executable):
    """Command prefix that runs :mod:`commlib.launch._rankwrap` for each rank.

    The wrapper is run by path in isolated mode (``-I``), so it does not
    import the ``commlib`` package and cannot be shadowed by the user's
    ``PYTHONPATH`` or working directory; it needs only the standard library,
    so it skips ``site`` (``-S``: no ``.pth`` files run at each rank's start).
    """
    return [python, "-I", "-S", os.path.abspath(_rankwrap.__file__), "--"]


def resolve_program(command, environ=os.environ):
    """``command`` with its program found as the caller's shell would find it:
    a name without a slash is looked up on the caller's ``PATH`` and replaced
    by its absolute path (symlinks kept: a virtualenv's ``python3`` is a link
    whose own path selects the environment). A program not found, or given
    with a slash, is left as it is.

    The ranks must not look the name up on their own ``PATH``: Open MPI's
    mpirun, started by its absolute path, acts as if ``--prefix`` were given
    and puts its own ``bin/`` first there, so ``commlibrun -np 2 python3 x.py``
    inside a virtualenv ran ``/usr/bin/python3``.
    """
    command = list(command)
    if not command or not command[0] or "/" in command[0]:
        return command
    found = shutil.which(command[0], path=environ.get("PATH", os.defpath))
    if found is None:
        return command
    return [os.path.abspath(found)] + command[1:]


# Open MPI options that bind ranks (or place them on given CPUs) themselves
_OPENMPI_BINDING = tuple(dash + o for o in ("bind-to", "bind-to-core", "bind-to-socket", "cpu-set",
                                            "cpus-per-proc", "cpus-per-rank", "rankfile")
                         for dash in ("-", "--")) + ("-rf",)


def _has_option(args, names):
    return any(a in names or a.startswith(tuple(n + "=" for n in names)) for a in args)


def _option_values(args, names):
    """The values given to the options ``names`` in ``args`` (``--opt V`` or ``--opt=V``)."""
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            yield args[i + 1]
        elif a.startswith(tuple(n + "=" for n in names)):
            yield a.split("=", 1)[1]


def build_command(flavour, np, command, *, env=None, hosts=None, hostfile=None, mpi_args=(),
                  euid=None, mpiexec="mpiexec", wrapper=None):
    """Build the mpiexec argument list (no shell involved).

    ``env`` maps names to values to forward to all ranks (for Open MPI the
    values must also be in mpiexec's own environment, since ``-x NAME``
    forwards by name).  ``euid`` defaults to ``os.geteuid()``; Open MPI
    refuses to run as root without ``--allow-run-as-root``.  ``wrapper``
    defaults to :func:`rank_wrapper_command`.
    """
    check_np(np)
    if hosts and hostfile:
        raise LauncherError("use either -H or --hostfile, not both")
    if hosts is not None:
        check_hosts(hosts)
    if hostfile is not None:
        check_hostfile(hostfile)
    if not command:
        raise LauncherError("no command given")
    env = env or {}
    euid = os.geteuid() if euid is None else euid
    wrapper = rank_wrapper_command() if wrapper is None else wrapper
    cmd = [mpiexec]
    if flavour.name == MPICH:
        cmd += ["-n", str(np)]
        if hosts:
            cmd += ["-hosts", hosts]
        if hostfile:
            cmd += ["-f", hostfile]
        for name, value in env.items():
            cmd += ["-genv", name, value]
    else:
        cmd += ["-np", str(np)]
        if hosts:
            cmd += ["--host", hosts]
        if hostfile:
            cmd += ["--hostfile", hostfile]
        if euid == 0:
            cmd.append("--allow-run-as-root")
        # Allow more ranks than cores/slots, as MPICH does.  Open MPI 5 takes
        # this as a --map-by modifier, which would clash with a user's own
        # --map-by (who can then add ":OVERSUBSCRIBE" there).
        if flavour.major >= 5:
            if not _has_option(mpi_args, ("--map-by", "-map-by")):
                cmd += ["--map-by", ":OVERSUBSCRIBE"]
        else:
            cmd.append("--oversubscribe")
        # Open MPI binds each rank to one core when there are at most 2
        # (to a socket above): a rank's training thread, its engine's thread
        # and its framework's threads then share that core (MPICH binds
        # nothing; commlibrun --bind-cores pins ranks to blocks of CPUs
        # itself). Unless the user binds in their own way.
        pe = any(":PE=" in v.upper() for v in _option_values(mpi_args, ("--map-by", "-map-by")))
        if not _has_option(mpi_args, _OPENMPI_BINDING) and not pe:
            cmd += ["--bind-to", "none"]
        for name in env:
            cmd += ["-x", name]
    cmd += list(mpi_args)
    return cmd + list(wrapper) + list(command)


def read_statuses(status_dir):
    """Read the wrappers' status files: ``{rank: (exit_code, time)}``."""
    statuses = {}
    for rank, text in failure_notes.rank_files(status_dir):
        try:
            code, stamp = text.split()
            statuses[rank] = (int(code), float(stamp))
        except ValueError:
            continue
    return statuses


def first_failure(statuses, consequences=frozenset()):
    """``(rank, code)`` of the earliest failed rank in ``statuses``, or None;
    ranks in ``consequences`` (their failure followed another rank's:
    commlib.failure_notes) only when no other rank failed."""
    failed = [(rank in consequences, stamp, rank, code)
              for rank, (code, stamp) in statuses.items() if code != 0]
    if not failed:
        return None
    _, _, rank, code = min(failed)
    return rank, code


def describe_exit(code):
    """Human-readable form of a shell-style exit code."""
    if code > 128:
        try:
            return f"was killed by signal {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


class _Job:
    """Runs mpiexec in its own process group and supervises it.

    SIGINT/SIGTERM received by the launcher, and ``timeout`` expiry, send
    SIGINT to mpiexec's process group (hydra passes it on to the ranks, and an
    interrupted MPICH rank removes its shared-memory segments, which a
    SIGTERMed one leaves). Every process of the job on this host (found by
    its token, commlib.launch.job_cleanup: hydra's proxies and the ranks run in
    sessions of their own) is SIGKILLed if the job has not ended
    ``KILL_GRACE_SECONDS`` later, and when mpiexec has exited; then the
    segments the job left in /dev/shm are removed.

    A rank that failed (its wrapper's status file in ``status_dir`` has a
    non-zero code) normally makes mpiexec end the job once that wrapper exits,
    after its failure grace.  mpiexec does not always do so (MPICH hydra once
    left the other ranks waiting on the dead one): if the job is still running
    ``grace + FAILURE_TEARDOWN_SLACK`` seconds after the first failure, it is
    stopped here.
    """

    def __init__(self, timeout, status_dir=None, grace=_rankwrap.DEFAULT_FAILURE_GRACE, reaper=None):
        self.timeout = timeout
        self.reaper = reaper or JobReaper()
        self.signal_received = None
        self.timed_out = False
        self.torn_down = False
        self._proc = None
        self._kill_at = None
        self._stop_at = None  # (the timeout's stop, once the ranks' stacks are out)
        self._status_dir = status_dir
        self._grace = grace

    def _signal_group(self, signum):
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signum)
        except ProcessLookupError:
            pass

    def _stop(self, signum):
        self._signal_group(signal.SIGINT if signum == signal.SIGTERM else signum)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + KILL_GRACE_SECONDS

    def _on_signal(self, signum, frame):
        self.signal_received = signum
        self._stop(signum)

    def run(self, cmd, env):
        """Run ``cmd`` to completion and return mpiexec's ``returncode``."""
        # Handlers first, so that a signal arriving while mpiexec starts is
        # not lost (it is forwarded right after the start).
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # A new session so that killpg() reaches mpiexec, its proxies and
            # the ranks, but not the launcher.
            self._proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            if self.signal_received is not None:
                self._stop(self.signal_received)
            return self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            # Processes that outlived mpiexec (e.g. after it was killed, or
            # an orphaned proxy) must not outlive the job, nor its segments.
            self._signal_group(signal.SIGKILL)
            self.reaper.kill_all()
            self.reaper.remove_segments(self._status_dir)

    def _wait(self):
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                return self._proc.wait(timeout=_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            self.reaper.note_segments(now)
            if deadline is not None and now >= deadline and not self.timed_out:
                self.timed_out = True
                # Where is it stuck? The ranks' Python stacks first (commlib.stack_dumps).
                dumped = self.reaper.request_stacks(self._status_dir) if self._status_dir else []
                first = (f" after the Python stacks of its {len(dumped)} rank process(es) on this host, "
                         "which follow" if dumped else "")
                print(f"commlibrun: timeout: job still running after {self.timeout:g} s, killing it{first}",
                      file=sys.stderr, flush=True)
                self._stop_at = now + (STACK_DUMP_SECONDS if dumped else 0)
            if self._stop_at is not None and now >= self._stop_at:
                self._stop_at = None
                self._stop(signal.SIGTERM)
            if self._kill_at is None and self._failure_outlived():
                self.torn_down = True
                print("commlibrun: a rank failed and mpiexec did not end the job; stopping it",
                      file=sys.stderr, flush=True)
                self._stop(signal.SIGTERM)
            if self._kill_at is not None and now >= self._kill_at:
                self._signal_group(signal.SIGKILL)
                self.reaper.kill_all()


    def _failure_outlived(self):
        """Whether the first failed rank's grace period is long over."""
        if self._status_dir is None:
            return False
        failed = [stamp for code, stamp in read_statuses(self._status_dir).values() if code != 0]
        return bool(failed) and time.time() >= min(failed) + self._grace + FAILURE_TEARDOWN_SLACK


class _LineWriter:
    """One wrapper connection: its stream tag, then prefixed lines."""

    def __init__(self, streams):
        self._streams = streams
        self._dst = None
        self._buf = b""

    def feed(self, data):
        self._buf += data
        if self._dst is None:
            if not self._buf:
                return
            tag, self._buf = self._buf[:1], self._buf[1:]
            self._dst = self._streams.get(tag, self._streams[_rankwrap.STDERR_TAG])
        cut = self._buf.rfind(b"\n") + 1
        if cut:
            self._write(self._buf[:cut])
            self._buf = self._buf[cut:]

    def finish(self):
        if self._dst is not None and self._buf:
            self._write(self._buf + b"\n")
        self._buf = b""

    def _write(self, data):
        try:
            self._dst.write(data)
            self._dst.flush()
        except (OSError, ValueError):  # closed or broken stdout/stderr: drop the output
            pass


class OutputRelay:
    """Prints the lines that the wrappers of ranks on this host send to a Unix socket.

    Whole lines, each rank's in order: Open MPI's mpirun forwards a rank's
    output in reads of at most 4 KiB, which can end inside a line, and then
    writes another rank's output after that piece. Wrappers that cannot reach
    the socket (other hosts) keep writing through mpiexec.
    """

    def __init__(self, path, stdout=None, stderr=None):
        self.path = path
        stdout = stdout or getattr(sys.stdout, "buffer", None)
        stderr = stderr or getattr(sys.stderr, "buffer", None)
        if stdout is None or stderr is None:
            raise OSError("stdout or stderr has no binary buffer")
        self._streams = {_rankwrap.STDOUT_TAG: stdout, _rankwrap.STDERR_TAG: stderr}
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)  # OSError, e.g. a path too long for AF_UNIX
            self._listener.listen(128)
            self._listener.setblocking(False)
            self._wake_r, self._wake_w = os.pipe()
        except OSError:
            self._listener.close()
            raise
        self._deadline = None
        self._thread = threading.Thread(target=self._loop, name="commlibrun-output", daemon=True)
        self._thread.start()

    def _loop(self):
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        writers = {}
        try:
            while True:
                timeout = None
                if self._deadline is not None:
                    timeout = self._deadline - time.monotonic()
                    if not writers or timeout <= 0:
                        break
                for key, _ in sel.select(timeout):
                    if key.fileobj is self._listener:
                        try:
                            conn, _ = self._listener.accept()
                        except OSError:
                            continue
                        conn.setblocking(False)
                        writers[conn] = _LineWriter(self._streams)
                        sel.register(conn, selectors.EVENT_READ)
                    elif key.fileobj == self._wake_r:
                        os.read(self._wake_r, 64)
                    else:
                        conn = key.fileobj
                        try:
                            data = conn.recv(1 << 16)
                        except BlockingIOError:
                            continue
                        except OSError:
                            data = b""
                        if data:
                            writers[conn].feed(data)
                        else:
                            writers.pop(conn).finish()
                            sel.unregister(conn)
                            conn.close()
        finally:
            for conn, writer in writers.items():
                writer.finish()
                conn.close()
            sel.close()

    def close(self, timeout=OUTPUT_DRAIN_SECONDS):
        """Print what is still coming (connections open for up to ``timeout`` s), then stop."""
        if self._deadline is not None:
            return
        self._deadline = time.monotonic() + timeout
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def job_exit_code(returncode, statuses):
    """Exit code for the launcher and an optional stderr summary line.

    The rank that failed first decides; without status files (e.g. ranks on
    other hosts) mpiexec's own exit status is used.
    """
    code, cause = failure_cause(returncode, statuses)
    return code, (f"commlibrun: job failed: {cause}" if cause else None)


def failure_cause(returncode, statuses, consequences=frozenset(), aborted=()):
    """``(exit code, cause)`` of a finished job; the cause (None on success)
    names the rank that failed first (see first_failure), else the ranks that
    aborted MPI (``aborted``: commlib.failure_notes; the abort ends the job
    before the wrappers record a status), or mpiexec's own status."""
    failure = first_failure(statuses, consequences)
    if failure:
        rank, code = failure
        return code, f"rank {rank} {describe_exit(code)} (first failure)"
    if aborted and returncode != 0:
        ranks = ", ".join(map(str, aborted))
        return (128 - returncode if returncode < 0 else returncode,
                f"rank{'s' if len(aborted) > 1 else ''} {ranks} lost contact with other ranks and "
                f"aborted MPI (their errors are above); mpiexec exited with status {returncode}")
    if returncode < 0:
        sig = signal.Signals(-returncode).name
        return 128 - returncode, f"mpiexec was killed by signal {sig}"
    if returncode > 0:
        return returncode, f"mpiexec exited with code {returncode}"
    return 0, None


def make_parser():
    p = argparse.ArgumentParser(
        prog="commlibrun",
        allow_abbrev=False,
        description="Launch a commlib job with mpiexec (MPICH hydra or Open MPI). "
                    "Each output line is prefixed with its rank; the exit code is that "
                    "of the rank that failed first.",
        epilog="All COMMLIB_* and HOROVOD_* environment variables are forwarded to every rank "
               "(Horovod's tuning variables are read as commlib's). "
               f"Set {MPIEXEC_ENV} to choose the mpiexec/mpirun binary. After a rank fails, "
               f"the other ranks get ${_rankwrap.FAILURE_GRACE_ENV} seconds (default "
               f"{_rankwrap.DEFAULT_FAILURE_GRACE:g}) to notice and report it before the "
               "job is torn down. The program is looked up on PATH and passed by its absolute "
               "path, without a shell. On one host OMP_NUM_THREADS is set to cores / ranks "
               "unless set. -np takes 1 to 65536 and a slot count 1 to 4096; other values are "
               "refused (exit 2) before mpiexec runs. SIGTERM, SIGINT and --timeout reach the "
               "ranks as SIGINT; once mpiexec has exited, or 5 s after the signal, whatever of "
               "the job is left on this host is killed and its /dev/shm segments are removed. "
               "A rank whose failure only followed another's (NotInitializedError, "
               "RankLostError, CollectiveTimeoutError) is named only when no other rank "
               "failed. Open MPI gets --allow-run-as-root, oversubscription, "
               "--bind-to none (unless other binding options are given) and "
               "OMPI_MCA_op=^avx (unless set).",
    )
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int, metavar="N",
                   help="number of ranks (processes) to start")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="comma-separated hosts with slot counts, e.g. host1:2,host2:2")
    hosts.add_argument("--hostfile", metavar="FILE",
                       help="hostfile, passed through to mpiexec in its own format")
    p.add_argument("-x", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also forward this environment variable (repeatable)")
    p.add_argument("--mpi-args", default="", metavar="ARGS",
                   help="extra raw mpiexec arguments, split like a shell would; write a single "
                        "option as --mpi-args=-OPTION")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="kill the whole job after this many seconds and exit with code "
                        f"{TIMEOUT_EXIT_CODE}; first, the ranks on this host that called commlib.init() "
                        f"print every thread's Python stack (where the job hangs)")
    p.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="start the whole job again, up to N times, when a rank fails; scripts "
                        "resume from their last commit (commlib.torch.elastic, "
                        f"commlib.tensorflow.keras.elastic) in ${ELASTIC_DIR_ENV} (a temporary "
                        "directory of the job's own when unset)")
    p.add_argument("--bind-cores", action="store_true",
                   help="pin each rank to its own block of its host's CPUs (CPUs // ranks on the "
                        "host, in local-rank order; a host with more ranks than CPUs is left "
                        "unpinned), as DeepSpeed's --bind_cores_to_rank: no rank's threads "
                        "migrate onto another's CPUs. For hosts the job has to itself")
    horovod_flags.add_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the mpiexec command instead of running it")
    p.add_argument("--verbose", action="store_true",
                   help="print the mpiexec command to stderr before running it")
    p.add_argument("--version", nargs=0, action=_PrintVersion, help="print commlib's version and exit")
    p.add_argument("--check-build", action="store_true",
                   help="report MPI, NCCL, frameworks and the commlib core build, then exit")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program to run on every rank, with its arguments")
    return p


class _PrintVersion(argparse.Action):
    """--version: commlib's installed version, read from the package metadata
    (importing commlib would load the core) only when asked for (reading it
    costs ~20 ms, which every launch would pay as argparse's version=)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        try:
            version = metadata.version("commlib")
        except metadata.PackageNotFoundError:
            version = "unknown: not installed"
        print(f"commlibrun (commlib {version})")
        parser.exit()


def main(argv=None):
    """Entry point of ``commlibrun``; returns the exit code."""
    parser = make_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.check_build:
        from .check_build import report
        print(report())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.np is None or not command:
        parser.error("-np N and a command are required")
    if args.timeout is not None and not 0 < args.timeout < math.inf:  # (NaN and infinity too)
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.restarts < 0:
        parser.error("--restarts must be 0 or more")

    try:
        environ = dict(os.environ)
        command = resolve_program(command, environ)
        mpiexec = find_mpiexec(environ, python=sys.executable)
        flavour = detect_flavour(mpiexec_version_text(mpiexec))
        extra = default_thread_env(environ, args.np, args.hosts, args.hostfile)
        extra.update(flavour_env(flavour, environ))
        extra.update(parse_env_assignments(args.env, environ))
        extra.update(horovod_flags.env_from(args))
        if args.bind_cores:
            extra[_rankwrap.BIND_CORES_ENV] = "1"
        env = forwarded_env(environ, extra)
        build = dict(flavour=flavour, np=args.np, command=command, hosts=args.hosts,
                     hostfile=args.hostfile, mpi_args=shlex.split(args.mpi_args), mpiexec=mpiexec)
        cmd = build_command(env=env, **build)
    except (LauncherError, ValueError) as e:  # ValueError: unbalanced quotes in --mpi-args
        print(f"commlibrun: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        # The real command also forwards the per-job COMMLIB_RUN_STATUS_DIR and
        # COMMLIB_RUN_OUTPUT_SOCKET.
        print(shlex.join(cmd))
        return 0

    elastic_dir = None
    if args.restarts and not environ.get(ELASTIC_DIR_ENV):
        # Commits must outlive each attempt, not the job: a directory of its own.
        elastic_dir = tempfile.mkdtemp(prefix="commlibrun-elastic-")
        env[ELASTIC_DIR_ENV] = elastic_dir
    attempt = functools.partial(_run_attempt, build=build, env=env, environ=environ,
                                verbose=args.verbose)
    try:
        return run_with_restarts(attempt, args.restarts, args.timeout)
    finally:
        if elastic_dir is not None:
            shutil.rmtree(elastic_dir, ignore_errors=True)


def _run_attempt(number, timeout, *, build, env, environ, verbose):
    """Run the job once (attempt ``number``, 0 first); return an Attempt.
    A job that failed prints its cause in run_with_restarts, not here."""
    status_dir = tempfile.mkdtemp(prefix="commlibrun-")
    relay = None
    reaper = JobReaper()
    env = dict(env, **{STATUS_DIR_ENV: status_dir, RESTART_ENV: str(number), JOB_ENV: reaper.token})
    environ = dict(environ)
    try:
        try:
            relay = OutputRelay(os.path.join(status_dir, "output"))
            env[OUTPUT_SOCKET_ENV] = relay.path
        except OSError:
            pass  # the ranks' lines then come through mpiexec
        cmd = build_command(env=env, **build)
        if verbose:
            print(f"commlibrun: {build['flavour']}: {shlex.join(cmd)}", file=sys.stderr,
                  flush=True)
        environ.update(env)
        job = _Job(timeout, status_dir, _rankwrap.failure_grace(environ), reaper)
        try:
            returncode = job.run(cmd, environ)
        except OSError as e:
            print(f"commlibrun: error: cannot run {build['mpiexec']}: {e}", file=sys.stderr)
            return Attempt(2, retryable=False)
        finally:
            if relay is not None:
                relay.close()
        if job.timed_out:
            return Attempt(TIMEOUT_EXIT_CODE, retryable=False)
        if job.signal_received is not None:
            print(f"commlibrun: interrupted by {signal.Signals(job.signal_received).name}",
                  file=sys.stderr)
            return Attempt(128 + job.signal_received, retryable=False)
        code, cause = failure_cause(returncode, read_statuses(status_dir), failure_notes.consequences(status_dir),
                                    failure_notes.aborted(status_dir))
        return Attempt(code, cause)
    finally:
        if relay is not None:
            relay.close(0)
        shutil.rmtree(status_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
