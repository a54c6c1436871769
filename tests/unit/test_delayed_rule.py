"""commlib.delayed, the framework-free rule of one-step delayed averaging,
on numpy in one process: three simulated ranks run OneStepDelay +
apply_average (with and without a weight prediction) and are checked against
w_{t+1} = w_t - lr * avg(g_{t-1}) written out directly; the pending
exchange's life (errors stay pending, drop settles them), DelayedArrays on
one rank, the option checks and the gradient layout helpers."""
import numpy as np
import pytest

from commlib.delayed import (DelayedArrays, OneStepDelay, apply_average, check_op,
                             check_staleness, present, scatter, settle)
from commlib.errors import CommlibError
from commlib.ops import Average, Max, Sum

RANKS, LR, STEPS = 3, 0.1, 7
TARGETS = [np.array([1.0 + r, -2.0 * r, 0.5]) for r in range(RANKS)]


class MeanOfRanks:
    """A pending exchange whose result is the mean of the ranks' gradients."""

    def __init__(self, grads_of_ranks, r):
        self.grads, self.r, self.waits = grads_of_ranks, r, 0

    def wait(self):
        self.waits += 1
        return np.mean(self.grads, axis=0)


class Prediction:
    """Weight prediction on a numpy array: the model holds w + (w - w_prev)."""

    def __init__(self, w):
        self.w, self.true, self.predicting = w, None, False

    def before_update(self):
        if self.predicting:
            self.w[...] = self.true
            self.predicting = False
        self.prev = self.w.copy()

    def predict(self):
        self.true = self.w.copy()
        self.w += self.w - self.prev
        self.predicting = True

    def restore(self):
        if self.predicting:
            self.w[...] = self.true
            self.predicting = False


def grad(w, r):
    return w - TARGETS[r]


@pytest.mark.parametrize("predict", [False, True])
def test_delayed_sgd_matches_the_formula(predict):
    ws = [np.zeros(3) for _ in range(RANKS)]
    delays = [OneStepDelay() for _ in range(RANKS)]
    preds = [Prediction(w) if predict else None for w in ws]
    for _ in range(STEPS):
        grads = [grad(ws[r], r) for r in range(RANKS)]  # at the weights the model holds
        for r in range(RANKS):
            previous = delays[r].swap(lambda: MeanOfRanks(grads, r))
            if previous is not None:
                avg = previous.wait()
                apply_average(lambda: ws[r].__isub__(LR * avg), preds[r], predict=True)
            elif preds[r] is not None:
                preds[r].restore()
    for r in range(RANKS):
        done = delays[r].finish()
        apply_average(lambda: ws[r].__isub__(LR * done.wait()), preds[r], predict=False)

    check_against_reference(ws, predict)


def check_against_reference(ws, predict):
    """Every replica's weights ``ws`` equal the rule's numpy reference after
    STEPS steps and one final synchronize, and each other bitwise:
    w_{t+1} = w_t - lr * avg(g_{t-1}); g at w (or, ``predict``, at 2 w_t - w_{t-1})."""
    w, w_prev, last, held = np.zeros(3), None, None, np.zeros(3)
    for _ in range(STEPS):
        g = np.mean([held - TARGETS[r] for r in range(RANKS)], axis=0)
        if last is not None:
            w_prev, w = w, w - LR * last
        held = w + (w - w_prev) if predict and w_prev is not None else w
        last = g
    w = w - LR * last
    for r in range(RANKS):
        np.testing.assert_allclose(ws[r], w, rtol=1e-13)
        np.testing.assert_array_equal(ws[r], ws[0])  # replicas stay identical


class Failing:
    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1
        raise CommlibError("a rank was lost")


def test_a_failed_exchange_stays_pending_and_drop_settles_it():
    delay = OneStepDelay()
    delay.start(Failing())
    with pytest.raises(RuntimeError, match="already pending"):
        delay.start(Failing())
    for _ in range(2):
        with pytest.raises(CommlibError):
            delay.finish()
        assert delay.pending
    delay.drop()
    assert not delay.pending and delay.finish() is None
    settle(None)


class Done:
    def wait(self):
        return "averages"


