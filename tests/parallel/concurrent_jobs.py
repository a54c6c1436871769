"""Jobs that mostly wait (a frozen rank, a timeout) started at once, so
that their waits overlap instead of adding up."""
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

_JOBS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rank-job")


def in_background(run, *args, **kwargs) -> Future:
    """``run(*args, **kwargs)`` (e.g. the ``ranks`` fixture's runner)
    started now on a thread; the future's result is its return value."""
    return _JOBS.submit(run, *args, **kwargs)


def started_together(test_name: str, start, name: str):
    """Fixture ``name`` for the parametrized test ``test_name`` of a module
    whose jobs mostly wait and use little CPU: when the first of its selected
    cases sets up, ``start(request, tmp_dir, **params)`` (which returns
    in_background(...)'s future, or None for a case that will be skipped;
    it may call request.getfixturevalue) starts every selected case's job at
    once; a case's fixture value is (its result, its tmp_dir). Assign the
    result to a module global ``name``."""
    cases = {}

    @pytest.fixture(name=name)
    def job(request, tmp_path_factory):
        if not cases:
            for item in request.session.items:
                if getattr(item, "module", None) is request.module and item.originalname == test_name:
                    tmp = tmp_path_factory.mktemp(name)
                    cases[item.callspec.id] = (start(request, tmp, **item.callspec.params), tmp)
        future, tmp = cases[request.node.callspec.id]
        return (future.result() if future is not None else None), tmp

    return job
