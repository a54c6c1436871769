"""Unit tests for the commlibrun launcher, the rank wrapper and --check-build.

Nothing here starts an MPI job; the wrapper tests run it without MPI.
"""

import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from commlib.launch import _rankwrap, check_build, launcher
from commlib.launch.launcher import MPICH, OPENMPI, LauncherError, MPIFlavour

MPICH_VERSION_TEXT = """\
HYDRA build details:
    Version:                                 4.1.2
    Release Date:                            Wed Jun  7 15:22:45 CDT 2023
    CC:                              gcc
    Configure options:                       '--disable-option-checking' '--prefix=/usr'
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
    Topology libraries available:            hwloc
    Resource management kernels available:   user slurm ll lsf sge pbs cobalt
    Demux engines available:                 poll select
"""
OMPI4_VERSION_TEXT = """\
mpirun (Open MPI) 4.1.5

Report bugs to http://www.open-mpi.org/community/help/
"""
OMPI5_VERSION_TEXT = """\
mpirun (Open MPI) 5.0.3

Report bugs to https://www.open-mpi.org/community/help/
"""
ORTE_VERSION_TEXT = "orterun (OpenRTE) 3.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
PRTE_VERSION_TEXT = "prterun (PRRTE) 3.0.6\n\nReport bugs to https://github.com/openpmix/prrte\n"

HYDRA = MPIFlavour(MPICH, "4.1.2")
OMPI4 = MPIFlavour(OPENMPI, "4.1.5")
OMPI5 = MPIFlavour(OPENMPI, "5.0.3")
WRAP = ["PY", "-I", "-S", "WRAP.py", "--"]
TRICKY_ARGS = ["python", "train.py", "a b", "it's", '"quoted"', "$HOME", "x;rm -rf /", "*", "--lr=0.1", ""]


# --- flavour detection -------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (MPICH_VERSION_TEXT, HYDRA),
    (OMPI4_VERSION_TEXT, OMPI4),
    (OMPI5_VERSION_TEXT, OMPI5),
    (ORTE_VERSION_TEXT, MPIFlavour(OPENMPI, "3.1.6")),
    (PRTE_VERSION_TEXT, MPIFlavour(OPENMPI, "5")),
])
def test_detect_flavour(text, expected):
    assert launcher.detect_flavour(text) == expected


def test_flavour_major_and_str():
    assert (HYDRA.major, OMPI4.major, OMPI5.major) == (4, 4, 5)
    assert str(HYDRA) == "MPICH (hydra) 4.1.2"
    assert str(OMPI5) == "Open MPI 5.0.3"


@pytest.mark.parametrize("text", ["", "Intel(R) MPI Library for Linux* OS\n", "some other launcher 1.0"])
def test_detect_flavour_unknown(text):
    with pytest.raises(LauncherError, match="unrecognised MPI launcher"):
        launcher.detect_flavour(text)


# --- command construction ----------------------------------------------------------------

def build(flavour, **kw):
    kw.setdefault("np", 4)
    kw.setdefault("command", ["python", "train.py"])
    kw.setdefault("euid", 1000)
    kw.setdefault("wrapper", WRAP)
    return launcher.build_command(flavour, **kw)


def test_build_mpich_basic():
    assert build(HYDRA) == ["mpiexec", "-n", "4"] + WRAP + ["python", "train.py"]


def test_build_mpich_hosts_env_and_mpi_args():
    cmd = build(HYDRA, hosts="h1:2,h2:2", env={"COMMLIB_A": "1", "OTHER": "a b"},
                mpi_args=["-bind-to", "core"], mpiexec="/opt/mpich/bin/mpiexec", euid=0)
    assert cmd == ["/opt/mpich/bin/mpiexec", "-n", "4", "-hosts", "h1:2,h2:2",
                   "-genv", "COMMLIB_A", "1", "-genv", "OTHER", "a b",
                   "-bind-to", "core"] + WRAP + ["python", "train.py"]
    # Open MPI-only flags are never given to hydra, even as root.
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd


def test_build_mpich_hostfile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.txt").write_text("h1:2\nh2:2\n")
    assert build(HYDRA, hostfile="hosts.txt")[:5] == ["mpiexec", "-n", "4", "-f", "hosts.txt"]


def test_build_openmpi4():
    cmd = build(OMPI4, hosts="h1:2,h2:2", env={"COMMLIB_A": "1", "EXTRA": "x"}, euid=0)
    assert cmd == ["mpiexec", "-np", "4", "--host", "h1:2,h2:2", "--allow-run-as-root", "--oversubscribe",
                   "--bind-to", "none", "-x", "COMMLIB_A", "-x", "EXTRA"] + WRAP + ["python", "train.py"]


