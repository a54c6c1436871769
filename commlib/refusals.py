"""A collective refused on one rank before it was sent, told to the others.

The frontends check a call's arguments before anything is sent (a root
outside the job, an ``out=`` of the wrong shape, a dtype the core cannot
move). When such a check fails on one rank only, the others have submitted
the same call and would wait for it until COMMLIB_TIMEOUT; and an unnamed
call that fails before its name is generated would leave this rank's name
counter one behind, pairing its every later call with the others' previous
one (silently wrong data). So each public collective catches its own
TypeError/ValueError and calls ``refused``, which

- generates the call's name if the call had not yet (every rank's k-th
  unnamed call of a kind stays the others' k-th), and
- sends an abort of that name (``commlib_abort``): the other ranks' calls of
  it fail at once with CollectiveMismatchError naming this rank and the
  reason, and every rank's next call of that name pairs with the others'
  next one (the core pairs aborts call by call, so the same bad call on every
  rank is no trouble).

An exception that others know of already, or need not know of, carries
``commlib_others_told = True``: every error of the core (it told the others
itself, or the others got the same error, or the refusal was this rank's
alone, as a name already in flight), and one ``refused`` has handled
(a blocking form calls its ``_async`` form: only the inner one tells).

A public collective reads ``runtime.generated`` on entry (``mark``) and
passes it here: when no name was generated since, the call had not reached
that point."""
from __future__ import annotations

from . import runtime
from .process_sets import process_set_id
from .submit import abort


def refused(exc: BaseException, kind: str, name, process_set, mark: int, parts=None) -> None:
    """Tells the other ranks that this rank refused collective ``kind``
    ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter";
    named ``name``, or unnamed: None) on ``process_set`` with
    ``exc``, unless they know already (see the module's docstring); then
    marks ``exc`` told. ``parts``: the call's requests when they are not one
    request of ``kind`` named ``name``, as (kind, suffix) pairs: requests
    named ``name + suffix`` (commlib.tensorflow's broadcast_variables: one
    broadcast ``<name>.<i>`` per variable; a CUDA allgather first gathers
    every rank's rows in ``<name>.rows``): each is refused. The caller
    re-raises ``exc``."""
    if getattr(exc, "commlib_others_told", False) or not isinstance(exc, (TypeError, ValueError)):
        return
    try:
        exc.commlib_others_told = True
    except AttributeError:
        return
    try:
        psid = process_set_id(process_set)
        if name is None and runtime.generated != mark:  # (generated already: the last one is this call's)
            name = runtime.last_generated
            if not name.startswith(kind + "."):
                return  # (a name of another kind since: not this call's)
        else:  # (generated now, or a given name checked: one the others cannot have given raises)
            name = runtime.auto_name(kind, name, psid)
        _abort_each(exc, psid, [(k, name + suffix) for k, suffix in (parts if parts is not None else [(kind, "")])])
    except Exception:  # noqa: BLE001 (the refusal is raised in any case; nothing to tell then)
        return


def _abort_each(exc, psid: int, requests) -> None:
    """Sends the abort of each (kind, name) of ``requests`` with ``exc`` as the reason."""
    why = f"{type(exc).__name__}: {exc}"
    for kind, name in requests:
        abort(kind, name, psid, why)


def refused_members(exc: BaseException, kind: str, base: str, submitted: int, count, process_set) -> None:
    """A grouped call of ``count`` requests of ``kind`` named ``<base>.<i>``
    (commlib.torch's grouped allgather and reducescatter, and its grouped
    allreduce of CUDA tensors through NCCL: one request per tensor, the base
    name generated first) refused with ``exc`` after its
    first ``submitted`` requests went out: tells the others of each request
    this rank will not submit (the one that raised only when it did not tell
    them itself), so that none of theirs waits for COMMLIB_TIMEOUT; then
    marks ``exc`` told. ``count`` None: the group's size is unknown (nothing
    to tell)."""
    if not isinstance(exc, (TypeError, ValueError)):
        return
    first = submitted + (1 if getattr(exc, "commlib_others_told", False) else 0)
    try:
        exc.commlib_others_told = True
    except AttributeError:
        return
    if count is None:
        return
    try:
        _abort_each(exc, process_set_id(process_set), [(kind, f"{base}.{i}") for i in range(first, count)])
    except Exception:  # noqa: BLE001 (the refusal is raised in any case)
        return
