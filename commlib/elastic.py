"""Elastic training over MPI: restart the whole job from the last commit.

An MPI job cannot re-form after a rank dies, so commlib's elastic mode is
checkpoint-and-restart: ``state.commit()`` writes every rank's state to
``$COMMLIB_ELASTIC_DIR``, ``commlibrun --restarts N`` starts the whole job
again when a rank fails, and ``@run`` loads the newest commit that every rank
finished before calling the training function again. The frontends add the
framework state classes (``commlib.torch.elastic.TorchState``,
``commlib.tensorflow.keras.elastic.KerasState``); this module is
framework-free::

    import numpy as np
    import commlib
    from commlib import elastic

    commlib.init()
    state = elastic.ObjectState(step=0, total=0.0)

    @elastic.run
    def train(state):
        while state.step < 100:
            state.total += float(commlib.allreduce(np.ones(1), op=commlib.Sum)[0])
            state.step += 1
            if state.step % 10 == 0:
                state.commit()

    train(state)

The commit protocol (one directory per rank, ``<dir>/rank<R>/``):

1. every rank writes ``commit-<N>`` atomically: a temporary file, fsync,
   rename, fsync of the directory; the file carries N, the rank, the job size
   and a CRC of its payload;
2. a barrier: once it returns, every rank has commit N on disk, so each rank
   deletes its commits older than N;
3. on (re)start, ranks exchange the commit numbers they hold and load the
   newest number that every rank holds; any newer, incomplete commit is
   deleted. A rank killed at any point (even between its write and the
   barrier) leaves commit N-1 complete on every rank, since no rank deletes
   N-1 before all have written N.

Commits are files a job trusts like any checkpoint (they are unpickled).
``commit()``, like every collective, must be called by all ranks at the same
points.

Guarantees and limits: a rank killed at any moment, during a commit
included, costs at most the steps since the last commit, so with
deterministic data the final state equals an uninterrupted run's. A damaged
file (CRC) or a directory written by a job of another size raises
``ElasticStateError`` on every rank: the number of ranks cannot change.
``sync()`` gives every rank rank 0's state, except sharded state (the shards
of a ``fully_shard`` model, a ZeRO optimizer's state), which each rank
commits and loads as its own part. ``commlibrun --restarts N`` prints each
restart with its cause, keeps one ``--timeout`` for all attempts, sets
``$COMMLIB_RESTART`` (0, 1, ...) in the ranks and, after the last allowed
failure, exits with that failure's code; a timeout or a signal to
``commlibrun`` is not restarted. Without ``$COMMLIB_ELASTIC_DIR`` it uses a
temporary directory removed when the job ends; a directory you set is kept,
and a later job resumes from it. On several hosts it must be shared storage
(or the ranks must land on the same hosts).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import pickle
import re
import zlib
from typing import Any, Callable

from . import ops, runtime
from .errors import CommlibError
from .objects import allgather_object, broadcast_object
from .launch.restarts import ELASTIC_DIR_ENV, RESTART_ENV  # noqa: F401 - RESTART_ENV re-exported
_MAGIC = b"COMMLIB-COMMIT 1\n"
_COMMIT_NAME = re.compile(r"commit-(\d{10})")


class ElasticStateError(CommlibError):
    """A commit cannot be loaded: damaged, or written by a job of another size."""


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either its old content
    or all of ``data``, even if the process is killed or the machine loses
    power: temporary file in the same directory, fsync, rename, fsync of the
    directory."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)


def newest_common(numbers_per_rank: list) -> int | None:
    """The newest commit number that every rank holds, or None."""
    if not numbers_per_rank:
        return None
    common = set(numbers_per_rank[0])
    for numbers in numbers_per_rank[1:]:
        common &= set(numbers)
    return max(common) if common else None


class CommitStore:
    """One rank's commits under ``<directory>/rank<rank>/``."""

    def __init__(self, directory: str, rank: int, size: int):
        self.rank, self.size = rank, size
        self.path = os.path.join(directory, f"rank{rank}")
        os.makedirs(self.path, exist_ok=True)

    def _file(self, number: int) -> str:
        return os.path.join(self.path, f"commit-{number:010d}")

    def numbers(self) -> list:
        """Commit numbers this rank holds, oldest first (temporary files of
        interrupted writes are removed on the way)."""
        found = []
        for name in os.listdir(self.path):
            m = _COMMIT_NAME.fullmatch(name)
            if m:
                found.append(int(m.group(1)))
            elif name.startswith("."):
                _remove(os.path.join(self.path, name))
        return sorted(found)

    def write(self, number: int, payload: bytes) -> None:
        header = {"commit": number, "rank": self.rank, "size": self.size,
                  "bytes": len(payload), "crc32": zlib.crc32(payload)}
        write_atomic(self._file(number),
                     _MAGIC + json.dumps(header).encode() + b"\n" + payload)

    def written_by(self, number: int) -> int | None:
        """The job size recorded in commit ``number``'s header (None if unreadable)."""
        try:
            with open(self._file(number), "rb") as f:
                header = _parse_header(f.readline() + f.readline())[0]
        except OSError:
            return None
        return header.get("size") if header else None

    def load(self, number: int) -> bytes:
        """The payload of commit ``number``, checked against its header."""
        path = self._file(number)
        with open(path, "rb") as f:
            header, payload = _parse_header(f.read())
        if (header is None or header.get("bytes") != len(payload)
                or header.get("crc32") != zlib.crc32(payload) or header.get("commit") != number):
            raise ElasticStateError(f"rank {self.rank}: commit file {path} is damaged")
        if header.get("size") != self.size or header.get("rank") != self.rank:
            raise ElasticStateError(
                f"rank {self.rank}: commit file {path} was written by rank {header.get('rank')} "
                f"of a {header.get('size')}-rank job, this job has {self.size} ranks; "
                f"use a fresh {ELASTIC_DIR_ENV} when the number of ranks changes")
        return payload

    def remove_except(self, keep: int | None, older_only: bool) -> None:
        """Remove commits older than ``keep`` (``older_only``) or all but ``keep``."""
        for number in self.numbers():
            if number != keep and (not older_only or keep is None or number < keep):
                _remove(self._file(number))