def test_build_openmpi5(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text("h1 slots=2\n")
    cmd = build(OMPI5, hostfile="hf", euid=0)
    assert cmd == ["mpiexec", "-np", "4", "--hostfile", "hf", "--allow-run-as-root",
                   "--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"] + WRAP + ["python", "train.py"]


@pytest.mark.parametrize("flavour", [OMPI4, OMPI5])
def test_build_openmpi_root_flag_depends_on_euid(flavour):
    assert "--allow-run-as-root" in build(flavour, euid=0)
    assert "--allow-run-as-root" not in build(flavour, euid=1000)


def test_build_openmpi_euid_defaults_to_geteuid(monkeypatch):
    monkeypatch.setattr(launcher.os, "geteuid", lambda: 0)
    assert "--allow-run-as-root" in launcher.build_command(OMPI4, 2, ["prog"], wrapper=WRAP)
    monkeypatch.setattr(launcher.os, "geteuid", lambda: 1234)
    assert "--allow-run-as-root" not in launcher.build_command(OMPI4, 2, ["prog"], wrapper=WRAP)


@pytest.mark.parametrize("user_map_by", [["--map-by", "ppr:1:node"], ["--map-by=slot"], ["-map-by", "node"]])
def test_build_openmpi5_keeps_user_map_by(user_map_by):
    cmd = build(OMPI5, mpi_args=user_map_by)
    assert ":OVERSUBSCRIBE" not in cmd
    assert cmd[-len(WRAP) - 2 - len(user_map_by):-len(WRAP) - 2] == user_map_by


@pytest.mark.parametrize("flavour", [OMPI4, OMPI5])
@pytest.mark.parametrize("user_binding", [["--bind-to", "core"], ["-bind-to=socket"], ["--cpu-set", "0,1"],
                                          ["--map-by", "slot:PE=2"], ["-rf", "ranks.txt"], ["--bind-to-core"]])
def test_build_openmpi_binds_nothing_unless_the_user_binds(flavour, user_binding):
    """Open MPI pins each of up to 2 ranks to one core by default (MPICH
    binds nothing): commlibrun asks for no binding, unless the user's own
    options bind or place ranks."""
    assert build(flavour)[-len(WRAP) - 4:-len(WRAP) - 2] == ["--bind-to", "none"]
    cmd = build(flavour, mpi_args=user_binding)
    assert "none" not in cmd and cmd[-len(WRAP) - 2 - len(user_binding):-len(WRAP) - 2] == user_binding
    assert "--bind-to" not in build(HYDRA)
    # (a "PE=" elsewhere, as in a variable's value, binds nothing)
    assert build(flavour, mpi_args=["-x", "MYTYPE=1"])[-len(WRAP) - 6:-len(WRAP) - 4] == ["--bind-to", "none"]


@pytest.mark.parametrize("flavour", [HYDRA, OMPI4, OMPI5])
def test_build_passes_arguments_unchanged(flavour):
    cmd = build(flavour, command=TRICKY_ARGS)
    assert cmd[-len(TRICKY_ARGS):] == TRICKY_ARGS
    assert cmd[-len(TRICKY_ARGS) - len(WRAP):-len(TRICKY_ARGS)] == WRAP


def test_build_errors():
    with pytest.raises(LauncherError):
        build(HYDRA, np=0)
    with pytest.raises(LauncherError):
        build(HYDRA, command=[])
    with pytest.raises(LauncherError):
        build(OMPI4, hosts="h1", hostfile="hf")


def test_rank_wrapper_command_runs_wrapper_file_isolated():
    cmd = launcher.rank_wrapper_command()
    assert cmd[:3] == [sys.executable, "-I", "-S"]
    assert os.path.samefile(cmd[3], _rankwrap.__file__)
    assert cmd[4] == "--"


# --- environment forwarding --------------------------------------------------------------

def test_forwarded_env_selects_commlib_vars():
    environ = {"COMMLIB_FOO": "1", "COMMLIB_BAR": "a b", "PATH": "/bin", "XCOMMLIB_NO": "x"}
    assert launcher.forwarded_env(environ) == {"COMMLIB_BAR": "a b", "COMMLIB_FOO": "1"}
    assert launcher.forwarded_env(environ, {"NCCL_DEBUG": "INFO", "COMMLIB_FOO": "2"}) == {
        "COMMLIB_BAR": "a b", "COMMLIB_FOO": "2", "NCCL_DEBUG": "INFO"}


def test_parse_env_assignments():
    environ = {"HOME": "/root"}
    assert launcher.parse_env_assignments(["A=1", "B=x=y", "C=", "HOME"], environ) == {
        "A": "1", "B": "x=y", "C": "", "HOME": "/root"}
    with pytest.raises(LauncherError, match="not set"):
        launcher.parse_env_assignments(["UNSET_VAR"], environ)
    with pytest.raises(LauncherError, match="invalid"):
        launcher.parse_env_assignments(["1BAD=x"], environ)


# --- status files and exit codes ---------------------------------------------------------

def test_status_files_round_trip(tmp_path):
    _rankwrap.write_status(str(tmp_path), "0", 0)
    _rankwrap.write_status(str(tmp_path), "2", 137)
    (tmp_path / "unrelated").write_text("x")
    (tmp_path / "rank7").write_text("garbage")
    statuses = launcher.read_statuses(str(tmp_path))
    assert sorted(statuses) == [0, 2]
    assert statuses[2][0] == 137 and abs(statuses[2][1] - time.time()) < 60
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_status_carries_the_time_the_rank_ended(tmp_path):
    # A killed rank's wrapper may drain its output long after the rank ended
    # (loaded machine): the earliest *ending*, not the earliest write, is first.
    _rankwrap.write_status(str(tmp_path), "1", 137, when=100.25)
    _rankwrap.write_status(str(tmp_path), "0", 3, when=101.5)
    statuses = launcher.read_statuses(str(tmp_path))
    assert statuses == {1: (137, 100.25), 0: (3, 101.5)}
    assert launcher.first_failure(statuses) == (1, 137)


def test_write_status_ignores_missing_dir(tmp_path):
    _rankwrap.write_status(str(tmp_path / "missing"), "0", 1)  # must not raise


def test_first_failure_is_earliest():
    assert launcher.first_failure({}) is None
    assert launcher.first_failure({0: (0, 1.0), 1: (0, 2.0)}) is None
    assert launcher.first_failure({0: (143, 5.0), 1: (137, 3.0), 2: (0, 1.0)}) == (1, 137)
    # A rank whose failure followed another's (commlib.failure_notes) comes last.
    assert launcher.first_failure({0: (1, 5.0), 1: (1, 3.0)}, consequences={1}) == (0, 1)
    assert launcher.first_failure({0: (1, 5.0), 1: (1, 3.0)}, consequences={0, 1}) == (1, 1)


def test_a_rank_that_met_a_lost_rank_is_a_consequence(tmp_path, monkeypatch):
    # Rank 1 caught the RankLostError and exited with code 3 before rank 0's
    # SIGKILL was reaped (loaded machine): the dead rank is still named first.
    from commlib import _lib, errors, failure_notes

    monkeypatch.setenv(_rankwrap.STATUS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(failure_notes, "_rank", 1)
    assert isinstance(_lib.error_for(_lib.lib.COMMLIB_ERR_PEER_LOST, "rank 0 died"), errors.RankLostError)
    _lib.error_for(_lib.lib.COMMLIB_ERR_TIMED_OUT, "waited")  # (not a lost rank: no note)
    monkeypatch.setattr(failure_notes, "_rank", 2)
    _lib.error_for(_lib.lib.COMMLIB_ERR_MISMATCH, "shapes")
    assert failure_notes.consequences(str(tmp_path)) == {1}
    _rankwrap.write_status(str(tmp_path), "1", 3, when=100.0)
    _rankwrap.write_status(str(tmp_path), "0", 137, when=100.5)
    code, cause = launcher.failure_cause(137, launcher.read_statuses(str(tmp_path)),
                                         failure_notes.consequences(str(tmp_path)))
    assert (code, cause) == (137, "rank 0 was killed by signal SIGKILL (first failure)")


def test_failure_cause_names_ranks_that_aborted():
    # An MPI abort ends the job before the wrappers record statuses: the ranks' notes name them.
    code, cause = launcher.failure_cause(1, {}, aborted=[0, 2])
    assert code == 1 and cause.startswith("ranks 0, 2 lost contact with other ranks and aborted MPI"), cause
    assert launcher.failure_cause(0, {}, aborted=[1]) == (0, None)
    assert launcher.failure_cause(1, {1: (3, 1.0)}, aborted=[0])[1] == "rank 1 exited with code 3 (first failure)"


def test_describe_exit():
    assert launcher.describe_exit(3) == "exited with code 3"
    assert launcher.describe_exit(137) == "was killed by signal SIGKILL"
    assert launcher.describe_exit(143) == "was killed by signal SIGTERM"
    assert launcher.describe_exit(255) == "exited with code 255"


def test_job_exit_code():
    assert launcher.job_exit_code(0, {0: (0, 1.0)}) == (0, None)
    code, msg = launcher.job_exit_code(9, {0: (143, 2.0), 1: (137, 1.0)})
    assert code == 137
    assert msg == "commlibrun: job failed: rank 1 was killed by signal SIGKILL (first failure)"
    # No status files (ranks on other hosts): mpiexec's status decides.
    assert launcher.job_exit_code(5, {})[0] == 5
    code, msg = launcher.job_exit_code(-signal.SIGKILL, {})
    assert code == 137 and "SIGKILL" in msg


# --- command line ------------------------------------------------------------------------

@pytest.fixture
def fake_mpiexec(tmp_path, monkeypatch):
    """Point COMMLIB_MPIEXEC at a script that prints the given version text."""
    def make(version_text):
        path = tmp_path / "fake-mpiexec"
        path.write_text("#!/bin/sh\ncat <<'EOF'\n" + version_text + "EOF\n")
        path.chmod(0o755)
        monkeypatch.setenv("COMMLIB_MPIEXEC", str(path))
        return str(path)
    return make


def dry_run(capsys, argv):
    assert launcher.main(["--dry-run"] + argv) == 0
    return shlex.split(capsys.readouterr().out)


def test_dry_run_mpich(capsys, fake_mpiexec, monkeypatch):
    mpiexec = fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.setenv("COMMLIB_FOO", "foo value")
    cmd = dry_run(capsys, ["-np", "3", "-H", "a:2,b:1", "-x", "EXTRA=1", "--mpi-args", "-bind-to core -v",
                           *TRICKY_ARGS])
    assert cmd[:5] == [mpiexec, "-n", "3", "-hosts", "a:2,b:1"]
    assert ["-genv", "COMMLIB_FOO", "foo value"] == cmd[cmd.index("COMMLIB_FOO") - 1:cmd.index("COMMLIB_FOO") + 2]
    assert ["-genv", "EXTRA", "1"] == cmd[cmd.index("EXTRA") - 1:cmd.index("EXTRA") + 2]
    tail = (["-bind-to", "core", "-v"] + launcher.rank_wrapper_command()
            + launcher.resolve_program(TRICKY_ARGS))
    assert cmd[-len(tail):] == tail
    assert "COMMLIB_RUN_STATUS_DIR" not in cmd


def test_dry_run_autotune_flags_set_their_variables(capsys, fake_mpiexec, tmp_path, monkeypatch):
    fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.chdir(tmp_path)
    for name in ("COMMLIB_AUTOTUNE", "COMMLIB_AUTOTUNE_LOG"):
        monkeypatch.delenv(name, raising=False)
    cmd = dry_run(capsys, ["-np", "2", "--autotune", "--autotune-log-file", "tune.csv", "python", "t.py"])
    assert ["-genv", "COMMLIB_AUTOTUNE", "1"] == cmd[cmd.index("COMMLIB_AUTOTUNE") - 1:cmd.index("COMMLIB_AUTOTUNE") + 2]
    at = cmd.index("COMMLIB_AUTOTUNE_LOG")
    assert cmd[at - 1:at + 2] == ["-genv", "COMMLIB_AUTOTUNE_LOG", str(tmp_path / "tune.csv")]
    cmd = dry_run(capsys, ["-np", "2", "python", "t.py"])
    assert "COMMLIB_AUTOTUNE" not in cmd and "COMMLIB_AUTOTUNE_LOG" not in cmd


def genv(cmd, name):
    """The value commlibrun's mpiexec command gives ``name`` (-genv), or None."""
    at = [i for i in range(len(cmd) - 2) if cmd[i] == "-genv" and cmd[i + 1] == name]
    return cmd[at[0] + 2] if at else None


def test_dry_run_horovodrun_tuning_flags_set_their_variables(capsys, fake_mpiexec, tmp_path,
                                                             monkeypatch):
    fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COMMLIB_TIMEOUT", "30")  # (a flag wins over the environment)
    cmd = dry_run(capsys, ["-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                           "--cache-capacity", "7", "--timeline-filename", "t.json",
                           "--timeline-mark-cycles", "--stall-check-warning-time-seconds", "9",
                           "--stall-check-shutdown-time-seconds", "120", "python", "t.py"])
    want = {"COMMLIB_FUSION_THRESHOLD": str(32 << 20), "COMMLIB_CYCLE_TIME": "2.5",
            "COMMLIB_CACHE_CAPACITY": "7", "COMMLIB_TIMELINE": str(tmp_path / "t.json"),
            "COMMLIB_TIMELINE_MARK_CYCLES": "1", "COMMLIB_STALL_CHECK_TIME": "9",
            "COMMLIB_TIMEOUT": "120"}
    assert {name: genv(cmd, name) for name in want} == want
    cmd = dry_run(capsys, ["-np", "2", "--disable-cache", "--no-stall-check", "python", "t.py"])
    assert genv(cmd, "COMMLIB_CACHE_CAPACITY") == "0"
    assert genv(cmd, "COMMLIB_STALL_CHECK_TIME") == "1000000000"
    cmd = dry_run(capsys, ["-np", "2", "python", "t.py"])
    assert genv(cmd, "COMMLIB_FUSION_THRESHOLD") is None and genv(cmd, "COMMLIB_TIMEOUT") == "30"


def test_horovodrun_flags_refuse_conflicts_and_bad_values(capsys, fake_mpiexec, tmp_path,
                                                          monkeypatch):
    fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.chdir(tmp_path)
    for flags in (["--disable-cache", "--cache-capacity", "3"],
                  ["--no-stall-check", "--stall-check-warning-time-seconds", "3"]):
        with pytest.raises(SystemExit) as e:
            launcher.main(["-np", "2", *flags, "--dry-run", "python", "t.py"])
        assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    for flag, value in (("--fusion-threshold-mb", "-1"), ("--fusion-threshold-mb", "nan"),
                        ("--cycle-time-ms", "inf"), ("--cache-capacity", "-2"),
                        ("--stall-check-shutdown-time-seconds", "-1")):
        assert launcher.main(["-np", "2", flag, value, "--dry-run", "python", "t.py"]) == 2
        assert f"{flag} must be 0 or more (and finite), got" in capsys.readouterr().err
    for value in ("0", "-5", "nan", "inf"):
        with pytest.raises(SystemExit) as e:
            launcher.main(["-np", "2", "--timeout", value, "--dry-run", "python", "t.py"])
        assert e.value.code == 2 and "--timeout must be a positive number of seconds" in capsys.readouterr().err


def test_dry_run_forwards_horovod_variables(capsys, fake_mpiexec, tmp_path, monkeypatch):
    fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    cmd = dry_run(capsys, ["-np", "2", "python", "t.py"])
    assert genv(cmd, "HOROVOD_FUSION_THRESHOLD") == "1048576"


@pytest.mark.parametrize("text, oversubscribe", [(OMPI4_VERSION_TEXT, ["--oversubscribe"]),
                                                 (OMPI5_VERSION_TEXT, ["--map-by", ":OVERSUBSCRIBE"])])
def test_dry_run_openmpi(capsys, fake_mpiexec, monkeypatch, tmp_path, text, oversubscribe):
    mpiexec = fake_mpiexec(text)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my hosts").write_text("localhost slots=2\n")
    monkeypatch.setenv("COMMLIB_FOO", "1")
    monkeypatch.delenv("OMPI_MCA_op", raising=False)
    monkeypatch.setattr(launcher.os, "geteuid", lambda: 0)
    cmd = dry_run(capsys, ["-np", "2", "--hostfile", "my hosts", "-x", "EXTRA=1", "--", "python", "t.py", "-np", "5"])
    assert cmd == [mpiexec, "-np", "2", "--hostfile", "my hosts", "--allow-run-as-root", *oversubscribe,
                   "--bind-to", "none", "-x", "COMMLIB_FOO", "-x", "COMMLIB_MPIEXEC", "-x", "EXTRA", "-x", "OMPI_MCA_op",
                   *launcher.rank_wrapper_command(), *launcher.resolve_program(["python"]),
                   "t.py", "-np", "5"]


def _exe(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_resolve_program(tmp_path, monkeypatch):
    first = _exe(tmp_path / "venv" / "bin" / "python3")
    _exe(tmp_path / "mpi" / "bin" / "python3")
    path = os.pathsep.join([str(tmp_path / "empty"), str(tmp_path / "venv" / "bin"),
                            str(tmp_path / "mpi" / "bin")])
    env = {"PATH": path}
    # the first on the caller's PATH, by its absolute path, arguments unchanged
    assert launcher.resolve_program(["python3", "x.py", "-n", "2"], env) == [first, "x.py", "-n", "2"]
    # a program with a slash, or not found, is left alone
    assert launcher.resolve_program(["./x.sh", "a"], env) == ["./x.sh", "a"]
    assert launcher.resolve_program(["/bin/true"], env) == ["/bin/true"]
    assert launcher.resolve_program(["no-such-program-123"], env) == ["no-such-program-123"]
    assert launcher.resolve_program([""], env) == [""]
    assert launcher.resolve_program([], env) == []
    # a relative PATH entry gives an absolute path; symlinks are not resolved
    # (a virtualenv's python3 is a link whose own path selects the environment)
    link = tmp_path / "link" / "python3"
    link.parent.mkdir()
    link.symlink_to(first)
    monkeypatch.chdir(tmp_path)
    assert launcher.resolve_program(["python3"], {"PATH": "link"}) == [str(link)]


def test_dry_run_resolves_program_on_callers_path(capsys, fake_mpiexec, tmp_path, monkeypatch):
    fake_mpiexec(OMPI4_VERSION_TEXT)
    prog = _exe(tmp_path / "bin" / "myprog")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "bin"), os.environ["PATH"]]))
    cmd = dry_run(capsys, ["-np", "2", "myprog", "arg"])
    assert cmd[-2:] == [prog, "arg"]


