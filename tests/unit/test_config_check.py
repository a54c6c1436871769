"""commlib.config.check: the core's parser for each kind of variable (integer
with bounds, number, 0/1, names), without init; and init() itself refusing a
bad value in a single process (the error of the core, as ValueError)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import commlib.config

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

GOOD = [
    ("COMMLIB_FUSION_THRESHOLD", "0"),
    ("COMMLIB_FUSION_THRESHOLD", "67108864"),
    ("COMMLIB_FUSION_THRESHOLD", "9223372036854775807"),
    ("COMMLIB_FUSION_THRESHOLD", "+512"),
    ("COMMLIB_SHM_PIECE_BYTES", "4096"),
    ("COMMLIB_P2P_EAGER_BYTES", "1073741824"),
    ("COMMLIB_TEST_RANKS_PER_HOST", "2"),
    ("COMMLIB_TEST_MPI_CALL_BYTES", "8"),
    ("COMMLIB_TEST_MPI_CALL_BYTES", "1073741824"),
    ("COMMLIB_CYCLE_TIME", "0"),
    ("COMMLIB_CYCLE_TIME", "0.25"),
    ("COMMLIB_CYCLE_TIME", "5"),
    ("COMMLIB_CYCLE_TIME", "1e3"),
    ("COMMLIB_CYCLE_TIME", "1e-400"),  # (underflows to 0)
    ("COMMLIB_SHM", "0"),
    ("COMMLIB_SHM", "1"),
    ("COMMLIB_P2P_SINGLE_COPY", "0"),
    ("COMMLIB_STALL_CHECK_TIME", "1"),
    ("COMMLIB_SPIN_US", "0"),
    ("COMMLIB_CACHE_CAPACITY", "100000"),  # more than the log's bits: clamped, as before
    ("COMMLIB_ALLREDUCE_ALGO", "auto"),
    ("COMMLIB_ALLREDUCE_ALGO", "shm"),
    ("COMMLIB_ALLREDUCE_ALGO", "ring"),
    ("COMMLIB_ALLREDUCE_ALGO", "tree"),
    ("COMMLIB_ALLREDUCE_ALGO", "mpi"),
    ("COMMLIB_SHM_COLLECTIVES", "always"),
    ("COMMLIB_SHM_COLLECTIVES", "never"),
    ("COMMLIB_FUSION_THRESHOLD", ""),  # empty: unset, the default
]

BAD = [
    ("COMMLIB_FUSION_THRESHOLD", "abc", "not an integer"),
    ("COMMLIB_FUSION_THRESHOLD", "12abc", "not an integer"),
    ("COMMLIB_FUSION_THRESHOLD", "64 ", "not an integer"),
    ("COMMLIB_FUSION_THRESHOLD", "1.5", "not an integer"),
    ("COMMLIB_FUSION_THRESHOLD", "-1", "out of range"),
    ("COMMLIB_FUSION_THRESHOLD", "99999999999999999999", "out of range"),
    ("COMMLIB_SHM_PIECE_BYTES", "4095", "out of range (integer 4096 to"),
    ("COMMLIB_SHM_FUSION_BYTES", "134217729", "out of range (integer 0 to 134217728)"),
    ("COMMLIB_P2P_EAGER_BYTES", "1073741825", "out of range"),
    ("COMMLIB_TEST_RANKS_PER_HOST", "-2", "out of range"),
    ("COMMLIB_TEST_MPI_CALL_BYTES", "7", "out of range (integer 8 to 1073741824)"),
    ("COMMLIB_TEST_MPI_CALL_BYTES", "1073741825", "out of range"),
    ("COMMLIB_SPIN_US", "fast", "not an integer"),
    ("COMMLIB_RESULT_CACHE_BYTES", "1G", "not an integer"),
    ("COMMLIB_CYCLE_TIME", "x", "not a number"),
    ("COMMLIB_CYCLE_TIME", "1ms", "not a number"),
    ("COMMLIB_CYCLE_TIME", "-0.5", "out of range"),
    ("COMMLIB_CYCLE_TIME", "nan", "not a finite number"),
    ("COMMLIB_CYCLE_TIME", "1e400", "not a finite number"),
    ("COMMLIB_CYCLE_TIME", "inf", "not a finite number"),
    ("COMMLIB_CYCLE_TIME", "1e300", "out of range"),
    ("COMMLIB_SHM", "2", "not 0 or 1"),
    ("COMMLIB_SHM", "yes", "not 0 or 1"),
    ("COMMLIB_P2P_SINGLE_COPY", "true", "not 0 or 1"),
    ("COMMLIB_ALLREDUCE_ALGO", "bogus", "not one of auto, shm, ring, tree, mpi"),
    ("COMMLIB_ALLREDUCE_ALGO", "Ring", "not one of"),
    ("COMMLIB_ALLREDUCE_ALGO", "ring ", "not one of"),
    ("COMMLIB_SHM_COLLECTIVES", "sometimes", "not one of auto, always, never"),
]


@pytest.mark.parametrize("name,value", GOOD)
def test_good_values_pass(name, value):
    assert commlib.config.check(name, value) is None


@pytest.mark.parametrize("name,value,reason", BAD)
def test_bad_values_name_variable_and_value(name, value, reason):
    with pytest.raises(ValueError) as info:
        commlib.config.check(name, value)
    message = str(info.value)
    assert message.startswith(f"{name}={value!r}: "), message
    assert reason in message, message


def test_unknown_variable():
    with pytest.raises(ValueError, match="COMMLIB_NO_SUCH: not a commlib configuration variable"):
        commlib.config.check("COMMLIB_NO_SUCH", "1")


def test_check_environ():
    commlib.config.check_environ({"COMMLIB_SHM": "0", "PATH": "/bin", "COMMLIB_OTHER": "x"})
    with pytest.raises(ValueError, match="COMMLIB_SPIN_US='-1'"):
        commlib.config.check_environ({"COMMLIB_SPIN_US": "-1"})


def run_init(env_extra):
    code = textwrap.dedent("""
        import commlib
        try:
            commlib.init()
        except ValueError as e:
            print("rejected:", e)
        else:
            print("started", commlib.size())
            commlib.shutdown()
    """)
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, cwd=str(REPO))
    return proc.stdout + proc.stderr


def test_init_rejects_bad_value_then_accepts_good():
    out = run_init({"COMMLIB_FUSION_THRESHOLD": "abc"})
    assert "rejected: COMMLIB_FUSION_THRESHOLD='abc': not an integer" in out, out
    out = run_init({"COMMLIB_FUSION_THRESHOLD": "1024", "COMMLIB_CYCLE_TIME": "0.5",
                    "COMMLIB_SHM_COLLECTIVES": "never"})
    assert "started 1" in out, out


def test_misspelt_names_are_those_like_a_variable_commlib_reads():
    env = {"COMMLIB_FUSION_THRESHOL": "1", "COMMLIB_FUSION_THRESHOLD_MB": "64", "COMMLIB_TIMEOUT": "5",
           "COMMLIB_MPIEXE": "mpiexec", "COMMLIB_GPU_EMULATOR_DELAY_US": "3", "PATH": "/bin",
           "COMMLIB_RUN_BIND_CORES": "1", "COMMLIB_A": "1", "COMMLIB_SUM": "2"}  # (short: unlike any)
    assert commlib.config.misspelt(env) == {"COMMLIB_FUSION_THRESHOL": "COMMLIB_FUSION_THRESHOLD",
                                           "COMMLIB_FUSION_THRESHOLD_MB": "COMMLIB_FUSION_THRESHOLD",
                                           "COMMLIB_MPIEXE": "COMMLIB_MPIEXEC"}


def test_init_warns_of_a_misspelt_variable_once():
    out = run_init({"COMMLIB_TIMEOUTT": "3", "PYTHONWARNINGS": "default"})
    assert "started 1" in out, out
    assert out.count("COMMLIB_TIMEOUTT is set, but commlib reads no such variable "
                     "(did you mean COMMLIB_TIMEOUT?)") == 1, out
    assert "reads no such variable" not in run_init({"PYTHONWARNINGS": "default"})