def _parse_header(data: bytes) -> tuple:
    """(header dict or None, payload) of a commit file's bytes."""
    head, sep, payload = data[len(_MAGIC):].partition(b"\n")
    if not data.startswith(_MAGIC) or not sep:
        return None, b""
    try:
        header = json.loads(head)
    except ValueError:
        return None, b""
    return (header if isinstance(header, dict) else None), payload


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class State:
    """Training state that can be committed, restored and synchronized.

    ``State(**user_state)`` keeps each keyword as an attribute (e.g.
    ``state.epoch``); subclasses add framework objects through
    ``_snapshot``/``_apply``/``_sync_objects``. ``commit()`` keeps a copy
    in memory and, when ``$COMMLIB_ELASTIC_DIR`` is set, writes it there
    (a collective); ``restore()`` goes back to the last commit in memory;
    ``sync()`` makes every rank take rank 0's state.
    """

    def __init__(self, **user_state):
        self._user_keys = list(user_state)
        for key, value in user_state.items():
            setattr(self, key, value)
        self._reset_callbacks: list = []
        self._commit_number = 0
        self._store = None
        self._saved = None
        self.save()

    # -- framework part (subclasses)
    def _snapshot(self) -> dict:
        return {}

    def _apply(self, snapshot: dict) -> None:
        pass

    def _sync_objects(self, root_rank: int) -> None:
        pass

    def _serialize(self, snapshot: dict) -> bytes:
        return pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)

    def _deserialize(self, data: bytes) -> dict:
        return pickle.loads(data)

    # -- Horovod's State API
    def save(self) -> None:
        """Keep a copy of the current state in memory (restore() returns to it)."""
        self._saved = {"user": copy.deepcopy(self._user_state()), "objects": self._snapshot()}

    def restore(self) -> None:
        """Go back to the state of the last commit (or of the creation)."""
        self._set(self._saved)

    def commit(self) -> None:
        """Save the state; with ``$COMMLIB_ELASTIC_DIR`` set, also write it
        there (every rank must call commit() at the same point)."""
        self.save()
        store = self._commit_store()
        if store is None:
            return
        number = self._commit_number + 1
        store.write(number, self._serialize(self._saved))
        ops.barrier()
        self._commit_number = number
        store.remove_except(number, older_only=True)

    def sync(self, root_rank: int = 0) -> None:
        """Every rank takes rank ``root_rank``'s state."""
        self._sync_objects(root_rank)
        user = broadcast_object(self._user_state(), root_rank, name="elastic.state.user")
        for key, value in user.items():
            setattr(self, key, value)
        self.save()

    def register_reset_callbacks(self, callbacks: list) -> None:
        """Functions called after the state was loaded from a commit on restart."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    # -- persistence
    @property
    def commit_number(self) -> int:
        """Number of the last commit written or loaded (0: none)."""
        return self._commit_number

    def load_last_commit(self) -> bool:
        """Load the newest commit every rank holds (a collective); return
        whether one was found. Newer commits some ranks hold are deleted."""
        store = self._commit_store()
        if store is None:
            return False
        mine = store.numbers()
        held = allgather_object((mine, store.written_by(mine[-1]) if mine else None),
                                name="elastic.commits")
        sizes = {size for _, size in held if size is not None}
        if sizes - {store.size}:
            raise ElasticStateError(
                f"{ELASTIC_DIR_ENV}={os.environ.get(ELASTIC_DIR_ENV)} holds commits of a job of "
                f"{sorted(sizes)} ranks, this job has {store.size}; use a fresh directory "
                "when the number of ranks changes")
        number = newest_common([numbers for numbers, _ in held])
        store.remove_except(number, older_only=False)
        if number is None:
            return False
        self._set(self._deserialize(store.load(number)))
        self._commit_number = number
        self.save()
        return True

    def _commit_store(self) -> CommitStore | None:
        directory = os.environ.get(ELASTIC_DIR_ENV)
        if not directory:
            return None
        if self._store is None:
            self._store = CommitStore(directory, runtime.rank(), runtime.size())
        return self._store

    def _user_state(self) -> dict:
        return {key: getattr(self, key) for key in self._user_keys}

    def _set(self, saved: dict) -> None:
        for key, value in copy.deepcopy(saved["user"]).items():
            setattr(self, key, value)
        self._apply(saved["objects"])


class ObjectState(State):
    """State made of picklable Python objects only (Horovod's ObjectState)."""


def run(func: Callable) -> Callable:
    """Decorator for the training function ``func(state, *args, **kwargs)``.

    Before calling ``func`` it loads the newest complete commit from
    ``$COMMLIB_ELASTIC_DIR`` (if set and one exists; then the state's reset
    callbacks run) and synchronizes the state from rank 0. After a failure,
    ``commlibrun --restarts N`` starts the job again and this resumes from
    that commit. Without a commit directory it syncs and calls ``func``.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any):
        if not isinstance(state, State):
            raise TypeError(f"elastic.run: the first argument must be an elastic State, "
                            f"got {type(state).__name__}")
        loaded = state.load_last_commit()
        state.sync()
        if loaded:
            state.on_reset()
        return func(state, *args, **kwargs)

    return wrapper
