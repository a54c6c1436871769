#!/usr/bin/env python3
"""What MPICH's hydra runs instead of ``ssh`` for the network-namespace tests
(``HYDRA_LAUNCHER=ssh``, ``HYDRA_LAUNCHER_EXEC=<this file>``).

Hydra calls it as ssh: ``netns_exec.py [-x ...] <host> <command words...>``,
the words meant for a remote shell. The "host" is a network namespace of the
same name (netns_hosts.py creates both); the command runs there, in new UTS,
IPC, mount and PID namespaces, so that it sees a machine of its own: its host
name, its own /etc/hosts (``$NETNS_ETC_HOSTS``, bind-mounted) and its own
/dev/shm (a fresh tmpfs: shared-memory segments of one "host" are invisible
to the other, as on two machines).

Nothing must outlive the job, as sshd ends a session whose connection died:
this process asks the kernel to SIGKILL it when its parent (mpiexec) dies,
``unshare --kill-child`` passes that on to the namespace's first process,
and the kernel kills every process of a PID namespace when that one dies.
Only the standard library is used.
"""
import ctypes
import os
import re
import shlex
import signal
import sys

_PR_SET_PDEATHSIG = 1
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")


def parse(argv):
    """(host, command string) from ssh-style arguments; options before the
    host (hydra passes ``-x``) are ignored."""
    args = list(argv)
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2 or not _HOST.match(args[0]):
        raise SystemExit(f"netns_exec.py: usage: [-opts] <host> <command...>, got {argv!r}")
    return args[0], " ".join(args[1:])


def inner_script(host, command, etc_hosts):
    """The shell lines run as the new PID namespace's first process."""
    lines = [f"hostname {shlex.quote(host)}", "mount -t tmpfs -o size=512m tmpfs /dev/shm"]
    if etc_hosts:
        lines.append(f"mount --bind {shlex.quote(etc_hosts)} /etc/hosts")
    # (not exec'ed: the shell stays the namespace's init and reaps orphans)
    lines.append(command)
    return "set -e\n" + "\n".join(lines[:-1]) + "\nset +e\n" + lines[-1] + "\n"


def main(argv):
    host, command = parse(argv)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # mpiexec died before the prctl took effect
        return 1
    script = inner_script(host, command, os.environ.get("NETNS_ETC_HOSTS", ""))
    cmd = ["ip", "netns", "exec", host, "unshare", "--uts", "--ipc", "--mount", "--pid", "--fork",
           "--mount-proc", "--kill-child=SIGKILL", "sh", "-c", script]
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