def test_cli_errors(capsys, fake_mpiexec):
    fake_mpiexec("something else 1.0\n")
    with pytest.raises(SystemExit):
        launcher.main(["python", "t.py"])  # no -np
    with pytest.raises(SystemExit):
        launcher.main(["-np", "2", "-H", "a", "--hostfile", "f", "python"])
    assert launcher.main(["-np", "2", "python", "t.py"]) == 2
    assert "unrecognised MPI launcher" in capsys.readouterr().err
    assert launcher.main(["-np", "2", "-x", "NOT_SET_ANYWHERE_123", "python"]) == 2
    fake_mpiexec(MPICH_VERSION_TEXT)
    assert launcher.main(["-np", "0", "python"]) == 2
    assert launcher.main(["-np", "2", "--mpi-args", '"unbalanced', "python"]) == 2
    err = capsys.readouterr().err
    assert "-np 0: the number of ranks must be an integer from 1 to 65536" in err and "No closing quotation" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        launcher.main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"commlibrun \(commlib \d+\.\d+\.\d+\S*\)\n",
                                              capsys.readouterr().out)


def test_find_mpiexec(monkeypatch, tmp_path):
    assert launcher.find_mpiexec({"COMMLIB_MPIEXEC": "/x/mpirun", "PATH": ""}) == "/x/mpirun"
    exe = tmp_path / "mpirun"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert launcher.find_mpiexec({"PATH": str(tmp_path)}) == str(exe)
    with pytest.raises(LauncherError, match="no mpiexec"):
        launcher.find_mpiexec({"PATH": str(tmp_path / "empty")})


