"""memory_report for Keras: the bytes this rank holds for a model and its
optimizer, with the field names of commlib.torch.memory_report.

    report = hvd.memory_report(model, optimizer)
    # {'parameters': ..., 'gradients': ..., 'optimizer_state': ..., 'total': ...}

- parameters: the model's variables (trainable or not), plus a ZeRO
  optimizer's shard copies of them and weight prediction's copy of the
  true weights;
- gradients: TensorFlow keeps no gradient between steps, so this is the
  averaged gradient a step materialises on this rank: every trainable
  variable's for a plain optimizer, this rank's shards only for ZeRO
  (stages 1 and 2 both reduce-scatter); plus gradient accumulators (backward_passes_per_step) that
  live in the optimizer. The tape's local gradients exist transiently in
  full in every case and are not counted;
- optimizer_state: the optimizer's variables (slots, iteration, learning
  rate); for ZeRO those of its shard optimizer too; for LocalSGD its
  counters, anchor and outer optimizer.
"""
from __future__ import annotations

import numpy as np


def _nbytes(variables) -> int:
    # (a Keras variable's dtype is a string, a tf.Variable's a tf.DType)
    return sum(int(np.prod(v.shape, dtype=np.int64))
               * np.dtype(getattr(v.dtype, "name", str(v.dtype))).itemsize for v in variables)


def _accumulators(optimizer) -> list:
    return list(getattr(optimizer, "commlib_accumulators", None) or [])


def memory_report(model, optimizer=None) -> dict:
    """Bytes this rank holds in ``model``'s variables, in averaged gradients
    and in ``optimizer``'s state (built optimizers only), and their total."""
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    params = _nbytes(model.variables)
    grads = _nbytes(model.trainable_variables)
    state = 0
    if optimizer is not None and getattr(optimizer, "built", False):
        state = _nbytes(optimizer.variables)  # (commlib's own state is not in it)
        extra = getattr(optimizer, "commlib_state_variables", None)  # (LocalSGD's, PowerSGD's)
        if extra is not None:
            state += _nbytes(extra())
        grads_extra = _nbytes(_accumulators(optimizer))
        prediction = getattr(optimizer, "commlib_prediction", None)
        if prediction is not None:
            params += _nbytes(prediction.variables)
        shards = getattr(optimizer, "zero_shards", None)
        if shards is not None:
            params += _nbytes(shards)
            state += _nbytes(optimizer.zero_shard_optimizer.variables)
            grads = _nbytes(shards)
        grads += grads_extra
    report = {"parameters": params, "gradients": grads, "optimizer_state": state}
    report["total"] = sum(report.values())
    return report
