"""commlib's errors as TensorFlow's: a collective of commlib.tensorflow that
fails raises an exception that is both commlib's class and the
``tf.errors`` class Horovod raises for that case, eagerly and from graph
execution (``tf.function``, Keras' compiled steps, TF1 sessions) alike, so
that ``except hvd.CollectiveMismatchError`` and ``except
tf.errors.FailedPreconditionError`` both catch a disagreement across ranks:

=========================  ===================================  ==========================
commlib's class            also                                 why
=========================  ===================================  ==========================
CollectiveMismatchError    tf.errors.FailedPreconditionError    Horovod's status for ranks
                                                                that disagree
CollectiveTimeoutError     tf.errors.DeadlineExceededError      TF's class for a deadline
RankLostError              tf.errors.AbortedError               Horovod's status once the
                                                                job's communication ended
NotInitializedError        tf.errors.FailedPreconditionError    TF's class for an
                                                                uninitialised state
ScalarTensorError          tf.errors.InvalidArgumentError       a bad argument
CommlibError (any other)   tf.errors.UnknownError               Horovod's unknown error
=========================  ===================================  ==========================

The classes below (one per row, named as commlib's) derive from both; the
original commlib exception is their ``commlib_error`` (and, where TensorFlow
does not drop it on the way, their ``__cause__``).

In a graph a collective runs as a ``tf.numpy_function``, and TensorFlow turns
any Python exception raised there into ``UnknownError``. The op therefore
leaves the exception here under a token written into its message, and
``install()`` wraps the two places where graph execution hands its error to
the caller (``Context.call_function`` for tf.function, ``BaseSession._do_call``
for TF1 sessions) to replace an error carrying a token by its class above.
"""
from __future__ import annotations

import collections
import itertools
import re

import tensorflow as tf

from commlib import errors as _errors


class _Both:
    """The original commlib error as ``commlib_error`` (rebuilt from the
    message where TensorFlow made a new exception, as AutoGraph does for
    errors raised while tracing)."""

    @property
    def commlib_error(self):
        original = self.__dict__.get("_commlib_error")
        if original is None:
            base = next(c for c in type(self).__mro__ if c in _TF_CLASSES)
            original = self.__dict__["_commlib_error"] = base(self.message)
        return original


class CollectiveMismatchError(_Both, tf.errors.FailedPreconditionError,
                              _errors.CollectiveMismatchError):
    """Ranks disagreed on a collective (see commlib.CollectiveMismatchError)."""


class CollectiveTimeoutError(_Both, tf.errors.DeadlineExceededError, _errors.CollectiveTimeoutError):
    """A collective timed out (see commlib.CollectiveTimeoutError)."""


class RankLostError(_Both, tf.errors.AbortedError, _errors.RankLostError):
    """A rank of the job died (see commlib.RankLostError)."""


class NotInitializedError(_Both, tf.errors.FailedPreconditionError, _errors.NotInitializedError):
    """commlib is not (or no longer) initialised (see commlib.NotInitializedError)."""


class ScalarTensorError(_Both, tf.errors.InvalidArgumentError, _errors.ScalarTensorError):
    """A 0-d tensor to a collective along dimension 0 (see commlib.ScalarTensorError)."""


class CommlibError(_Both, tf.errors.UnknownError, _errors.CommlibError):
    """Any other failure of commlib's (see commlib.CommlibError)."""


# most specific first: the first base of an exception's class found here wins
_TF_CLASSES = {
    _errors.CollectiveMismatchError: CollectiveMismatchError,
    _errors.CollectiveTimeoutError: CollectiveTimeoutError,
    _errors.RankLostError: RankLostError,
    _errors.NotInitializedError: NotInitializedError,
    _errors.ScalarTensorError: ScalarTensorError,
    _errors.CommlibError: CommlibError,
}


def as_tf_error(exc: BaseException, message: str | None = None):
    """``exc`` (a commlib error) as the class above that matches it (``exc``
    itself when it already is a tf.errors.OpError or not commlib's)."""
    if isinstance(exc, tf.errors.OpError) or not isinstance(exc, _errors.CommlibError):
        return exc
    cls = next(_TF_CLASSES[c] for c in type(exc).__mro__ if c in _TF_CLASSES)
    out = cls(None, None, str(exc) if message is None else message)
    out.__cause__ = out._commlib_error = exc
    return out


# ------------------------------------------------------------ graph execution

# Errors raised inside graph ops, until the caller's side picks them up (a
# few kept: an error no caller translates, e.g. in a thread of its own, must
# not be kept forever).
_pending: "collections.OrderedDict[int, BaseException]" = collections.OrderedDict()
_tokens = itertools.count(1)
_KEEP = 64
_TOKEN = re.compile(r" \[commlib error #(\d+)\]")
_TAGS = re.compile(r"\{\{[A-Za-z0-9_.][^{} ]* [^{} ]+\}\}")  # {{node X}}, {{function_node F}}


def tagged(exc: BaseException) -> BaseException:
    """What a graph op raises for ``exc``: ``exc``'s class with the token
    under which ``exc`` waits here written into its message (TensorFlow keeps
    only the message)."""
    token = next(_tokens)
    _pending[token] = exc
    while len(_pending) > _KEEP:
        _pending.popitem(last=False)
    try:
        return type(exc)(f"{exc} [commlib error #{token}]")
    except Exception:  # pragma: no cover - a class with another constructor
        return RuntimeError(f"{type(exc).__name__}: {exc} [commlib error #{token}]")


def from_graph(err):
    """The error to raise for the tf.errors.OpError ``err`` of a graph
    execution: its class above if a commlib op raised it, else None."""
    m = _TOKEN.search(err.message or "")
    exc = _pending.pop(int(m.group(1)), None) if m else None
    if exc is None:
        return None
    # commlib's message, then the node tags from which TensorFlow adds where
    # the op was defined ("Graph execution error: Detected at node ...")
    tags = "".join(dict.fromkeys(_TAGS.findall(err.message)))
    return as_tf_error(exc, f"{exc}\n\t [[{tags}]]" if tags else str(exc))


def _translating(call):
    def wrapper(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except tf.errors.OpError as err:
            mapped = from_graph(err)
            if mapped is None:
                raise
            raise mapped from mapped.__cause__

    wrapper.__wrapped__ = call
    wrapper.__name__ = getattr(call, "__name__", "wrapper")
    wrapper._commlib_translating = True
    return wrapper


def install() -> bool:
    """Wraps graph execution's error paths (once); False where TensorFlow's
    internals moved (graph errors then stay UnknownError naming the commlib
    error, as TensorFlow makes them)."""
    try:
        from tensorflow.python.client import session
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - internal modules moved
        return False
    done = True
    for owner, attr in ((context.Context, "call_function"), (session.BaseSession, "_do_call")):
        call = getattr(owner, attr, None)
        if call is None:  # pragma: no cover - internal API moved
            done = False
        elif not getattr(call, "_commlib_translating", False):
            setattr(owner, attr, _translating(call))
    return done


INSTALLED = install()