def _script(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    path.chmod(0o755)
    return str(path)


def test_mpiexec_candidates_in_path_order_without_duplicates(tmp_path):
    a = _script(tmp_path / "a" / "mpiexec", MPICH_VERSION_TEXT)
    b = _script(tmp_path / "b" / "mpiexec", OMPI4_VERSION_TEXT)
    b_run = tmp_path / "b" / "mpirun"
    b_run.symlink_to(b)  # the same launcher under its other name counts once
    c = _script(tmp_path / "c" / "mpirun", OMPI4_VERSION_TEXT)
    path = os.pathsep.join(str(tmp_path / d) for d in ("a", "b", "", "c"))
    assert launcher.mpiexec_candidates({"PATH": path}) == [a, b, c]


@pytest.mark.parametrize("library_line, expected", [
    ("Open MPI v4.1.4, package: Debian OpenMPI", "b"),
    ("MPICH Version:      5.0.2", "a"),
    ("Intel(R) MPI Library 2021.10", "a"),  # unknown library: first on PATH
])
def test_find_mpiexec_prefers_the_mpi_of_mpi4py(tmp_path, library_line, expected):
    # Another MPI's mpiexec first on PATH (as with the PyPI MPICH wheel next to a
    # system Open MPI) would start the ranks as singletons of the wrong MPI.
    launchers = {"a": _script(tmp_path / "a" / "mpiexec", MPICH_VERSION_TEXT),
                 "b": _script(tmp_path / "b" / "mpiexec", OMPI4_VERSION_TEXT)}
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{library_line}'\n")
    python.chmod(0o755)
    environ = {"PATH": os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])}
    assert launcher.find_mpiexec(environ, python=str(python)) == launchers[expected]
    assert launcher.find_mpiexec(environ) == launchers["a"]  # no interpreter given: PATH order
    environ[launcher.MPIEXEC_ENV] = "/x/mpiexec"  # an explicit choice always wins
    assert launcher.find_mpiexec(environ, python=str(python)) == "/x/mpiexec"


