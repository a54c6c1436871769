"""memory_report: the bytes this rank holds for a model and its optimizer.

    report = hvd.memory_report(model, optimizer)
    # {'parameters': ..., 'gradients': ..., 'optimizer_state': ..., 'total': ...}

Each tensor's storage is counted once (views of one flat buffer, as ZeRO's
parameters and stage-1 gradients are, count as the buffer, padding
included). Works for any torch optimizer; a ZeRO DistributedOptimizer
reports its shard gradients and shard state.
"""
from __future__ import annotations

import torch


def _bytes(tensors, seen: set) -> int:
    total = 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        if t.is_sparse:
            total += _bytes([t._indices(), t._values()], seen)
            continue
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in seen or st.nbytes() == 0:
            continue
        seen.add(key)
        total += st.nbytes()
    return total


def _state_tensors(states) -> list:
    """The tensors of ``states``: one optimizer state dict per parameter."""
    return [v for st in states for v in st.values() if torch.is_tensor(v)]


def memory_report(model, optimizer=None) -> dict:
    """Bytes this rank holds in ``model``'s parameters, in gradients and in
    ``optimizer``'s state, and their total."""
    seen: set = set()
    params = list(model.parameters())
    report = {"parameters": _bytes(params, seen)}
    grads = [p.grad for p in params]
    state = []
    if optimizer is not None:
        buckets = getattr(optimizer, "zero_buckets", None)
        if buckets is not None:  # ZeRO: shard gradients and the shard optimizer's state
            # (stage 1's flat gradient stays allocated while p.grad is None)
            # (stage 2's shard gradient buffer too)
            grads += [t for b in buckets for t in (b.shard.grad, b.grad_flat,
                                                   getattr(b, "grad_shard", None))]
            state = _state_tensors(optimizer.shard_states())
        else:
            grads += [p.grad for g in optimizer.param_groups for p in g["params"]]
            state = _state_tensors(optimizer.state.values())
    report["gradients"] = _bytes(grads, seen)
    report["optimizer_state"] = _bytes(state, seen)
    report["total"] = sum(report.values())
    return report
