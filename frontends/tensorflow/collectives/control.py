"""barrier, join, and the topology (sizes, ranks, set membership) as tf ops."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib
from commlib.process_sets import check_process_set, included, process_set_by_id, set_size

from ..execution import collective_call, execute
from .raw import barrier_raw as _barrier_raw

def barrier(process_set=None):
    """Returns once every rank (of ``process_set``) has reached it (eagerly:
    when called; in a graph: when the returned op runs)."""
    with collective_call(None):
        process_set = check_process_set(process_set)
        if tf.executing_eagerly():
            commlib.barrier(process_set=process_set)
            return None
        return _barrier_raw(process_set).op


def join():
    """This rank has no more collectives to submit; until every rank has
    joined it takes part in the others' (zeros to reductions, no rows to
    gathers: see ``commlib.join``). Returns the rank that joined last, as an
    int32 tensor (eagerly: at once; in a graph: when the op runs)."""
    if tf.executing_eagerly():
        with collective_call(None):
            return tf.constant(commlib.join(), dtype=tf.int32)

    def fn(_cname):
        return [np.array(commlib.join(), dtype=np.int32)]

    (y,) = execute(fn, [], [tf.int32], "CommlibJoin", process_set=None)
    return y


def size_op(process_set_id=0, name=None):
    """The number of ranks of the process set with this id (0: the job)."""
    return tf.constant(set_size(process_set_by_id(process_set_id)), dtype=tf.int32,
                       name=name)


def local_size_op(name=None):
    return tf.constant(commlib.local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(commlib.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(commlib.local_rank(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank belongs to the process set with this id, else 0."""
    ps = process_set_by_id(process_set_id)
    return tf.constant(1 if included(ps) else 0, dtype=tf.int32, name=name)
