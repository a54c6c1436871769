"""The Keras ``DistributedOptimizer(..., compression=Compression.powersgd(...))``:
gradients go through the PowerSGD rule (commlib.tensorflow.powersgd) instead
of the plain grouped allreduce; ``backward_passes_per_step`` (the
accumulated gradients are compressed at each update), ``local_layers``,
process sets and ``gradient_predivide_factor`` work as without it.

The rule's state (exchange step, error buffers, Q) is TensorFlow variables of
the optimizer's own, outside ``optimizer.variables`` (so broadcasts and
LocalSGD-style copies see the wrapped optimizer's state only), created when
the optimizer is built. Keras checkpoints carry it: ``model.save`` /
``save_weights`` store it after the wrapped optimizer's variables (keys
``commlib_powersgd_<i>``) and ``load_weights`` into a built PowerSGD
optimizer restores it, so a restart continues exactly; ``elastic.KerasState``
commits it. ``hvd.load_model`` of a ``.keras`` file saved so rebuilds the
PowerSGD optimizer from the saved configuration and restores all of it
(given another PowerSGD configuration it raises ValueError; given another
compressor it keeps the wrapped optimizer's state only, with a warning). A
plain optimizer does not load such a checkpoint's optimizer state (Keras
skips it: the variable counts differ).
"""
from __future__ import annotations

import warnings

import numpy as np

from ..gradient_tape import var_key
from .optimizer_base import DistributedOptimizerMixin

KEY_PREFIX = "commlib_powersgd_"
CONFIG_KEY = KEY_PREFIX + "config"  # repr(config) as uint8


def _position(key: str) -> int:
    return int(key[len(KEY_PREFIX):])


class PowerSGDOptimizerMixin(DistributedOptimizerMixin):
    """Placed in front of the wrapped optimizer's class; ``_commlib_allreduce``
    is a commlib.tensorflow.powersgd.PowerSGDReducer."""

    def build(self, variables):
        super().build(variables)
        self._commlib_allreduce.build(
            [v for v in variables if var_key(v) not in self._commlib_local])

    def commlib_state_variables(self) -> list:
        """The rule's state (for elastic.KerasState and memory_report)."""
        return self._commlib_allreduce.variables

    def commlib_own_variables(self) -> list:
        """The part of it that is each rank's own (the error buffers: each
        rank compresses its own gradients); elastic's sync leaves it alone."""
        state = self._commlib_allreduce.state
        return [] if state is None else list(state.errors.values())

    def save_own_variables(self, store):
        super().save_own_variables(store)
        state = self._commlib_allreduce.variables
        if state:
            config = repr(self._commlib_allreduce.config).encode()
            store[CONFIG_KEY] = np.frombuffer(config, np.uint8)
        for i, v in enumerate(state):
            store[f"{KEY_PREFIX}{i}"] = v.numpy()

    def load_own_variables(self, store):
        keys = list(store.keys())
        mine = sorted((k for k in keys if k.startswith(KEY_PREFIX) and k != CONFIG_KEY),
                      key=_position)
        super().load_own_variables({k: store[k] for k in keys if not k.startswith(KEY_PREFIX)})
        state = self._commlib_allreduce.variables
        if not mine or not state:
            warnings.warn(f"optimizer {self.name!r}: PowerSGD's state was not restored ("
                          + ("the checkpoint has none" if not mine else
                             "the optimizer is not built yet") + "); it starts from step 0",
                          stacklevel=2)
            return
        config = repr(self._commlib_allreduce.config)
        saved_config = (bytes(np.asarray(store[CONFIG_KEY], np.uint8)).decode()
                        if CONFIG_KEY in keys else None)
        if saved_config != config:
            raise ValueError(f"optimizer {self.name!r}: PowerSGD state of {saved_config} "
                             f"cannot be loaded into {config}")
        saved = [np.asarray(store[k]) for k in mine]
        if [tuple(a.shape) for a in saved] != [tuple(v.shape) for v in state]:
            raise ValueError(f"optimizer {self.name!r}: the checkpoint's PowerSGD state "
                             f"(shapes {[a.shape for a in saved]}) does not fit this "
                             f"model (shapes {[tuple(v.shape) for v in state]})")
        for v, a in zip(state, saved):
            v.assign(a)


def saved_state(filepath):
    """The optimizer variables (key -> array) of a ``.keras`` file whose
    optimizer was saved with PowerSGD's state, else None."""
    import io
    import zipfile

    if not zipfile.is_zipfile(filepath):
        return None
    with zipfile.ZipFile(filepath) as archive:
        if "model.weights.h5" not in archive.namelist():
            return None
        data = archive.read("model.weights.h5")
    import h5py

    with h5py.File(io.BytesIO(data), "r") as f:
        group = f.get("optimizer/vars")
        if group is None or CONFIG_KEY not in group:
            return None
        return {k: np.asarray(group[k]) for k in group.keys()}


def saved_config(state):
    """The PowerSGD configuration ``saved_state``'s result was saved with."""
    from commlib.powersgd import PowerSGD

    return PowerSGD.from_repr(bytes(np.asarray(state[CONFIG_KEY], np.uint8)).decode())


def load_saved_state(optimizer, state) -> None:
    """Loads ``saved_state``'s result into a built DistributedOptimizer: all
    of it into a PowerSGD one (ValueError for another configuration); into
    another, the wrapped optimizer's part (PowerSGD's state is dropped, with a
    warning)."""
    if not isinstance(optimizer, PowerSGDOptimizerMixin):
        warnings.warn(f"optimizer {optimizer.name!r}: the model was saved with PowerSGD "
                      f"({saved_config(state)!r}); its state is dropped", stacklevel=3)
        state = {k: v for k, v in state.items() if not k.startswith(KEY_PREFIX)}
    optimizer.load_own_variables(state)


def powersgd_allreduce(compression, op, gradient_predivide_factor, process_set, sparse_as_dense,
                       name, staleness, zero_stage, groups):
    """The DistributedOptimizer's allreduce_grads for compression=PowerSGD (a
    PowerSGDReducer; ValueError for options it does not take), or None for
    another compressor."""
    from commlib.reduce_args import predivide_scales

    from ..powersgd import as_config, check_options
    from ..powersgd_exchange import PowerSGDReducer

    config = as_config(compression)
    if config is None:
        return None
    check_options(op, staleness, zero_stage, groups)
    return PowerSGDReducer(config, op, *predivide_scales(op, gradient_predivide_factor),
                           process_set, sparse_as_dense, name)
