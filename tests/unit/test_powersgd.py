"""commlib.powersgd, the framework-free rule, on numpy tensors in one
process (a world of one rank: the allreduce returns its input): the plan,
argument checks, Gram-Schmidt, exact recovery of low-rank gradients, the
error-feedback balance, the plain phase, warm/cold start, state round trip."""
import numpy as np
import pytest

from commlib.powersgd import PowerSGD, PowerSGDState, orthogonalize, plan, wire_elements


class NumpyOps:
    """TensorOps on numpy float64 arrays; allreduce of one rank."""

    def __init__(self):
        self.calls = []

    matrix = staticmethod(lambda g, rows, cols: g.reshape(rows, cols).astype(np.float64))
    restore = staticmethod(lambda m, g: m.reshape(g.shape).astype(g.dtype))
    random = staticmethod(lambda shape, gen, like: gen.standard_normal(shape))
    matmul = staticmethod(np.matmul)
    transpose = staticmethod(np.transpose)
    columns = staticmethod(lambda m: [m[:, i] for i in range(m.shape[1])])
    stack_columns = staticmethod(lambda vs: np.stack(vs, 1))
    dot = staticmethod(np.dot)
    norm = staticmethod(np.linalg.norm)
    maximum = staticmethod(np.maximum)

    def allreduce(self, tensors, name):
        self.calls.append((name, [t.shape for t in tensors]))
        return [np.array(t, copy=True) for t in tensors]


SHAPES = [("conv", (8, 3, 3, 3)), ("fc", (32, 10)), ("head", (4, 16)), ("bias", (10,)),
          ("square", (8, 8))]


def test_plan_compresses_what_shrinks_enough():
    entries = {e.name: e for e in plan(SHAPES, rank=2, min_compression_rate=2)}
    assert (entries["conv"].rows, entries["conv"].cols, entries["conv"].rank) == (8, 27, 2)
    assert entries["fc"].rank == 2
    assert entries["head"].rank == 0  # 64 < 2 * 20 * 2
    assert entries["bias"].rank == 0  # vectors are never compressed
    assert entries["square"].rank == 2  # 64 == 2 * 16 * 2: shrinks exactly 2x, "at least"
    # rank >= min(rows, cols) never shrinks a matrix
    assert plan([("thin", (3, 1000))], rank=4, min_compression_rate=1)[0].rank == 0
    assert wire_elements(entries.values(), started=False) == 216 + 320 + 64 + 10 + 64
    assert wire_elements(entries.values(), started=True) == 35 * 2 + 42 * 2 + 64 + 10 + 16 * 2


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0}, "rank"), ({"rank": 1.5}, "rank"), ({"start_step": -1}, "start_step"),
    ({"min_compression_rate": 0.5}, "min_compression_rate"),
    ({"orthogonalization": "qr"}, "orthogonalization"), ({"epsilon": -1.0}, "epsilon")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerSGD(**kwargs)


def test_configuration_round_trips_through_its_repr():
    # (hvd.load_model rebuilds the saved configuration from the repr a checkpoint records)
    config = PowerSGD(rank=3, start_step=0, min_compression_rate=2.5, error_feedback=False,
                      warm_start=False, epsilon=1e-6, seed=4)
    assert repr(PowerSGD.from_repr(repr(config))) == repr(config)
    for text in ["PowerSGD(rank=2)", "PowerSGD(rank=0" + repr(config)[14:], "print(1)",
                 repr(config).replace("seed=4", "seed=4, extra=1"), "PowerSGD("]:
        with pytest.raises(ValueError, match="not a PowerSGD configuration"):
            PowerSGD.from_repr(text)


def test_not_a_per_tensor_compressor():
    with pytest.raises(TypeError, match="DistributedOptimizer"):
        PowerSGD().compress(np.zeros(3))


def test_orthogonalize_guards_zero_columns():
    rng = np.random.default_rng(1)
    m = rng.standard_normal((20, 3))
    m[:, 1] = 0.0
    q = orthogonalize(NumpyOps(), m, 1e-8)
    assert np.all(q[:, 1] == 0.0)
    kept = q[:, [0, 2]]
    np.testing.assert_allclose(kept.T @ kept, np.eye(2), atol=1e-12)
    # a column parallel to an earlier one leaves a residue below epsilon: no new direction
    par = np.hstack([m[:, :1], 0.6 * m[:, :1]])
    q = orthogonalize(NumpyOps(), par, 1e-8)
    assert np.linalg.norm(q[:, 1]) < 1e-6
    # the span of the first column is kept
    np.testing.assert_allclose(abs(q[:, 0] @ m[:, 0]), np.linalg.norm(m[:, 0]), rtol=1e-12)


