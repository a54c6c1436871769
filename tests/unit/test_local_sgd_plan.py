"""commlib.local_sgd, the framework-free rule of LocalSGD and DiLoCo, on
numpy in one process: three simulated ranks train on their own quadratic
losses with the plan's schedule and meeting steps (MeetingOps on numpy, an
outer SGD with Nesterov momentum as torch.optim.SGD computes it), checked
against a reference written out directly from the rule's formulas; and the
whole control flow (LocalSGDRun, as the frontends drive it) on three ranks
as threads that average through a barrier."""
import threading
import types

import numpy as np
import pytest

from commlib.local_sgd import (LocalSGDPlan, LocalSGDRun, MeetingOps, StreamingMeetings, by_name,
                               meeting_step, streaming_step)

RANKS, LR, OUTER_LR, MU, STEPS = 3, 0.1, 0.7, 0.9, 14
SHAPES = [(3, 2), (4,)]  # two weights; one buffer of shape (2,) after them
TARGETS = [[np.full(s, 1.0 + r + i) for i, s in enumerate(SHAPES)] for r in range(RANKS)]


class NesterovSGD:
    """torch.optim.SGD(lr, momentum, nesterov=True)'s step on numpy arrays."""

    def __init__(self, lr, mu):
        self.lr, self.mu, self.bufs = lr, mu, None

    def __call__(self, grads, variables):
        if self.bufs is None:
            self.bufs = [g.copy() for g in grads]
        else:
            self.bufs = [self.mu * b + g for b, g in zip(self.bufs, grads)]
        for v, g, b in zip(variables, grads, self.bufs):
            v -= self.lr * (g + self.mu * b)


def initial():
    return [np.linspace(-1, 1, int(np.prod(s))).reshape(s) for s in SHAPES]


def inner_step(model, buffers, r, step):
    """SGD on 0.5 |w - target_r|^2; the buffer tracks a running statistic."""
    for w, t in zip(model, TARGETS[r]):
        w -= LR * (w - t)
    buffers[0] += np.array([r, step], float)


def simulate(plan, diloco):
    """The rule as a frontend drives it (plan.in_warmup / meets_after,
    meeting_step / streaming_step); the allreduce is a mean over the ranks."""
    models = [initial() for _ in range(RANKS)]
    buffers = [[np.zeros(2)] for _ in range(RANKS)]
    outers = [NesterovSGD(OUTER_LR, MU) if diloco else None for _ in range(RANKS)]
    ops = [MeetingOps(np.copyto, lambda v, d: np.add(v, d, out=v), o) for o in outers]
    anchors, pending = [None] * RANKS, None

    def averaged(r):
        return models[r] + buffers[r]

    def mean(values):
        return [np.mean(v, axis=0) for v in zip(*values)]

    for step in range(STEPS):
        if plan.in_warmup(step):  # synchronous: the gradients are averaged
            grads = mean([[w - t for w, t in zip(models[r], TARGETS[r])] for r in range(RANKS)])
            for r in range(RANKS):
                for w, g in zip(models[r], grads):
                    w -= LR * g
            continue
        for r in range(RANKS):
            if diloco and anchors[r] is None:
                anchors[r] = [w.copy() for w in models[r]]
            inner_step(models[r], buffers[r], r, step)
        if not plan.meets_after(step):
            continue
        if plan.streaming:
            if pending is not None:
                average = mean(pending)
                for r in range(RANKS):
                    streaming_step(ops[r], models[r], buffers[r], average, pending[r], anchors[r])
            pending = [[v.copy() for v in averaged(r)] for r in range(RANKS)]
        else:
            average = mean([averaged(r) for r in range(RANKS)])
            for r in range(RANKS):
                meeting_step(ops[r], models[r], buffers[r], average, anchors[r])
    return models, buffers


