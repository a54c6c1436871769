"""``commlib.torch.DistributedOptimizer``: wraps a torch optimizer in the
synchronous DistributedOptimizerBase (optimizer.py) or, with staleness=1, in
the delayed-averaging one (delayed.py) or, with zero_stage=1|2, in the
sharded one (zero.py: ZeroMixin before DistributedOptimizerBase)."""
from __future__ import annotations

import torch

from commlib.checks import compressor
from commlib.delayed import check_weight_prediction
from commlib.grouping import resolve_groups
from commlib.process_sets import check_process_set, included

from commlib.reduce_args import resolve_op

from . import adasum_optimizer, powersgd
from ..sharding import zero
from ..collectives.compression import Compression
from .delayed import delayed_optimizer
from ..mpi_ops import Adasum, Average, global_process_set
from .optimizer import DistributedOptimizerBase, share_state


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, staleness=0, zero_stage=0,
                         bucket_elements=None, weight_prediction=False):
    """Wraps a torch optimizer so that ``step()`` applies gradients averaged
    (``op=Average``) or summed (``op=Sum``) over all ranks (of ``process_set``).

    Arguments (as in horovod.torch):
        optimizer: the torch.optim.Optimizer to wrap.
        named_parameters: (name, parameter) pairs, usually
            ``model.named_parameters()``; names identify the allreduces (and
            appear in error messages). Default: generated names.
        compression: Compression.none, Compression.fp16, Compression.bf16 or
            Compression.powersgd(rank=2, ...) (low-rank compression with error
            feedback of all gradients together; see commlib.torch.optim.powersgd).
        backward_passes_per_step: backward passes accumulated locally before
            the gradients are exchanged (gradient accumulation).
        op: Average (default), Sum or Adasum: each rank steps with its own
            gradients and the parameter updates are combined by Adasum
            (see commlib.torch.optim.adasum_optimizer; the learning rate is not
            scaled by the number of ranks).
        gradient_predivide_factor: with Average, gradients are divided by this
            factor before the sum and by size/factor after it.
        num_groups: deprecated alias of an integer ``groups``.
        groups: an int (split the parameters into that many groups) or a list
            of lists of parameters; a group's allreduces start together, when
            all of its gradients are ready, so they are fused.
        sparse_as_dense: reduce sparse gradients as dense tensors (otherwise
            they are gathered as indices and values).
        process_set: a registered ProcessSet (default global_process_set):
            gradients are averaged over its members only (Average divides by
            the set's size). Every rank may build the optimizer; on ranks
            outside the set it does not communicate (local gradients).
        staleness: 0 (default) synchronous; 1 one-step delayed averaging,
            where ``step()`` applies the previous step's averaged gradients
            while this step's travel (see below).
        weight_prediction: with staleness=1, compute the gradients at the
            predicted weights p + (p - p_prev) that they will be applied to
            (opt-in; see commlib.torch.optim.weight_prediction).
        zero_stage: 0 (default: every rank keeps the whole optimizer state),
            1 (optimizer state sharded across the set's ranks) or 2 (also
            the gradients); see commlib.torch.sharding.zero. Non-members of the set
            get the unsharded optimizer.
        bucket_elements: with zero_stage > 0, the largest flat bucket of
            parameters, in elements (default 2**23).

    On every rank (of the set) the same parameters (names, shapes, dtypes) and
    options are required: construction checks this with one small allgather and raises
    commlib.CollectiveMismatchError naming the differences. Parameters may be
    CPU or CUDA tensors (CUDA ones go through NCCL, or are staged through
    host memory without it) of a supported dtype (TypeError otherwise).

    Behaviour (synchronous, ``staleness=0``):
        A hook on every parameter starts its gradient's allreduce as soon as
        backward has produced it, so communication overlaps the rest of
        backward; ``step()`` waits for the results and steps the wrapped
        optimizer. Parameters without a gradient on a rank count as zeros
        there, so unused parameters never deadlock. ``synchronize()`` waits
        for the averaged gradients without stepping (to clip them); then step
        inside ``with opt.skip_synchronize(): opt.step()``. Sparse gradients
        (``nn.Embedding(sparse=True)``) are allgathered as indices and values,
        or with ``sparse_as_dense=True`` reduced dense and handed back sparse
        (the rows any rank touched), so ``torch.optim.SparseAdam`` trains
        either way. ``commlib.DistributedOptimizer(opt, ...)`` dispatches here
        for torch optimizers. Pair it with ``broadcast_parameters`` and
        ``broadcast_optimizer_state`` (which first gives an optimizer without
        state Horovod's zero-gradient step) so every rank starts equal.

    ``op=Adasum`` (Horovod's delta optimizer): every rank steps the wrapped
        optimizer with its own gradients and the parameter updates are
        combined, ``p = p_old + adasum(p_new - p_old)``; optimizer state stays
        each rank's own. Not with staleness, zero_stage, weight_prediction,
        gradient_predivide_factor or PowerSGD (ValueError). Do not scale the
        learning rate by ``size()``.

    ``compression=Compression.powersgd(rank, start_step, ...)``: after
        ``start_step`` plain steps, each gradient whose 2-D view shrinks at
        least ``min_compression_rate`` times travels as two rank-``rank``
        factors (P orthogonalized between two allreduces), the others
        uncompressed with P; each rank adds its error to the next gradient
        (``error_feedback``) and starts Q from the last step's
        (``warm_start``). ``state_dict()`` carries its state. Not with
        staleness=1, zero_stage, groups, ops other than Average/Sum, or sparse
        gradients without sparse_as_dense (ValueError).

    ``staleness=1`` (delayed averaging): step t starts one grouped allreduce of
        its gradients, progressed in the background during the next forward
        and backward, and applies step t-1's average with the wrapped
        optimizer's rule; step 0 applies nothing. ``synchronize()`` applies
        the pending average (call it before evaluating, saving or loading).
        No gradient copy: after ``step()`` ``p.grad`` holds the applied
        average (None after a step that applied nothing).
        ``compression=Compression.fp16`` makes the gradients travel and wait
        as float16. Replicas stay identical. With ``weight_prediction=True``
        the model holds the predicted weights p + (p - p_prev) between steps
        and the true ones are kept aside (``synchronize()`` puts them back;
        two parameter-sized buffers). Op Average or Sum only; not with groups
        or ``skip_synchronize`` (clip the local gradients before ``step()``
        instead). A rank lost while an average is in flight makes the next
        ``step()`` and ``synchronize()`` raise RankLostError; a partial
        average is never applied.

    ``zero_stage=1|2`` (ZeRO): parameters move into flat buckets (one dtype
        and param group each, at most ``bucket_elements``) split into equal
        padded shards; each rank keeps optimizer state for its shard only
        (a shard-sized optimizer of the same class; hyperparameters copied
        from ``param_groups`` every step, so LR schedulers work). Gradients
        are reduce-scattered bucket by bucket during backward, read where
        autograd left them; after the step each bucket's shards are gathered
        in place into every rank's parameters. Stage 1 keeps full
        gradients: after ``step()`` alone ``p.grad`` is this rank's own
        (local) gradient; ``synchronize()`` also gathers the averaged one into
        every ``p.grad``, so ``clip_grad_norm_`` works as usual (then step in
        ``skip_synchronize()``). Stage 2 drops ``p.grad`` at the end of
        ``step()``: clip with ``opt.clip_grad_norm_(max_norm)`` after
        ``synchronize()``. Element-wise optimizers only (SGD, Adam, AdamW,
        RMSprop, Adagrad, ...; not LAMB, Adafactor, LBFGS); a parameter with
        no gradient on any rank takes a zero gradient. ``opt.state[p]`` holds
        the state of the elements this rank owns (``opt.owned_elements(p)``);
        ``opt.state_dict()`` is this rank's shard. Checkpoints at any world
        size, stage or bucket size: ``save_sharded(dir, model, opt)``,
        ``load_sharded(dir, model, opt)``; ``full_state_dict(model, opt)``
        gathers an ordinary torch state dict, which ``load_state_dict`` of a
        ZeRO optimizer at any size accepts. ``memory_report(model, opt)``
        gives the bytes held per rank. Not with compression or groups. For
        stage 3 (parameters sharded too) see ``commlib.torch.fully_shard``.
    """
    process_set = check_process_set(process_set, member=False)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, DistributedOptimizerBase):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    groups = resolve_groups(num_groups, groups)
    powersgd_config = powersgd.as_config(compression)
    if powersgd_config is not None:
        powersgd.check_options(staleness, zero_stage, bucket_elements, groups)
        compression = powersgd_config
    else:
        compressor(compression)
    dist_args = (named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set)
    base = optimizer.__class__
    if resolve_op(op) == Adasum:
        if powersgd_config is not None:
            raise ValueError("Compression.powersgd cannot be combined with op=Adasum")
        adasum_optimizer.check_arguments(staleness=staleness != 0, zero_stage=zero_stage != 0,
                                         bucket_elements=bucket_elements is not None,
                                         weight_prediction=weight_prediction is not False,
                                         gradient_predivide_factor=gradient_predivide_factor != 1.0)
        cls = _wrapper_class(base, adasum_optimizer.AdasumOptimizerBase, module=adasum_optimizer)
        return share_state(cls, optimizer, dist_args)
    if staleness != 0 and zero_stage != 0:
        raise ValueError("staleness=1 and zero_stage cannot be combined")
    check_weight_prediction(weight_prediction, staleness)
    if staleness != 0:
        if groups is not None:
            raise ValueError("groups cannot be combined with staleness=1 (its step() sends all "
                             "gradients in one group)")
        return delayed_optimizer(optimizer, staleness, dist_args, weight_prediction)
    if powersgd_config is not None:
        cls = _wrapper_class(base, powersgd.PowerSGDOptimizer, module=powersgd)
        return powersgd.make_powersgd(cls, optimizer, powersgd_config, dist_args)
    if zero_stage != 0 or bucket_elements is not None:
        bucket_elements = zero.check_arguments(zero_stage, bucket_elements, compression, groups)
        if included(process_set):
            cls = _wrapper_class(base, zero.ZeroMixin, DistributedOptimizerBase, module=zero)
            return zero.make_zero(cls, base, optimizer, zero_stage, bucket_elements, dist_args)
    cls = _wrapper_class(base, DistributedOptimizerBase)
    return share_state(cls, optimizer, dist_args)


def _wrapper_class(base, *mixins, module=None):
    """A class named as ``base`` that puts ``mixins`` before it (the wrapper
    an optimizer of class ``base`` becomes), attributed to ``module``."""
    return type(base.__name__, (*mixins, base),
                {"__module__": module.__name__ if module else __name__, "__doc__": base.__doc__})

