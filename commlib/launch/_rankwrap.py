"""Per-rank wrapper used by ``commlibrun``.

``commlibrun`` starts every rank as::

    mpiexec ... <python> -I .../commlib/launch/_rankwrap.py -- <user command...>

The wrapper runs the user command as a child process and

* prefixes every line the child writes to stdout/stderr with ``[rank]: ``,
  writing whole lines only (MPICH's ``-prepend-rank`` tags raw chunks, so
  lines written in pieces come out garbled);
* sends those lines straight to ``commlibrun`` over the Unix socket named by
  ``$COMMLIB_RUN_OUTPUT_SOCKET`` when it can connect (ranks on the launcher's
  host), since Open MPI's mpirun forwards output in 4 KiB reads that can cut
  a line and put another rank's output in the middle; otherwise (other
  hosts) they go to the wrapper's own stdout/stderr through the MPI launcher;
* exits with the child's exit code, or ``128 + signum`` if the child was
  killed by a signal, and says on stderr which rank failed and how;
* with ``$COMMLIB_RUN_BIND_CORES=1`` (``commlibrun --bind-cores``), pins
  itself and so the child to the rank's own block of the host's CPUs
  (``bind_to_cores``) before starting it;
* records ``<code> <time.time()>`` in ``$COMMLIB_RUN_STATUS_DIR/rank<R>`` so
  the launcher can tell which rank failed first;
* after a failure, waits ``$COMMLIB_FAILURE_GRACE`` seconds (default 3)
  before exiting, so the other ranks get to notice and report the lost peer
  before the MPI launcher kills them;
* forwards SIGTERM/SIGINT (and SIGHUP, SIGQUIT, SIGUSR1/2) to the child, and
  makes the kernel kill the child if the wrapper itself dies
  (``PR_SET_PDEATHSIG``).

It deliberately uses the standard library only and is started by file path
with ``python -I``: it must not import the ``commlib`` package (which loads
the compiled core) in every rank, and must not touch MPI -- the PMI
connection that hydra passes down (``PMI_FD``) belongs to the user program.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# Environment variables that hold the rank: MPICH hydra, Open MPI, PMIx.
RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
# A rank's place on its host (local rank, ranks on the host): MPICH hydra, Open MPI.
LOCAL_PLACE_ENV_VARS = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))
BIND_CORES_ENV = "COMMLIB_RUN_BIND_CORES"  # commlibrun --bind-cores
STATUS_DIR_ENV = "COMMLIB_RUN_STATUS_DIR"
OUTPUT_SOCKET_ENV = "COMMLIB_RUN_OUTPUT_SOCKET"
# commlib.stack_dumps: a rank that writes its Python stacks on STACKS_SIGNAL
# says so with a file STACKS_FILE_PREFIX<pid> in the status folder.
STACKS_SIGNAL = signal.SIGUSR2
STACKS_FILE_PREFIX = "stacks."
# First byte a wrapper sends on an output connection: which stream it carries.
STDOUT_TAG = b"1"
STDERR_TAG = b"2"
FAILURE_GRACE_ENV = "COMMLIB_FAILURE_GRACE"
DEFAULT_FAILURE_GRACE = 3.0
# Signals passed on to the child, so the wrapper is transparent to them
# (hydra -disable-auto-cleanup, for one, notifies ranks of failures with SIGUSR1).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)
# How long to wait for the output pipes to drain after the child has exited.
# Only matters if the child left descendants that still hold the pipes open.
PIPE_DRAIN_TIMEOUT = 5.0

_PR_SET_PDEATHSIG = 1


def get_rank(environ=os.environ):
    """Return the rank (as a string) from the MPI launcher's environment."""
    for name in RANK_ENV_VARS:
        if environ.get(name):
            return environ[name]
    return "?"


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code_for(returncode):
    """Map a ``Popen.returncode`` to a shell-style exit code."""
    return 128 - returncode if returncode < 0 else returncode