def reference(period, warmup, streaming, diloco):
    """The rule's formulas, written out: meetings after local steps t with
    (t + 1) % period == 0; DiLoCo: x <- anchor - lr (d + mu b), b <- mu b + d,
    d = anchor - mean(x); streaming: x_r <- new(mean(s)) + (x_r - s_r)."""
    x = [[w.copy() for w in initial()] + [np.zeros(2)] for _ in range(RANKS)]
    n = len(SHAPES)
    anchor, buf, snap = None, None, None
    for step in range(STEPS):
        if step < warmup:
            g = [np.mean([x[r][i] - TARGETS[r][i] for r in range(RANKS)], axis=0)
                 for i in range(n)]
            for r in range(RANKS):
                x[r][:n] = [w - LR * gi for w, gi in zip(x[r][:n], g)]
            continue
        if anchor is None:
            anchor = [w.copy() for w in x[0][:n]]
        for r in range(RANKS):
            x[r][:n] = [w - LR * (w - t) for w, t in zip(x[r][:n], TARGETS[r])]
            x[r][n] = x[r][n] + np.array([r, step], float)
        if (step - warmup + 1) % period:
            continue
        source = snap if streaming else [list(v) for v in x]
        if source is not None:
            avg = [np.mean([source[r][i] for r in range(RANKS)], axis=0) for i in range(n + 1)]
            new = avg
            if diloco:
                d = [a - m for a, m in zip(anchor, avg[:n])]
                buf = d if buf is None else [MU * b + di for b, di in zip(buf, d)]
                anchor = [a - OUTER_LR * (di + MU * b) for a, di, b in zip(anchor, d, buf)]
                new = anchor + avg[n:]
            for r in range(RANKS):
                keep = [v - s for v, s in zip(x[r], source[r])] if streaming else [0] * (n + 1)
                x[r] = [nv + k for nv, k in zip(new, keep)]
        if streaming:
            snap = [[v.copy() for v in x[r]] for r in range(RANKS)]
    return x


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("diloco", [False, True])
@pytest.mark.parametrize("period,warmup", [(3, 0), (4, 2)])
def test_meetings_match_the_reference(period, warmup, streaming, diloco):
    plan = LocalSGDPlan(period, warmup, streaming)
    models, buffers = simulate(plan, diloco)
    want = reference(period, warmup, streaming, diloco)
    for r in range(RANKS):
        for got, exp in zip(models[r] + buffers[r], want[r]):
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    if not streaming:  # a synchronous meeting leaves the replicas identical
        last_meeting = max(t for t in range(STEPS) if plan.meets_after(t))
        if last_meeting == STEPS - 1:
            for r in range(1, RANKS):
                for a, b in zip(models[0], models[r]):
                    np.testing.assert_array_equal(a, b)


def test_schedule_on_ints_and_integer_arrays():
    plan = LocalSGDPlan(period=3, warmup_steps=2)
    assert [t for t in range(12) if plan.meets_after(t)] == [4, 7, 10]
    assert [plan.in_warmup(t) for t in range(3)] == [True, True, False]
    steps = np.arange(12, dtype=np.int64)  # element-wise, as a framework's tensor
    np.testing.assert_array_equal(plan.meets_after(steps), [t in (4, 7, 10) for t in range(12)])
    np.testing.assert_array_equal(plan.is_local(steps), steps >= 2)


def test_meeting_step_assigns_and_keeps_the_anchor():
    model, buffers = [np.array([1.0, 2.0])], [np.array([5.0])]
    anchor = [np.array([0.0, 0.0])]
    steps = []
    ops = MeetingOps(np.copyto, lambda v, d: np.add(v, d, out=v),
                     lambda grads, vs: steps.append([g.copy() for g in grads]))
    meeting_step(ops, model, buffers, [np.array([3.0, 4.0]), np.array([7.0])], anchor)
    np.testing.assert_array_equal(steps[0][0], [-3.0, -4.0])  # anchor - average
    np.testing.assert_array_equal(model[0], [0.0, 0.0])  # the anchor (the outer step is a no-op)
    np.testing.assert_array_equal(buffers[0], [7.0])  # buffers take the plain average
    np.testing.assert_array_equal(anchor[0], model[0])
    assert anchor[0] is not model[0]


