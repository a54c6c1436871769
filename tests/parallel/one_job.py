"""Several workers of one test module in one job per rank count
(workers/in_one_job.py): the framework starts once on each rank for all of
them, which roughly halves such a module's time."""
import pytest


def scripts_in_one_job(*scripts: str, timeout: float):
    """A module fixture ``one_job``: ``one_job(n)`` is the RankRun of
    ``scripts`` run one after the other in one job of n ranks, run the first
    time a test asks for n. Tests check their script with
    ``run.assert_script_ok(script, n)`` (the script as given, with its
    ``:ARGS`` if any); a script that fails ends the job, so the tests of the
    scripts after it fail too. The scripts must not depend on a fresh
    process: a process set one adds stays for the next, so does a counter
    of names. Assign the result to a module global named ``one_job``."""

    @pytest.fixture(scope="module", name="one_job")
    def fixture(ranks):
        runs = {}

        def run(n: int):
            if n not in runs:
                runs[n] = ranks(n, "in_one_job.py", *scripts, timeout=timeout)
            return runs[n]

        return run

    return fixture