def test_low_rank_gradient_is_recovered_exactly():
    rng = np.random.default_rng(2)
    g = np.outer(rng.standard_normal(32), rng.standard_normal(10))  # rank 1 <= 2
    state = PowerSGDState(PowerSGD(rank=2, start_step=0), [("fc", (32, 10))], NumpyOps())
    out = state.reduce({"fc": g})["fc"]
    np.testing.assert_allclose(out, g, atol=1e-12)
    np.testing.assert_allclose(state.errors["fc"], 0.0, atol=1e-12)


def test_error_feedback_balances_and_plain_phase_passes_through():
    rng = np.random.default_rng(3)
    ops = NumpyOps()
    state = PowerSGDState(PowerSGD(rank=2, start_step=2), SHAPES, ops)
    sent = {n: 0.0 for n, _ in SHAPES}
    got = {n: 0.0 for n, _ in SHAPES}
    for step in range(6):
        grads = {n: rng.standard_normal(s) for n, s in SHAPES}
        out = state.reduce(grads)
        for n, _ in SHAPES:
            sent[n] = sent[n] + grads[n]
            got[n] = got[n] + out[n]
            if step < 2 or n in ("head", "bias"):
                np.testing.assert_array_equal(out[n], grads[n])
    assert state.step == 6
    # everything sent arrives, except what is still in the error buffers
    for n, shape in SHAPES:
        err = state.errors.get(n, np.zeros(shape)).reshape(shape)
        np.testing.assert_allclose(got[n] + err, sent[n], atol=1e-10)
    assert "conv" in state.errors and "head" not in state.errors
    # steps 0, 1: one plain allreduce each; then P (with the uncompressed) and Q
    assert [c[0] for c in ops.calls] == ["powersgd.plain"] * 2 + ["powersgd.pq", "powersgd.q"] * 4
    assert ops.calls[2][1] == [(4, 16), (10,), (8, 2), (32, 2), (8, 2)]


def test_warm_start_keeps_q_and_cold_start_draws_per_step():
    rng = np.random.default_rng(4)
    grads = [{"fc": rng.standard_normal((32, 10))} for _ in range(3)]

    def run(warm):
        state = PowerSGDState(PowerSGD(rank=2, start_step=0, warm_start=warm), [("fc", (32, 10))],
                              NumpyOps())
        return [state.reduce(g)["fc"] for g in grads], state

    warm, warm_state = run(True)
    cold, cold_state = run(False)
    assert set(warm_state.qs) == {"fc"} and cold_state.qs == {}
    np.testing.assert_array_equal(warm[0], cold[0])  # the same first Q
    assert not np.allclose(warm[2], cold[2])
    np.testing.assert_array_equal(run(False)[0][2], cold[2])  # seeded: reproducible


def test_state_round_trip_continues_exactly():
    rng = np.random.default_rng(5)
    grads = [{n: rng.standard_normal(s) for n, s in SHAPES} for _ in range(6)]
    cfg = dict(rank=2, start_step=1)
    whole = PowerSGDState(PowerSGD(**cfg), SHAPES, NumpyOps())
    ref = [whole.reduce(g) for g in grads]
    first = PowerSGDState(PowerSGD(**cfg), SHAPES, NumpyOps())
    for g in grads[:3]:
        first.reduce(g)
    saved = first.state_dict()
    second = PowerSGDState(PowerSGD(**cfg), SHAPES, NumpyOps())
    second.load_state_dict(saved)
    for g, want in zip(grads[3:], ref[3:]):
        out = second.reduce(g)
        for n in want:
            np.testing.assert_array_equal(out[n], want[n])
    with pytest.raises(ValueError, match="cannot be loaded"):
        PowerSGDState(PowerSGD(rank=4), SHAPES, NumpyOps()).load_state_dict(saved)
    with pytest.raises(ValueError, match="not compressed here"):
        PowerSGDState(PowerSGD(**cfg), SHAPES[1:], NumpyOps()).load_state_dict(saved)
    with pytest.raises(KeyError, match="not in the plan"):
        second.reduce({"nope": np.zeros(3)})