def test_library_flavour():
    assert launcher.library_flavour("Open MPI v5.0.3, package: Open MPI") == OPENMPI
    assert launcher.library_flavour("MPICH Version:      4.1.2") == MPICH
    assert launcher.library_flavour("") is None
    assert launcher.mpi4py_library_flavour("/nonexistent/python") is None


# --- --check-build -----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_check_build_real(capsys):
    assert launcher.main(["--check-build"]) == 0
    out = capsys.readouterr().out
    labels = [line.split(":")[0].strip() for line in out.splitlines()[1:]]
    assert labels == ["MPI flavour", "MPI library", "NCCL", "CUDA runtime", "torch", "tensorflow", "commlib._core"]
    flavour_line = next(line for line in out.splitlines() if "MPI flavour:" in line)
    assert "MPICH (hydra)" in flavour_line or "Open MPI" in flavour_line


@pytest.mark.timeout(120)
def test_check_build_reports_fake_openmpi_and_failures(fake_mpiexec):
    fake_mpiexec(OMPI4_VERSION_TEXT)
    assert "MPI flavour:   Open MPI 4.1.5" in check_build.report()
    assert check_build.framework_status("surely_not_a_module_xyz") == "not installed"
    assert check_build.framework_status("pytest").startswith("installed")


@pytest.mark.timeout(120)
def test_check_build_loads_the_core_as_commlib_does(monkeypatch):
    """The core is loaded after mpi4py (which loads the MPI library it links),
    in a child interpreter; a core that cannot load is reported with the
    loader's last line."""
    assert check_build.core_status().startswith("built (")
    assert check_build._CORE_PROBE.index("commlib._lib") < check_build._CORE_PROBE.index("_core")
    monkeypatch.setattr(check_build, "_CORE_PROBE", "raise ImportError('libmpi.so.12: nope')")
    assert check_build.core_status() == \
        "not built or not loadable (ImportError: libmpi.so.12: nope)"