def write_status(status_dir, rank, code, when=None):
    """Atomically write ``<code> <time>`` to ``<status_dir>/rank<rank>``;
    ``when`` (default now) is the ``time.time()`` at which the rank ended.

    Failures are ignored: on remote hosts the launcher's directory does not
    exist, and the launcher then falls back to mpiexec's exit code.
    """
    path = os.path.join(status_dir, f"rank{rank}")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(f"{code} {(time.time() if when is None else when)!r}\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _child_preexec(parent_pid):
    """Build the function run in the forked child before exec."""
    libc = ctypes.CDLL(None) if sys.platform.startswith("linux") else None

    def preexec():
        # Own process group: signals sent to the launcher's process group
        # reach the child once, via the wrapper's forwarding, not twice.
        os.setpgid(0, 0)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # The wrapper may have died before prctl took effect.
            if os.getppid() != parent_pid:
                os._exit(1)

    return preexec


class _SocketSink:
    """Binary-stream stand-in that sends to commlibrun's output socket.

    If the launcher goes away mid-job, output falls back to ``fallback`` (the
    wrapper's own stdout/stderr) rather than being lost or blocking the child.
    """

    def __init__(self, sock, fallback):
        self._sock = sock
        self._fallback = fallback

    def write(self, data):
        if self._sock is not None:
            try:
                self._sock.sendall(data)
                return
            except OSError:
                self.close()
        self._fallback.write(data)

    def flush(self):
        if self._sock is None:
            self._fallback.flush()

    def close(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def open_output(tag, fallback, environ=os.environ):
    """Where to write one stream's prefixed lines: the launcher's socket if it
    accepts a connection (see ``OUTPUT_SOCKET_ENV``), else ``fallback``."""
    path = environ.get(OUTPUT_SOCKET_ENV)
    if not path:
        return fallback
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        sock.connect(path)
        sock.settimeout(None)
        sock.sendall(tag)
    except OSError:
        sock.close()
        return fallback
    return _SocketSink(sock, fallback)


def _pump(src, dst, prefix):
    """Copy lines from pipe ``src`` to binary stream ``dst`` with ``prefix``.

    Each line is written with a single write and flushed, so lines of
    different ranks can only be interleaved between lines.  A final line
    without a newline is terminated at EOF.
    """
    with src:
        for line in src:
            if not line.endswith(b"\n"):
                line += b"\n"
            dst.write(prefix + line)
            dst.flush()


def failure_grace(environ=os.environ):
    """Seconds to linger after a failure, from ``$COMMLIB_FAILURE_GRACE``."""
    value = environ.get(FAILURE_GRACE_ENV)
    if not value:
        return DEFAULT_FAILURE_GRACE
    try:
        grace = float(value)
        if grace >= 0:
            return grace
    except ValueError:
        pass
    print(f"commlibrun: ignoring invalid {FAILURE_GRACE_ENV}={value!r}", file=sys.stderr, flush=True)
    return DEFAULT_FAILURE_GRACE


def _run_child(command, rank, host):
    """Run the user command with prefixed output.

    Returns ``(exit_code, signalled, ended)``; ``signalled`` tells whether the
    wrapper itself received (and forwarded) a signal, ``ended`` is the
    ``time.time()`` at which the child's exit was reaped.
    """
    try:
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Keep inherited descriptors such as hydra's PMI socket (PMI_FD).
            close_fds=False,
            preexec_fn=_child_preexec(os.getpid()),
        )
    except OSError as e:
        print(f"commlibrun: rank {rank} on host {host}: cannot run {command[0]!r}: {e}",
              file=sys.stderr, flush=True)
        return 127, False, time.time()

    received = []

    def forward(signum, frame):
        received.append(signum)
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)

    prefix = f"[{rank}]: ".encode()
    sinks = [open_output(STDOUT_TAG, sys.stdout.buffer), open_output(STDERR_TAG, sys.stderr.buffer)]
    pumps = [
        threading.Thread(target=_pump, args=(child.stdout, sinks[0], prefix), daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, sinks[1], prefix), daemon=True),
    ]
    for t in pumps:
        t.start()
    returncode = child.wait()
    ended = time.time()  # (not after the drain below: a loaded machine may take long)
    deadline = time.monotonic() + PIPE_DRAIN_TIMEOUT
    for t in pumps:
        t.join(max(0.0, deadline - time.monotonic()))
    # From here on a signal simply ends the wrapper.
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)

    code = exit_code_for(returncode)
    message = None
    if returncode < 0:
        message = (f"commlibrun: rank {rank} (pid {child.pid} on host {host}) "
                   f"was killed by signal {signal_name(-returncode)}")
    elif returncode > 0:
        message = f"commlibrun: rank {rank} exited with code {code}"
    # The report follows the rank's own stderr lines on the same channel,
    # unless that pump is still busy (a descendant holds the pipe open).
    err_sink = sinks[1] if not pumps[1].is_alive() else sys.stderr.buffer
    if message:
        err_sink.write(f"{message}\n".encode())
        err_sink.flush()
    for sink, t in zip(sinks, pumps):
        if isinstance(sink, _SocketSink) and not t.is_alive():
            sink.close()
    return code, bool(received), ended


def core_block(cpus, local_rank, local_size):
    """The CPUs of rank ``local_rank`` when ``local_size`` ranks of one host
    split ``cpus`` (sorted CPU ids) in local-rank order: ``len(cpus) //
    local_size`` each; None when the host has more ranks than CPUs (or the
    place makes no sense), for such a host is left to the scheduler."""
    if not 0 <= local_rank < local_size or local_size > len(cpus):
        return None
    k = len(cpus) // local_size
    return cpus[local_rank * k:(local_rank + 1) * k]


def bind_to_cores(environ=os.environ):
    """``commlibrun --bind-cores``: pins this wrapper, and so the rank it
    starts (threads and children inherit the mask), to its block of the CPUs
    it may run on. Returns the block, or None where it pins nothing (no
    local place in the environment, more ranks than CPUs)."""
    for rank_var, size_var in LOCAL_PLACE_ENV_VARS:
        try:
            local_rank, local_size = int(environ[rank_var]), int(environ[size_var])
        except (KeyError, ValueError):
            continue
        block = core_block(sorted(os.sched_getaffinity(0)), local_rank, local_size)
        if block:
            os.sched_setaffinity(0, block)
        return block
    return None


def run(command, environ=os.environ):
    """Run ``command`` as rank ``get_rank()``; return the exit code to use."""
    rank = get_rank(environ)
    if environ.get(BIND_CORES_ENV) == "1":
        bind_to_cores(environ)
    code, signalled, ended = _run_child(command, rank, socket.gethostname())
    status_dir = environ.get(STATUS_DIR_ENV)
    if status_dir:
        write_status(status_dir, rank, code, ended)
    if code != 0 and not signalled:
        # The MPI launcher tears the whole job down as soon as this process
        # exits with an error.  Lingering lets the other ranks notice the
        # lost peer first and report it themselves (commlib raises
        # RankLostError).  Their wrappers linger too, so the job ends when
        # the first failed rank's grace period is over.
        time.sleep(failure_grace(environ))
    return code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: _rankwrap.py -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
