"""PowerSGD gradient compression (Vogels et al., NeurIPS 2019), written once
for every frontend: the plan (which gradients are compressed), the per-step
rule and its state. The frontend supplies a small ``TensorOps`` object (its
framework's matrix products and one grouped allreduce); nothing here imports
a framework.

Per exchange step, for the gradients of all parameters at once:

- before ``start_step``: one grouped allreduce of every gradient (as DDP's
  powerSGD_hook runs plain allreduce for its first iterations);
- afterwards, each gradient whose 2-D view M (first dimension by the rest)
  shrinks at least ``min_compression_rate`` times as (rows + cols) * rank
  numbers is compressed; the others (biases, norms, small matrices) are
  batched into the first allreduce, uncompressed:

      M += error                      (error feedback, per parameter)
      Q  = orthogonalize(Q)           (warm start: last step's Q; else random)
      P  = M Q                        allreduce [uncompressed..., P...]   (fused)
      P  = orthogonalize(P)           (Gram-Schmidt, zero columns stay zero)
      Q  = M^T P = (P^T M)^T          allreduce [Q...]                    (fused)
      M_hat = P Q^T                   the new gradient
      error = M - M_hat

Both allreduces apply the optimizer's reduction (Average by default). DDP's
hook sums P without dividing (P is orthogonalized next, so its scale does
not matter, up to the epsilon guard) and divides Q and the uncompressed
gradients by the world size after the sum; averaging P as well gives the same
M_hat and lets P travel in one fused allreduce with the uncompressed
gradients. Unlike DDP's hook, the uncompressed gradients are averaged exactly
and keep no error. A random Q is drawn from numpy's generator seeded with
(seed, tensor index[, step]), so it is identical on every rank and after a
restart, then converted by the frontend.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from math import prod

import numpy as np

from .checks import integer

ORTHOGONALIZATIONS = ("gram-schmidt",)


class PowerSGD:
    """The configuration of PowerSGD compression, taken as ``compression=``
    by the frontends' DistributedOptimizer (``Compression.powersgd(...)``).

    rank: columns of P and Q (capped at min(rows, cols) per tensor).
    start_step: exchange steps of plain allreduce before compression starts.
    min_compression_rate: a gradient is compressed when its 2-D view shrinks at
        least this many times: rows * cols >= rate * (rows + cols) * rank.
    error_feedback: add each step's compression error to the next gradient.
    warm_start: start from the previous step's Q (else a fresh random Q).
    orthogonalization: "gram-schmidt".
    epsilon: guard of the normalization (a column is divided by
        max(norm, epsilon): a zero column stays zero).
    seed: seed of the random Q (the same on every rank).
    """

    def __init__(self, rank=2, start_step=10, min_compression_rate=2, error_feedback=True,
                 warm_start=True, orthogonalization="gram-schmidt", epsilon=1e-8, seed=0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank must be a positive integer, got {rank!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"PowerSGD start_step must be an integer >= 0, got {start_step!r}")
        if not isinstance(min_compression_rate, (int, float)) or not min_compression_rate >= 1:
            raise ValueError("PowerSGD min_compression_rate must be a number >= 1, got "
                             f"{min_compression_rate!r}")
        if orthogonalization not in ORTHOGONALIZATIONS:
            raise ValueError(f"PowerSGD orthogonalization must be one of {ORTHOGONALIZATIONS}, "
                             f"got {orthogonalization!r}")
        if not isinstance(epsilon, (int, float)) or not epsilon >= 0:
            raise ValueError(f"PowerSGD epsilon must be a number >= 0, got {epsilon!r}")
        self.rank = rank
        self.start_step = start_step
        self.min_compression_rate = float(min_compression_rate)
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization = orthogonalization
        self.epsilon = float(epsilon)
        self.seed = integer(seed, "PowerSGD seed")
        # DistributedOptimizer compares compressors across ranks by __name__.
        self.__name__ = repr(self)

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, start_step={self.start_step}, "
                f"min_compression_rate={self.min_compression_rate:g}, "
                f"error_feedback={self.error_feedback}, warm_start={self.warm_start}, "
                f"orthogonalization={self.orthogonalization!r}, epsilon={self.epsilon:g}, "
                f"seed={self.seed})")

    @classmethod
    def from_repr(cls, text: str) -> "PowerSGD":
        """The configuration ``repr(config)`` wrote (as checkpoints record
        it); ValueError for any other text."""
        try:
            node = ast.parse(text, mode="eval").body
            ok = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "PowerSGD" and not node.args)
            config = cls(**{k.arg: ast.literal_eval(k.value) for k in node.keywords}) if ok \
                else None
        except (SyntaxError, ValueError, TypeError):
            config = None
        if config is None or repr(config) != text:
            raise ValueError(f"not a PowerSGD configuration: {text!r}")
        return config

    # Not a per-tensor compressor: refuse the per-tensor compression interface.
    def compress(self, tensor):
        raise TypeError("PowerSGD compresses the gradients of a whole model together; pass it "
                        "as DistributedOptimizer(compression=...), not to a single collective")

    decompress = compress


def as_config(compression):
    """The PowerSGD configuration ``compression`` stands for (the class
    itself means the defaults), or None for another compressor."""
    if isinstance(compression, type) and issubclass(compression, PowerSGD):
        return compression()
    return compression if isinstance(compression, PowerSGD) else None


def check_options(staleness=0, zero_stage=0, groups=None) -> None:
    """ValueError for a frontend's options PowerSGD does not take (a
    bucket size counts as ZeRO)."""
    if staleness != 0:
        raise ValueError("compression=PowerSGD cannot be combined with staleness=1")
    if zero_stage != 0:
        raise ValueError("compression=PowerSGD does not support zero_stage > 0 (the sharded "
                         "optimizer reduce-scatters flat buckets, which have no low-rank form "
                         "here); use zero_stage=0")
    if groups is not None:
        raise ValueError("compression=PowerSGD sends all gradients together; groups/num_groups "
                         "are not supported with it")


@dataclass(frozen=True)
class Entry:
    """One gradient in the plan."""

    index: int  # position among all the plan's tensors (seeds the random Q)
    name: str
    shape: tuple
    rows: int
    cols: int
    rank: int  # 0: not compressed

    @property
    def compressed(self) -> bool:
        return self.rank > 0


def plan(named_shapes, rank: int, min_compression_rate: float) -> list:
    """Entries for ``[(name, shape), ...]`` (in the given order, which must be
    the same on every rank): a tensor of 2 or more dimensions is compressed
    (``rank`` capped at min(rows, cols)) when rows * cols >= rate *
    (rows + cols) * rank."""
    out = []
    for i, (name, shape) in enumerate(named_shapes):
        shape = tuple(int(d) for d in shape)
        rows = shape[0] if shape else 1
        cols = prod(shape[1:]) if len(shape) > 1 else 1
        r = min(rank, rows, cols)
        keep = (len(shape) >= 2 and r > 0
                and rows * cols >= min_compression_rate * (rows + cols) * r)
        out.append(Entry(i, name, shape, rows, cols, r if keep else 0))
    return out


def wire_elements(entries, started: bool) -> int:
    """Numbers one exchange step allreduces (per rank) for ``entries``."""
    if not started:
        return sum(prod(e.shape) for e in entries)
    return sum((e.rows + e.cols) * e.rank if e.compressed else prod(e.shape) for e in entries)


class TensorOps:
    """What a frontend provides (functional: results are new tensors).

    matrix(grad, rows, cols): grad as a rows x cols matrix, in the dtype the
        rule computes in (e.g. float32 for half-precision gradients).
    restore(matrix, grad): the matrix back in grad's shape and dtype.
    random(shape, generator, like): a standard normal numpy array drawn from
        ``generator`` (a numpy Generator) as a tensor of like's compute
        dtype and device.
    matmul(a, b), transpose(a), columns(m) (list of column vectors),
    stack_columns(vectors), dot(u, v) and norm(v) (scalars as tensors),
    maximum(scalar, value) (elementwise max with a Python float).
    allreduce(tensors, name): one grouped (fused) allreduce with the
        optimizer's reduction; returns the results in order.
    seeded_random(shape, seq, like) (optional): ``random`` from the generator
        seeded with ``seq``, which may hold the exchange step as a tensor
        (a frontend whose step runs in a graph).
    add_error(m, error) and residual(m, p, q, old_error, feedback, grad)
        (optional): see ``add_error`` and ``residual``; a frontend with
        in-place tensors gives them to reuse the gradient's and the error's
        memory.
    """


def orthogonalize(ops, m, epsilon: float):
    """Gram-Schmidt on the columns of m (modified: each column loses its
    projections on the columns before it, then is divided by max(norm,
    epsilon)). Columns of norm >= epsilon come out orthonormal; a smaller one
    (zero: P of a zero or rank-deficient gradient) stays smaller than unit
    instead of dividing by 0, so P P^T never amplifies. (DDP's hook divides by
    norm + epsilon, which leaves the next column a residue of the order of
    epsilon along this one: normalized, it is no longer orthogonal.)"""
    done = []
    for c in ops.columns(m):
        for q in done:
            c = c - ops.dot(q, c) * q
        done.append(c / ops.maximum(ops.norm(c), epsilon))
    return ops.stack_columns(done)


def initial_q(config: PowerSGD, entry: Entry) -> np.ndarray:
    """The random Q a warm start begins from (float64): the same on every
    rank, and the one ``compressed`` draws when no Q is given."""
    return np.random.default_rng((config.seed, entry.index)).standard_normal(
        (entry.cols, entry.rank))


def draw(ops, shape, seq, like):
    """A standard normal ``shape`` from numpy's generator seeded with ``seq``,
    through ``ops.seeded_random(shape, seq, like)`` where the frontend has it
    (``seq`` may hold a step tensor), else ``ops.random``."""
    seeded = getattr(ops, "seeded_random", None)
    if seeded is not None:
        return seeded(shape, seq, like)
    return ops.random(shape, np.random.default_rng(seq), like)


def add_error(ops, m, error):
    """m + error, through ``ops.add_error`` where the frontend has it (which
    may update m, this step's gradient matrix, in place)."""
    add = getattr(ops, "add_error", None)
    return add(m, error) if add is not None else m + error


def residual(ops, m, p, q, old_error, feedback: bool, grad):
    """``(M_hat, error)``: P Q^T and, with error feedback, M - P Q^T (else
    None), through ``ops.residual`` where the frontend has it (which may
    write them over m, over the previous step's error ``old_error`` (a
    tensor or None; m itself where ``ops.add_error`` put M there) and over
    ``grad``, the gradient m came from)."""
    fused = getattr(ops, "residual", None)
    if fused is not None:
        return fused(m, p, q, old_error, feedback, grad)
    m_hat = ops.matmul(p, ops.transpose(q))
    return m_hat, (m - m_hat if feedback else None)


class PowerSGDState:
    """The rule's state for one optimizer: exchange steps done, the error of
    every compressed gradient, and Q of every compressed gradient (warm
    start). ``reduce`` runs one exchange step."""

    def __init__(self, config: PowerSGD, named_shapes, ops, name: str = "powersgd"):
        self.config = config
        self.entries = plan(named_shapes, config.rank, config.min_compression_rate)
        self._by_name = {e.name: e for e in self.entries}
        self.ops = ops
        self.name = name
        self.step = 0
        self.errors = {}
        self.qs = {}

    @property
    def started(self) -> bool:
        return self.step >= self.config.start_step

    def reduce(self, grads: dict) -> dict:
        """One exchange step: ``grads`` maps names (of the plan) to this rank's
        gradients, the same names on every rank; returns name -> reduced
        gradient."""
        if not self.started:
            result = self.plain(grads)
        else:
            result, self.errors, self.qs = self.compressed(grads, self.errors, self.qs,
                                                           self.step)
        self.step += 1
        return result

    def _present(self, grads: dict) -> list:
        unknown = sorted(set(grads) - set(self._by_name))
        if unknown:
            raise KeyError(f"PowerSGD: gradients not in the plan: {unknown}")
        return [e for e in self.entries if e.name in grads]

    def plain(self, grads: dict) -> dict:
        """An exchange step before ``start_step``: one grouped allreduce of
        every gradient (the state does not change)."""
        present = self._present(grads)
        outs = self.ops.allreduce([grads[e.name] for e in present], f"{self.name}.plain") \
            if present else []
        return {e.name: o for e, o in zip(present, outs)}

    def compressed(self, grads: dict, errors: dict, qs: dict, step):
        """A compressed exchange step from the given state, without changing
        this object: returns ``(result, errors, qs)``, the reduced gradients
        and the new state (new dicts). ``step`` (the exchange step) only
        seeds a cold start's random Q; a frontend running in a graph may pass
        it as a tensor (then ``ops.seeded_random`` draws)."""
        present = self._present(grads)
        cfg, ops = self.config, self.ops
        errors, qs_out = dict(errors), dict(qs)
        plain = [e for e in present if not e.compressed]
        packed = [e for e in present if e.compressed]
        ms, qs_in = [], []
        for e in packed:
            m = ops.matrix(grads[e.name], e.rows, e.cols)
            if cfg.error_feedback and e.name in errors:
                m = add_error(ops, m, errors[e.name])
            ms.append(m)
            q = qs.get(e.name) if cfg.warm_start else None
            if q is None:
                seq = (cfg.seed, e.index) if cfg.warm_start else (cfg.seed, e.index, step)
                q = draw(ops, (e.cols, e.rank), seq, m)
            qs_in.append(orthogonalize(ops, q, cfg.epsilon))
        ps = [ops.matmul(m, q) for m, q in zip(ms, qs_in)]
        outs = ops.allreduce([grads[e.name] for e in plain] + ps, f"{self.name}.pq") \
            if plain or ps else []
        result = {e.name: o for e, o in zip(plain, outs)}
        if packed:
            ps = [orthogonalize(ops, p, cfg.epsilon) for p in outs[len(plain):]]
            # (P^T M)^T: the same numbers as M^T P, several times faster in torch on a CPU
            new_qs = ops.allreduce([ops.transpose(ops.matmul(ops.transpose(p), m))
                                    for m, p in zip(ms, ps)], f"{self.name}.q")
            for e, m, p, q in zip(packed, ms, ps, new_qs):
                m_hat, error = residual(ops, m, p, q, errors.get(e.name), cfg.error_feedback,
                                        grads[e.name])
                if cfg.error_feedback:
                    errors[e.name] = error
                if cfg.warm_start:
                    qs_out[e.name] = q
                result[e.name] = ops.restore(m_hat, grads[e.name])
        return result, errors, qs_out

    def state_dict(self) -> dict:
        """The state to checkpoint (tensors of the frontend's framework)."""
        return {"step": self.step, "errors": dict(self.errors), "qs": dict(self.qs),
                "config": repr(self.config)}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()``'s result (ValueError for another
        configuration or unknown gradients, see ``check_state``)."""
        self.check_state(state)
        self.step = int(state["step"])
        self.errors = dict(state["errors"])
        self.qs = dict(state["qs"])

    def check_state(self, state: dict) -> None:
        """ValueError unless ``state`` (a ``state_dict()``) fits this rule."""
        if not isinstance(state, dict) or not {"step", "errors", "qs"} <= set(state):
            raise ValueError("not a PowerSGD state (a dict with step, errors and qs)")
        if state.get("config") != repr(self.config):
            raise ValueError(f"PowerSGD state of {state.get('config')} cannot be loaded into "
                             f"{self.config!r}")
        for key in ("errors", "qs"):
            unknown = sorted(n for n in state[key] if not self._known_compressed(n))
            if unknown:
                raise ValueError(f"PowerSGD state has {key} of gradients that are not "
                                 f"compressed here: {unknown}")

    def _known_compressed(self, name) -> bool:
        e = self._by_name.get(name)
        return e is not None and e.compressed