def test_an_exchange_that_fails_to_start_stays_pending_as_its_error():
    # The previous step's exchange completed, then this step's could not even
    # start (the engine already knew a rank was lost): finish(), i.e. the next
    # step and synchronize(), must raise that error, not find nothing pending.
    delay = OneStepDelay()
    delay.start(Done())

    def fails_to_start():
        raise CommlibError("rank 1 was lost")

    with pytest.raises(CommlibError, match="rank 1"):
        delay.swap(fails_to_start)
    assert delay.pending
    for _ in range(2):
        with pytest.raises(CommlibError, match="rank 1"):
            delay.finish()
    delay.drop()  # (restored weights: the failed start is settled, silently)
    assert not delay.pending
    with pytest.raises(ValueError):  # another error (a bad argument) is not held
        delay.begin(lambda: np.asarray([1, 2]).reshape(3))
    assert not delay.pending


def test_delayed_arrays_on_one_rank_return_the_previous_step():
    taken = []

    def take(like):
        taken.append(len(like))
        return [np.empty_like(a) for a in like]

    d = DelayedArrays("delayed-unit", take, communicate=False)
    assert d.swap([np.ones(2), np.arange(3.0)]) == (False, None)
    have, prev = d.swap([np.zeros(2), np.zeros(3)])
    assert have and d.pending
    np.testing.assert_array_equal(prev[1], np.arange(3.0))
    with pytest.raises(ValueError, match="do not match"):
        d.swap([np.zeros(4)])
    d.drop()
    assert d.finish() == (False, None) and taken == [2, 2]


def test_option_checks():
    check_staleness(1)
    check_staleness(0, (0, 1))
    for bad in (2, True, 0):
        with pytest.raises(ValueError, match="staleness must be 0"):
            check_staleness(bad)
    with pytest.raises(ValueError, match="cannot be combined with groups, local_layers"):
        check_staleness(1, refused={"groups": True, "local_layers": True, "x": False})
    check_op(Average, "staleness=1")
    check_op(Sum, "staleness=1")
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        check_op(Max, "staleness=1")


def test_layout_helpers():
    grads = [None, "a", None, "b"]
    assert present(grads) == [1, 3]
    assert scatter(4, [1, 3], ["x", "y"]) == [None, "x", None, "y"]
    assert scatter(2, [], []) == [None, None]


@pytest.mark.parametrize("predict", [False, True])
def test_delayed_rule_drives_the_formula(predict):
    """DelayedRule over StartedExchanges (what the torch and Keras optimizers
    run): the same weights as the formula above, replicas identical."""
    from commlib.delayed import DelayedRule, StartedExchanges

    ws = [np.zeros(3) for _ in range(RANKS)]
    grads = [None]
    rules = [DelayedRule(StartedExchanges(lambda r=r: MeanOfRanks(grads[0], r)),
                         lambda avg, r=r: ws[r].__isub__(LR * avg),
                         prediction=Prediction(ws[r]) if predict else None) for r in range(RANKS)]
    for _ in range(STEPS):
        grads[0] = [grad(ws[r], r) for r in range(RANKS)]
        for r in range(RANKS):
            rules[r].step()
        assert all(rule.pending for rule in rules)
    for rule in rules:
        rule.synchronize()
        assert not rule.pending and not (predict and rule.prediction.predicting)
    check_against_reference(ws, predict)


def test_delayed_rule_forgets_a_failed_average_and_the_prediction():
    from commlib.delayed import DelayedRule, StartedExchanges

    class Droppable(Prediction):
        def drop(self):
            self.predicting = False

    rule = DelayedRule(StartedExchanges(Failing), lambda avg: None,
                       prediction=Droppable(np.ones(3)))
    rule.step()  # nothing to wait for yet
    with pytest.raises(CommlibError):
        rule.step()  # the failed one stays pending: its error again
    rule.prediction.predicting = True
    rule.forget()
    assert not rule.pending and not rule.prediction.predicting


def test_gradient_layout_and_tape_options():
    from commlib.delayed import GradientLayout, check_tape_options

    layout = GradientLayout()
    assert layout.present([None, "a", "b"]) == [1, 2]
    assert layout.scatter(["x", "y"]) == [None, "x", "y"]
    with pytest.raises(ValueError, match="changed between steps"):
        layout.present(["a", None, "b"])
    with pytest.raises(ValueError, match="no source has a gradient"):
        GradientLayout().present([None])
    check_tape_options(0, None, None, dict)
    check_tape_options(1, {}, None, dict)
    for args, match in [((0, {}, None), "delayed= is for staleness=1"),
                        ((1, None, None), "needs delayed="), ((1, {}, 2), "groups"),
                        ((2, {}, None), "staleness must be")]:
        with pytest.raises(ValueError, match=match):
            check_tape_options(*args, dict)