@pytest.mark.parametrize("kwargs,match", [
    (dict(period=0), "period"), (dict(period=2.0), "period"), (dict(period=True), "period"),
    (dict(period=2, warmup_steps=-1), "warmup_steps"), (dict(period=2, streaming=1), "streaming"),
    (dict(period=2, average_buffers=None), "average_buffers")])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalSGDPlan(**kwargs)


def test_outer_must_be_separate_and_is_named():
    inner = NesterovSGD(0.1, 0.9)
    with pytest.raises(ValueError, match="separate"):
        LocalSGDPlan(2, outer=inner, inner=inner)
    assert LocalSGDPlan(2, outer=NesterovSGD(0.7, 0.9), inner=inner).outer == "NesterovSGD"
    assert LocalSGDPlan(2).outer is None


class Ranks:
    """Three ranks as threads: ``average(r, values)`` is the mean over the ranks."""

    def __init__(self):
        self.barrier, self.slots = threading.Barrier(RANKS, timeout=20), [None] * RANKS

    def average(self, r, values):
        self.slots[r] = [np.array(v, copy=True) for v in values]
        self.barrier.wait()
        out = [np.mean(vs, axis=0) for vs in zip(*self.slots)]
        self.barrier.wait()
        return out

    def run(self, fn):
        errors = []

        def target(r):
            try:
                fn(r)
            except BaseException as e:  # (re-raised below)
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(RANKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def run_ranks(plan, diloco, steps=STEPS, sync=False):
    """LocalSGDRun on each rank (the whole control flow, as the frontends drive it)."""
    ranks, runs = Ranks(), [None] * RANKS
    models = [initial() for _ in range(RANKS)]
    buffers = [[np.zeros(2)] for _ in range(RANKS)]

    def rank(r):
        def inner_step(in_warmup):
            step = runs[r].step.read_value()
            if in_warmup:
                grads = ranks.average(r, [w - t for w, t in zip(models[r], TARGETS[r])])
                for w, g in zip(models[r], grads):
                    w -= LR * g
            else:
                inner_step_of(models[r], buffers[r], r, step)

        ops = MeetingOps(np.copyto, lambda v, d: np.add(v, d, out=v),
                         NesterovSGD(OUTER_LR, MU) if diloco else None, copy=np.copy,
                         average=lambda values: ranks.average(r, values))
        stream = StreamingMeetings(lambda values: types.SimpleNamespace(
            inputs=[np.copy(v) for v in values],
            wait=(lambda avg: lambda: avg)(ranks.average(r, values)))) if plan.streaming else None
        runs[r] = LocalSGDRun(plan, ops, models[r], buffers[r], stream)
        for _ in range(steps):
            runs[r].run_step(inner_step)
        if sync:
            runs[r].synchronize()

    ranks.run(rank)
    return models, buffers, runs


inner_step_of = inner_step


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("diloco", [False, True])
@pytest.mark.parametrize("period,warmup", [(3, 0), (4, 2)])
def test_run_matches_the_reference(period, warmup, streaming, diloco):
    plan = LocalSGDPlan(period, warmup, streaming)
    models, buffers, runs = run_ranks(plan, diloco)
    want = reference(period, warmup, streaming, diloco)
    for r in range(RANKS):
        for got, exp in zip(models[r] + buffers[r], want[r]):
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    last = max(t for t in range(STEPS) if plan.meets_after(t))
    assert [int(runs[0].step), int(runs[0].local_steps)] == [STEPS, STEPS - 1 - last]
    assert (runs[0].anchor is not None) == diloco


@pytest.mark.parametrize("streaming", [False, True])
def test_synchronize_leaves_identical_replicas_and_state_round_trips(streaming):
    plan = LocalSGDPlan(3, 1, streaming)
    models, buffers, runs = run_ranks(plan, diloco=True, steps=STEPS - 1, sync=True)
    for r in range(1, RANKS):
        for a, b in zip(models[0] + buffers[0], models[r] + buffers[r]):
            np.testing.assert_array_equal(a, b)
    state = runs[0].state()
    assert (state["step"], state["local_steps"]) == (STEPS - 1, 0)
    np.testing.assert_array_equal(state["anchor"][0], models[0][0])
    fresh = LocalSGDRun(plan, runs[0].ops, models[0], buffers[0])
    fresh.load_state(state)
    assert (int(fresh.step), int(fresh.local_steps)) == (STEPS - 1, 0)
    assert fresh.anchor[0] is not state["anchor"][0]
    assert plan.describe(fresh.step).endswith(f"step={STEPS - 1}")


def test_by_name_counts_each_variable_once():
    a, b = np.zeros(1), np.ones(1)
    names, values = by_name([("z", a), ("y", b), ("x", a), ("w", None)])
    assert names == ["y", "z"] and values[0] is b and values[1] is a
    assert by_name([("a", a), ("b", b)], keep=lambda v: v[0] > 0) == (["b"], [b])


@pytest.mark.parametrize("streaming", [False, True])
def test_a_failed_meeting_leaves_its_steps_to_synchronize(streaming):
    """The local steps are counted as met only after the meeting's average
    (or the streaming start) ran: the reset goes through ``ops.after`` with
    those results (a graph orders it by them), and a meeting whose average
    failed is held again by synchronize()."""
    calls, fail = [], [True]

    def average(values):
        calls.append("average")
        if fail[0]:
            raise RuntimeError("rank 1 was lost")
        return [np.copy(v) for v in values]

    def after(deps, fn):
        calls.append(("after", [type(d).__name__ for d in deps]))
        fn()

    def begin(values):
        return types.SimpleNamespace(inputs=[np.copy(v) for v in values],
                                     wait=lambda: average(values))

    ops = MeetingOps(np.copyto, lambda v, d: np.add(v, d, out=v), average=average, after=after)
    stream = StreamingMeetings(begin) if streaming else None
    if streaming:  # (a start that fails, as a submission to a lost rank does)
        stream._begin = lambda values: average(values) and begin(values)
    run = LocalSGDRun(LocalSGDPlan(2, streaming=streaming), ops, initial(), [np.zeros(2)], stream)
    run.run_step(lambda in_warmup: None)
    with pytest.raises(RuntimeError, match="rank 1 was lost"):
        run.run_step(lambda in_warmup: None)
    assert int(run.local_steps) == 2 and not any(c[0] == "after" for c in calls), calls
    with pytest.raises(RuntimeError, match="rank 1 was lost"):
        run.synchronize()
    assert int(run.local_steps) == 2
    fail[0] = False
    run.synchronize()
    assert int(run.local_steps) == 0
    assert calls[-1] == ("after", ["ndarray"] * 3), calls


def test_keras_run_after_orders_the_update_after_its_dependencies():
    tf = pytest.importorskip("tensorflow")
    from commlib.tensorflow.keras.optimizer_base import run_after

    counter = tf.Variable(2)
    seen = {}

    @tf.function
    def step(x):
        started = tf.numpy_function(lambda a: a, [x], tf.float32)
        run_after([started, None], lambda: counter.assign(0))
        seen["graph"] = tf.compat.v1.get_default_graph()
        return started

    step(tf.constant(1.0))
    ops = seen["graph"].get_operations()
    assign = next(o for o in ops if o.type == "AssignVariableOp")

    def ancestors(op, seen=()):
        above = [i.op for i in op.inputs] + list(op.control_inputs)
        return {a for a in above if a not in seen} | {b for a in above if a not in seen
                                                      for b in ancestors(a, seen + (a,))}

    assert any(a.type == "PyFunc" for a in ancestors(assign)), ops
    assert int(counter.numpy()) == 0
    run_after([tf.constant(1.0)], lambda: counter.assign(5))  # (eagerly: at once)
    assert int(counter.numpy()) == 5