@pytest.mark.parametrize("hosts", ["h1:2,h2:2", "localhost", "10.0.0.1:4", "[::1]:2", "[fe80::1]",
                                   "node-1.cluster.local:16"])
def test_host_lists_accepted(hosts):
    launcher.check_hosts(hosts)
    assert "-hosts" in build(HYDRA, hosts=hosts)


@pytest.mark.parametrize("hosts, says", [(":::,@@", "':::' is not a host name"),
                                         ("h1:2,,h2", "'' is not a host name"),
                                         ("h1:0", "must be a positive integer"),
                                         ("h1:two", "must be a positive integer"),
                                         ("-oops:2", "is not a host name"),
                                         ("  ", "needs at least one host")])
def test_bad_host_lists_refused_before_launch(hosts, says):
    with pytest.raises(LauncherError, match=says):
        build(HYDRA, hosts=hosts)
    proc = subprocess.run([sys.executable, "-m", "commlib.launch", "-np", "2", f"--hosts={hosts}",
                           "python", "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr, proc


def test_check_build_missing_mpiexec(monkeypatch):
    monkeypatch.setenv("COMMLIB_MPIEXEC", "/nonexistent/mpiexec")
    assert check_build.mpi_launcher_status().startswith("not usable")


# --- the rank wrapper, run without MPI ---------------------------------------------------

def run_wrapper(code, rank="5", extra_env=None, **kw):
    env = {**os.environ, "PMI_RANK": rank, "COMMLIB_FAILURE_GRACE": "0", **(extra_env or {})}
    return subprocess.run([*launcher.rank_wrapper_command(), sys.executable, "-c", code],
                          env=env, capture_output=True, timeout=60, **kw)


def test_get_rank():
    assert _rankwrap.get_rank({"PMI_RANK": "3"}) == "3"
    assert _rankwrap.get_rank({"OMPI_COMM_WORLD_RANK": "4", "PMIX_RANK": "9"}) == "4"
    assert _rankwrap.get_rank({"PMIX_RANK": "9"}) == "9"
    assert _rankwrap.get_rank({}) == "?"


@pytest.mark.timeout(120)
def test_wrapper_prefixes_lines_and_keeps_exit_code(tmp_path):
    code = ("import sys\n"
            "sys.stdout.write('one\\ntw'); sys.stdout.flush(); sys.stdout.write('o\\n')\n"
            "sys.stdout.buffer.write(b'bin \\xff\\x00\\n')\n"
            "sys.stderr.write('err line\\npartial')\n"
            "sys.exit(7)\n")
    out = run_wrapper(code, extra_env={"COMMLIB_RUN_STATUS_DIR": str(tmp_path)})
    assert out.returncode == 7
    assert out.stdout == b"[5]: one\n[5]: two\n[5]: bin \xff\x00\n"
    assert out.stderr == b"[5]: err line\n[5]: partial\ncommlibrun: rank 5 exited with code 7\n"
    assert launcher.read_statuses(str(tmp_path))[5][0] == 7


@pytest.mark.timeout(120)
def test_wrapper_sends_lines_to_the_launcher_socket(tmp_path):
    out_buf, err_buf = io.BytesIO(), io.BytesIO()
    relay = launcher.OutputRelay(str(tmp_path / "output"), stdout=out_buf, stderr=err_buf)
    try:
        code = ("import sys\n"
                "sys.stdout.write('one\\ntw'); sys.stdout.flush(); sys.stdout.write('o\\n')\n"
                "sys.stderr.write('err line\\npartial')\n"
                "sys.exit(7)\n")
        out = run_wrapper(code, extra_env={launcher.OUTPUT_SOCKET_ENV: relay.path})
    finally:
        relay.close()
    assert out.returncode == 7
    assert (out.stdout, out.stderr) == (b"", b"")
    assert out_buf.getvalue() == b"[5]: one\n[5]: two\n"
    assert err_buf.getvalue() == b"[5]: err line\n[5]: partial\ncommlibrun: rank 5 exited with code 7\n"


@pytest.mark.timeout(120)
def test_wrapper_writes_to_its_own_streams_without_the_socket(tmp_path):
    # Ranks on other hosts cannot reach the launcher's socket.
    out = run_wrapper("print('hi')", extra_env={launcher.OUTPUT_SOCKET_ENV: str(tmp_path / "none")})
    assert (out.returncode, out.stdout, out.stderr) == (0, b"[5]: hi\n", b"")


@pytest.mark.timeout(60)
def test_output_relay_prints_whole_lines_only(tmp_path):
    out_buf, err_buf = io.BytesIO(), io.BytesIO()
    relay = launcher.OutputRelay(str(tmp_path / "output"), stdout=out_buf, stderr=err_buf)

    def connect(tag):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(relay.path)
        c.sendall(tag)
        return c

    def wait_for(buf, value):
        deadline = time.monotonic() + 10
        while buf.getvalue() != value and time.monotonic() < deadline:
            time.sleep(0.01)
        assert buf.getvalue() == value

    try:
        a, b, e = connect(_rankwrap.STDOUT_TAG), connect(_rankwrap.STDOUT_TAG), connect(_rankwrap.STDERR_TAG)
        a.sendall(b"[0]: first half ")
        b.sendall(b"[1]: whole\n[1]: unterminated")
        wait_for(out_buf, b"[1]: whole\n")  # rank 0's piece waits for the end of its line
        a.sendall(b"second half\n")
        wait_for(out_buf, b"[1]: whole\n[0]: first half second half\n")
        e.sendall(b"[0]: to stderr\n")
        wait_for(err_buf, b"[0]: to stderr\n")
        for c in (a, b, e):
            c.close()
    finally:
        relay.close()
    assert out_buf.getvalue() == b"[1]: whole\n[0]: first half second half\n[1]: unterminated\n"
    relay.close()  # a second close is harmless


@pytest.mark.timeout(120)
def test_wrapper_reports_signal_death(tmp_path):
    out = run_wrapper("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", rank="1",
                      extra_env={"COMMLIB_RUN_STATUS_DIR": str(tmp_path)})
    assert out.returncode == 128 + signal.SIGKILL
    assert b"commlibrun: rank 1 (pid " in out.stderr and b"was killed by signal SIGKILL" in out.stderr
    assert launcher.read_statuses(str(tmp_path))[1][0] == 137


@pytest.mark.timeout(120)
def test_wrapper_keeps_inherited_fds():
    # Hydra hands the PMI socket down as an inherited descriptor (PMI_FD).
    r, w = os.pipe()
    try:
        out = run_wrapper(f"import os; os.write({w}, b'via fd')", pass_fds=(w,))
        os.close(w)
        w = None
        assert out.returncode == 0, out.stderr
        assert os.read(r, 100) == b"via fd"
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_failure_grace_setting(capsys):
    assert _rankwrap.failure_grace({}) == _rankwrap.DEFAULT_FAILURE_GRACE
    assert _rankwrap.failure_grace({"COMMLIB_FAILURE_GRACE": "0.5"}) == 0.5
    assert _rankwrap.failure_grace({"COMMLIB_FAILURE_GRACE": "-1"}) == _rankwrap.DEFAULT_FAILURE_GRACE
    assert _rankwrap.failure_grace({"COMMLIB_FAILURE_GRACE": "soon"}) == _rankwrap.DEFAULT_FAILURE_GRACE
    assert "ignoring invalid COMMLIB_FAILURE_GRACE='soon'" in capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("child_code, lingers", [(0, False), (4, True)])
def test_wrapper_lingers_only_after_failure(child_code, lingers):
    start = time.monotonic()
    out = run_wrapper(f"import sys; sys.exit({child_code})", extra_env={"COMMLIB_FAILURE_GRACE": "2"})
    elapsed = time.monotonic() - start
    assert out.returncode == child_code
    assert (elapsed >= 2) == lingers, elapsed


def _env_without_grace():
    return {k: v for k, v in os.environ.items() if k != "COMMLIB_FAILURE_GRACE"}


def _start_wrapped_sleeper():
    """Start the wrapper around a child that prints its pid and sleeps; return (wrapper, child pid)."""
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    proc = subprocess.Popen([*launcher.rank_wrapper_command(), sys.executable, "-c", code],
                            env={**_env_without_grace(), "PMI_RANK": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    assert line.startswith(b"[0]: "), line
    return proc, int(line.split()[1])


def _process_gone(pid, timeout):
    """Whether ``pid`` disappears (or becomes a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(120)
def test_wrapper_forwards_sigterm():
    proc, child = _start_wrapped_sleeper()
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # A wrapper that was told to stop does not wait out the failure grace.
    assert time.monotonic() - start < _rankwrap.DEFAULT_FAILURE_GRACE
    assert proc.returncode == 128 + signal.SIGTERM
    assert b"was killed by signal SIGTERM" in err
    assert _process_gone(child, 10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.timeout(120)
def test_child_dies_with_wrapper():
    proc, child = _start_wrapped_sleeper()
    proc.kill()
    proc.communicate(timeout=60)
    assert _process_gone(child, 10)


def test_default_thread_env_divides_cores_among_local_ranks():
    from commlib.launch.launcher import default_thread_env

    assert default_thread_env({}, 2, cpus=8) == {"OMP_NUM_THREADS": "4"}
    assert default_thread_env({}, 3, cpus=2) == {"OMP_NUM_THREADS": "1"}
    assert default_thread_env({"OMP_NUM_THREADS": "7"}, 2, cpus=8) == {}
    assert default_thread_env({}, 4, hosts="a:2,b:2", cpus=8) == {}
    assert default_thread_env({}, 4, hostfile="hosts.txt", cpus=8) == {}


def test_open_mpi_gets_wrapping_integer_reductions_unless_user_chose():
    # Open MPI's AVX op component saturates int8/uint8 sums (ompi#8045).
    assert launcher.flavour_env(OMPI4, {}) == {"OMPI_MCA_op": "^avx"}
    assert launcher.flavour_env(OMPI5, {}) == {"OMPI_MCA_op": "^avx"}
    assert launcher.flavour_env(OMPI4, {"OMPI_MCA_op": "avx"}) == {}
    assert launcher.flavour_env(HYDRA, {}) == {}
    cmd = launcher.build_command(OMPI4, 2, ["python", "t.py"], euid=1000, wrapper=[],
                                 env=launcher.flavour_env(OMPI4, {}))
    assert "-x" in cmd and cmd[cmd.index("-x") + 1] == "OMPI_MCA_op"


def test_job_stopped_when_mpiexec_outlives_a_failed_rank(tmp_path, monkeypatch):
    # A wrapper reported rank 1 failed; the "mpiexec" (a sleep) never ends the job.
    monkeypatch.setattr(launcher, "FAILURE_TEARDOWN_SLACK", 0.5)
    (tmp_path / "rank1").write_text(f"137 {time.time()}")
    job = launcher._Job(None, str(tmp_path), grace=0.5)
    start = time.monotonic()
    returncode = job.run([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    assert time.monotonic() - start < 15
    assert job.torn_down and returncode != 0
    assert launcher.job_exit_code(returncode, launcher.read_statuses(str(tmp_path)))[0] == 137


def test_job_left_alone_without_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "FAILURE_TEARDOWN_SLACK", 0.0)
    (tmp_path / "rank0").write_text(f"0 {time.time() - 100}")  # a rank that finished fine
    job = launcher._Job(None, str(tmp_path), grace=0.0)
    assert job.run([sys.executable, "-c", "import time; time.sleep(1)"], dict(os.environ)) == 0
    assert not job.torn_down


def run_launcher(*argv):
    return subprocess.run([sys.executable, "-m", "commlib.launch", *argv], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("np_", ["0", "-1", "4294967297", "2147483648", "65537"])
def test_bad_rank_counts_refused_before_launch(np_):
    """mpiexec wraps large counts around (4294967297 ran one rank): refused
    here, with exit code 2, before any mpiexec runs."""
    with pytest.raises(LauncherError, match=f"-np {np_}: the number of ranks must be an integer from 1 to"):
        build(HYDRA, np=int(np_))
    proc = run_launcher("-np", np_, "python", "-c", "pass")
    assert proc.returncode == 2 and "must be an integer from 1 to 65536" in proc.stderr, proc


def test_largest_rank_count_accepted():
    assert build(HYDRA, np=65536)[:3] == ["mpiexec", "-n", "65536"]


@pytest.mark.parametrize("hosts", ["h1:4097", "h1:4294967297", "h1:-1"])
def test_host_list_slot_counts_bounded(hosts):
    with pytest.raises(LauncherError, match=r"must be a positive integer \(1 to 4096\)"):
        build(HYDRA, hosts=hosts)


@pytest.mark.parametrize("text, says", [
    ("localhost:0\n", "the slot count '0'"),
    ("localhost:abc\n", "the slot count 'abc'"),
    ("localhost:-1\n", "the slot count '-1'"),
    ("h1:2\nlocalhost:4294967297\n", "line 2 ('localhost:4294967297'): the slot count '4294967297'"),
    ("h1 slots=0\n", "the slot count '0'"),
    ("h1 slots=2 max_slots=x\n", "the slot count 'x'"),
    ("# only a comment\n\n", "no host in it"),
    (":3\n", "no host name"),
])
def test_bad_hostfiles_refused_before_launch(tmp_path, text, says):
    """Hostfile slot counts that kill mpiexec (0, abc: SIGFPE), hang it (-1)
    or wrap around are refused with a clear message and exit code 2."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    with pytest.raises(LauncherError, match=re.escape(says)):
        build(HYDRA, hostfile=str(hostfile))
    proc = run_launcher("-np", "2", "--hostfile", str(hostfile), "python", "-c", "pass")
    assert proc.returncode == 2 and says in proc.stderr, proc


@pytest.mark.parametrize("text", ["localhost:2\n", "# hosts\nh1:2  # two\nh2\n", "h1 slots=4 max_slots=8\n",
                                  "[::1]:2\n"])
def test_good_hostfiles_accepted(tmp_path, text):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    assert build(HYDRA, hostfile=str(hostfile))[3:5] == ["-f", str(hostfile)]


def test_missing_hostfile_refused(tmp_path):
    proc = run_launcher("-np", "2", "--hostfile", str(tmp_path / "none"), "python", "-c", "pass")
    assert proc.returncode == 2 and "cannot read it" in proc.stderr, proc


@pytest.mark.parametrize("cpus,size,blocks", [
    ([0, 1], 2, [[0], [1]]),
    (list(range(8)), 3, [[0, 1], [2, 3], [4, 5]]),   # CPUs // ranks each; the rest unused
    ([2, 5, 7, 9], 2, [[2, 5], [7, 9]]),             # the ids this process may use, in order
    ([0, 1, 2], 1, [[0, 1, 2]]),
    ([0, 1], 3, [None, None, None]),                 # more ranks than CPUs: nobody is pinned
])
def test_core_block_splits_the_cpus_in_local_rank_order(cpus, size, blocks):
    assert [_rankwrap.core_block(cpus, r, size) for r in range(size)] == blocks


@pytest.mark.parametrize("rank,size", [(-1, 2), (2, 2), (0, 0)])
def test_core_block_of_a_place_that_makes_no_sense_is_none(rank, size):
    assert _rankwrap.core_block([0, 1, 2, 3], rank, size) is None


@pytest.mark.parametrize("place", [{"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}])
def test_bind_to_cores_pins_the_ranks_block(monkeypatch, place):
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append((pid, list(cpus))))
    assert _rankwrap.bind_to_cores(place) == [2, 3]
    assert pinned == [(0, [2, 3])]


@pytest.mark.parametrize("environ", [{}, {"MPI_LOCALRANKID": "x", "MPI_LOCALNRANKS": "2"},
                                     {"MPI_LOCALRANKID": "4", "MPI_LOCALNRANKS": "5"}])
def test_bind_to_cores_leaves_an_unknown_or_crowded_place_alone(monkeypatch, environ):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pytest.fail("pinned"))
    assert _rankwrap.bind_to_cores(environ) is None


def test_dry_run_bind_cores_tells_the_wrappers(capsys, fake_mpiexec, monkeypatch):
    fake_mpiexec(MPICH_VERSION_TEXT)
    monkeypatch.delenv("COMMLIB_RUN_BIND_CORES", raising=False)
    cmd = dry_run(capsys, ["-np", "2", "--bind-cores", "python", "t.py"])
    at = cmd.index("COMMLIB_RUN_BIND_CORES")
    assert cmd[at - 1:at + 2] == ["-genv", "COMMLIB_RUN_BIND_CORES", "1"]
    assert "COMMLIB_RUN_BIND_CORES" not in dry_run(capsys, ["-np", "2", "python", "t.py"])
