"""Argument checking and single-process collectives (size 1), run with plain
pytest: commlib.init() works in a singleton MPI process, so no launcher.

Bad arguments must be refused before anything is sent: unsupported dtypes
with TypeError; non-contiguous or read-only in-place targets, roots outside
the job, bad ops, bad alltoall splits and 0-d tensors where a dimension 0 is
needed with ValueError; anything before init() with NotInitializedError.
With one rank every collective returns its input (scaled for reductions).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import commlib

pytestmark = pytest.mark.timeout(120)  # a hang in the core fails instead of blocking

REPO = Path(__file__).resolve().parents[2]
BF16 = np.dtype(ml_dtypes.bfloat16)
SUPPORTED = [np.dtype(t) for t in (np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32,
                                   np.float64, np.bool_)] + [BF16]
OPS = {"Sum": commlib.Sum, "Average": commlib.Average, "Min": commlib.Min, "Max": commlib.Max,
       "Product": commlib.Product}


@pytest.fixture(scope="module", autouse=True)
def initialized():
    commlib.init()
    assert commlib.is_initialized()
    yield


def _unsupported_dtypes():
    dts = [np.complex64, np.complex128, object, "U4",
           "datetime64[s]", ">f4", ">i8", [("a", "<f4"), ("b", "<i4")]]
    if np.dtype(np.longdouble).itemsize > 8:  # float128 on x86-64 Linux
        dts.append(np.longdouble)
    return [pytest.param(np.dtype(d), id=str(np.dtype(d))) for d in dts]


def _values(dt, shape, seed=0):
    """Small integer values (exact in every dtype)."""
    rng = np.random.default_rng(seed)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    lo = 0 if dt == np.uint8 else -9
    return rng.integers(lo, 10, shape).astype(dt)


def _scaled(x, pre, post):
    """Expected allreduce/reducescatter result with one rank."""
    dt = x.dtype
    if dt == np.bool_:
        return x.copy()
    if dt in (np.dtype(np.float16), BF16):  # reduced in float32
        f32 = np.float32
        return ((x.astype(f32) * f32(pre)) * f32(post)).astype(dt)
    if dt.kind in "iu":
        y = x
        if pre != 1.0:
            y = np.trunc(y.astype(np.float64) * pre).astype(dt)
        if post != 1.0:
            y = np.trunc(y.astype(np.float64) * post).astype(dt)
        return y
    y = x * dt.type(pre) if pre != 1.0 else x.copy()
    return y * dt.type(post) if post != 1.0 else y


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f" or want.dtype == BF16:
        u = np.dtype(f"u{want.dtype.itemsize}")
        assert np.array_equal(np.atleast_1d(got).view(u), np.atleast_1d(want).view(u)), (got, want)
    else:
        assert np.array_equal(got, want), (got, want)


# --------------------------------------------------------------- dtypes

def _calls_taking(x):
    """Every entry point, each given the array x (name, thunk)."""
    ok = np.zeros(3, np.float32)
    return {
        "allreduce": lambda: commlib.allreduce(x, op=commlib.Sum),
        "allreduce_async": lambda: commlib.allreduce_async(x, op=commlib.Sum),
        "allreduce_": lambda: commlib.allreduce_(x, op=commlib.Sum),
        "allreduce_async_": lambda: commlib.allreduce_async_(x, op=commlib.Sum),
        "grouped_allreduce": lambda: commlib.grouped_allreduce([ok, x], op=commlib.Sum),
        "grouped_allreduce_": lambda: commlib.grouped_allreduce_([ok.copy(), x], op=commlib.Sum),
        "allgather": lambda: commlib.allgather(x),
        "broadcast": lambda: commlib.broadcast(x, 0),
        "broadcast_": lambda: commlib.broadcast_(x, 0),
        "alltoall": lambda: commlib.alltoall(x),
        "alltoall_splits": lambda: commlib.alltoall(x, splits=[x.shape[0]]),
        "reducescatter": lambda: commlib.reducescatter(x, op=commlib.Sum),
    }


CALL_NAMES = list(_calls_taking(np.zeros(1)))


@pytest.mark.parametrize("call", CALL_NAMES)
@pytest.mark.parametrize("dt", _unsupported_dtypes())
def test_unsupported_dtype_is_type_error(dt, call):
    x = np.zeros(4, dtype=dt)
    with pytest.raises(TypeError, match="dtype"):
        _calls_taking(x)[call]()


@pytest.mark.parametrize("call", CALL_NAMES)
@pytest.mark.parametrize("dt", [pytest.param(d, id=d.name) for d in SUPPORTED])
def test_supported_dtype_is_accepted(dt, call):
    x = _values(dt, (4, 2))
    _calls_taking(x)[call]()


def test_nothing_left_in_flight_after_refused_group():
    """A group with one bad tensor is refused as a whole; the next
    collectives (same explicit name) work."""
    with pytest.raises(TypeError):
        commlib.grouped_allreduce([np.ones(2), np.ones(2, np.complex64)], op=commlib.Sum, name="g.bad")
    out = commlib.grouped_allreduce([np.ones(2), np.ones(3)], op=commlib.Sum, name="g.bad")
    _same(out[1], np.ones(3))


# --------------------------------------------------------------- in-place targets

def _noncontiguous():
    return {
        "strided": np.zeros(10)[::2],
        "reversed": np.zeros(6)[::-1],
        "transposed": np.zeros((3, 4)).T,
        "fortran": np.asfortranarray(np.zeros((3, 4))),
        "column": np.zeros((4, 3))[:, 1],
    }


def _readonly():
    a = np.zeros(4)
    a.flags.writeable = False
    return {
        "flag": a,
        "frombuffer": np.frombuffer(b"\0" * 32, dtype=np.float64),
        "broadcast_to": np.broadcast_to(np.zeros(1), (4,)),
    }


INPLACE = {
    "allreduce_": lambda x: commlib.allreduce_(x, op=commlib.Sum),
    "allreduce_async_": lambda x: commlib.allreduce_async_(x, op=commlib.Sum),
    "broadcast_": lambda x: commlib.broadcast_(x, 0),
    "broadcast_async_": lambda x: commlib.broadcast_async_(x, 0),
    "grouped_allreduce_": lambda x: commlib.grouped_allreduce_([np.zeros(2), x], op=commlib.Sum),
    "grouped_allreduce_async_": lambda x: commlib.grouped_allreduce_async_([x], op=commlib.Sum),
}


@pytest.mark.parametrize("call", list(INPLACE))
@pytest.mark.parametrize("kind", list(_noncontiguous()))
def test_inplace_on_noncontiguous_is_value_error(kind, call):
    x = _noncontiguous()[kind]
    before = x.copy()
    with pytest.raises(ValueError, match="contiguous"):
        INPLACE[call](x)
    _same(x, before)


@pytest.mark.parametrize("call", list(INPLACE))
@pytest.mark.parametrize("kind", list(_readonly()))
def test_inplace_on_readonly_is_value_error(kind, call):
    with pytest.raises(ValueError):
        INPLACE[call](_readonly()[kind])


@pytest.mark.parametrize("kind", list(_noncontiguous()))
def test_noncontiguous_input_to_out_of_place_collectives_is_copied(kind):
    x = _noncontiguous()[kind]
    x[...] = np.arange(x.size, dtype=x.dtype).reshape(x.shape) + 1
    before = x.copy()
    want = np.ascontiguousarray(before)
    _same(commlib.allreduce(x, op=commlib.Sum), want)
    _same(commlib.allreduce(x, op=commlib.Max, prescale_factor=2.0), want * 2)
    _same(commlib.synchronize(commlib.allreduce_async(x, op=commlib.Min)), want)
    _same(commlib.grouped_allreduce([x, x], op=commlib.Sum)[1], want)
    _same(commlib.broadcast(x, 0), want)
    _same(commlib.allgather(x), want)
    _same(commlib.alltoall(x), want)
    got, recv = commlib.alltoall(x, splits=[x.shape[0]])
    _same(got, want)
    _same(commlib.reducescatter(x, op=commlib.Sum), want)
    _same(x, before)  # inputs are left alone


def test_python_sequences_are_accepted_out_of_place():
    _same(commlib.allreduce([1.0, 2.5], op=commlib.Sum), np.array([1.0, 2.5]))
    _same(commlib.allgather([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]))
    _same(commlib.broadcast((True, False), 0), np.array([True, False]))


@pytest.mark.parametrize("call", [commlib.grouped_allreduce, commlib.grouped_allreduce_async,
                                  commlib.grouped_allreduce_, commlib.grouped_allreduce_async_])
@pytest.mark.parametrize("bad", [np.ones(3, np.float32), np.float32(1.0), "ab", None, 3])
def test_grouped_allreduce_takes_a_list(call, bad):
    # (an array would otherwise be taken as the list of its rows)
    with pytest.raises(TypeError, match="takes a list of tensors"):
        call(bad)


def test_grouped_allreduce_takes_any_iterable():
    xs = (np.ones(2, np.float32), np.arange(3.0))
    for group in (xs, iter(xs), (x for x in xs)):
        got = commlib.grouped_allreduce(group, op=commlib.Sum)
        _same(got[0], xs[0])
        _same(got[1], xs[1])


# --------------------------------------------------------------- roots, ops, names

@pytest.mark.parametrize("root", [1, 2, -1, 100, np.int64(1)])
@pytest.mark.parametrize("form", ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"])
def test_broadcast_root_outside_job_is_value_error(form, root):
    x = np.arange(4.0)
    with pytest.raises(ValueError, match="root"):
        getattr(commlib, form)(x, root)
    _same(x, np.arange(4.0))


BAD_OPS = [pytest.param(99, id="99"), pytest.param(-1, id="-1"), pytest.param("Sum", id="str"),
           pytest.param(1.5, id="float")]


@pytest.mark.parametrize("op", BAD_OPS)
@pytest.mark.parametrize("form", ["allreduce", "allreduce_", "allreduce_async", "grouped_allreduce",
                                  "reducescatter"])
def test_bad_op_is_value_error(form, op):
    x = np.arange(4.0)
    arg = [x] if form == "grouped_allreduce" else x
    with pytest.raises(ValueError):
        getattr(commlib, form)(arg, op=op)


@pytest.mark.parametrize("form", ["allreduce", "allreduce_", "allreduce_async", "grouped_allreduce"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_adasum_of_non_floats_is_type_error(form, dtype):
    x = np.ones(4, dtype)
    arg = [x] if form == "grouped_allreduce" else x
    with pytest.raises(TypeError, match="Adasum"):
        getattr(commlib, form)(arg, op=commlib.Adasum)


def test_adasum_reducescatter_is_value_error():
    with pytest.raises(ValueError, match="Adasum"):
        commlib.reducescatter(np.ones((2, 2)), op=commlib.Adasum)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_adasum_on_one_rank_applies_the_scale_factors(dtype):
    x = np.arange(5, dtype=dtype) - 2
    got = commlib.allreduce(x, op=commlib.Adasum, prescale_factor=2.0, postscale_factor=0.25)
    np.testing.assert_array_equal(got, x * 0.5)


def test_op_and_average_together_is_value_error():
    with pytest.raises(ValueError):
        commlib.allreduce(np.ones(2), average=True, op=commlib.Sum)


def test_average_argument_selects_average_or_sum():
    x = np.array([2.0, 4.0])
    _same(commlib.allreduce(x, average=True), x)
    _same(commlib.allreduce(x, average=False), x)


def test_bool_average_is_type_error():
    for f in (lambda: commlib.allreduce(np.ones(3, bool), op=commlib.Average),
              lambda: commlib.allreduce_(np.ones(3, bool), op=commlib.Average),
              lambda: commlib.allreduce(np.ones(3, bool)),  # default op is Average
              lambda: commlib.reducescatter(np.ones(3, bool), op=commlib.Average)):
        with pytest.raises(TypeError):
            f()


@pytest.mark.parametrize("name", ["", 5, b"x"])
def test_bad_name_is_value_error(name):
    with pytest.raises(ValueError):
        commlib.allreduce(np.ones(2), name=name)


# --------------------------------------------------------------- alltoall splits, 0-d

BAD_SPLITS = {
    "too-long": [4, 0],
    "too-long-equal": [2, 2],
    "empty-list": [],
    "empty-int-array": np.array([], dtype=np.int64),
    "negative": [-4],
    "sum-too-small": [3],
    "sum-too-large": [5],
    "zero": [0],
    "float": [4.0],
    "two-dim": [[4]],
    "string": ["4"],
}


@pytest.mark.parametrize("kind", list(BAD_SPLITS))
def test_alltoall_bad_splits_is_value_error(kind):
    x = np.zeros((4, 2))
    with pytest.raises(ValueError):
        commlib.alltoall(x, splits=BAD_SPLITS[kind])


@pytest.mark.parametrize("form", ["allgather", "alltoall", "alltoall_splits", "reducescatter",
                                  "allgather_async", "alltoall_async", "reducescatter_async"])
def test_zero_dim_where_a_dimension_is_needed_is_value_error(form):
    x = np.asarray(3.0)
    f = {
        "allgather": lambda: commlib.allgather(x),
        "alltoall": lambda: commlib.alltoall(x),
        "alltoall_splits": lambda: commlib.alltoall(x, splits=[1]),
        "reducescatter": lambda: commlib.reducescatter(x, op=commlib.Sum),
        "allgather_async": lambda: commlib.allgather_async(x),
        "alltoall_async": lambda: commlib.alltoall_async(x),
        "reducescatter_async": lambda: commlib.reducescatter_async(x, op=commlib.Sum),
    }[form]
    with pytest.raises(ValueError):
        f()


# --------------------------------------------------------------- handles

@pytest.mark.parametrize("form", ["allreduce", "allreduce_", "grouped", "allgather", "broadcast",
                                  "alltoall", "reducescatter"])
def test_synchronize_twice_is_value_error(form):
    x = np.arange(4.0)
    h = {
        "allreduce": lambda: commlib.allreduce_async(x, op=commlib.Sum),
        "allreduce_": lambda: commlib.allreduce_async_(x.copy(), op=commlib.Sum),
        "grouped": lambda: commlib.grouped_allreduce_async([x, x], op=commlib.Sum),
        "allgather": lambda: commlib.allgather_async(x),
        "broadcast": lambda: commlib.broadcast_async(x, 0),
        "alltoall": lambda: commlib.alltoall_async(x),
        "reducescatter": lambda: commlib.reducescatter_async(x, op=commlib.Sum),
    }[form]()
    commlib.synchronize(h)
    assert commlib.poll(h)
    with pytest.raises(ValueError):
        commlib.synchronize(h)


# --------------------------------------------------------------- before init / after shutdown

_NOT_INIT_SCRIPT = """
import numpy as np
import commlib
x = np.ones(4)
calls = {
    "allreduce": lambda: commlib.allreduce(x, op=commlib.Sum),
    "allreduce_": lambda: commlib.allreduce_(x.copy(), op=commlib.Sum),
    "allreduce_async": lambda: commlib.allreduce_async(x),
    "grouped_allreduce": lambda: commlib.grouped_allreduce([x, x]),
    "allgather": lambda: commlib.allgather(x),
    "broadcast": lambda: commlib.broadcast(x, 0),
    "broadcast_": lambda: commlib.broadcast_(x.copy(), 0),
    "alltoall": lambda: commlib.alltoall(x),
    "alltoall_splits": lambda: commlib.alltoall(x, splits=[4]),
    "reducescatter": lambda: commlib.reducescatter(x),
    "barrier": lambda: commlib.barrier(),
    "rank": lambda: commlib.rank(),
    "size": lambda: commlib.size(),
}
if MODE == "after-shutdown":
    commlib.init()
    commlib.allreduce(x)
    commlib.shutdown()
assert not commlib.is_initialized()
for name, f in calls.items():
    try:
        f()
    except commlib.NotInitializedError:
        print(name, "raised NotInitializedError")
    except Exception as e:
        print(name, "raised", type(e).__name__, e)
    else:
        print(name, "raised nothing")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["before-init", "after-shutdown"])
def test_everything_needs_init(mode):
    script = f"MODE = {mode!r}\n" + textwrap.dedent(_NOT_INIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=50, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 13, proc.stdout + proc.stderr
    wrong = [line for line in lines if not line.endswith("raised NotInitializedError")]
    assert not wrong, proc.stdout


# --------------------------------------------------------------- single-process results

def test_topology_of_a_single_process():
    assert (commlib.rank(), commlib.size()) == (0, 1)
    assert (commlib.local_rank(), commlib.local_size()) == (0, 1)
    assert (commlib.cross_rank(), commlib.cross_size()) == (0, 1)


def _scales(dt):
    if dt == np.bool_:
        return [(1.0, 1.0)]
    return [(1.0, 1.0), (2.0, 0.5), (1.5 if dt == np.uint8 else -1.5, 0.25), (0.5, 3.0)]


@pytest.mark.parametrize("dt", [pytest.param(d, id=d.name) for d in SUPPORTED])
def test_single_process_reductions_return_the_scaled_input(dt):
    for opname, op in OPS.items():
        if dt == np.bool_ and opname == "Average":
            continue
        for shape in [(0,), (1,), (5,), (2, 3), (4, 0, 2)]:
            for pre, post in _scales(dt):
                x = _values(dt, shape, seed=len(shape))
                want = _scaled(x, pre, post)
                kw = dict(op=op, prescale_factor=pre, postscale_factor=post)
                before = x.copy()
                _same(commlib.allreduce(x, **kw), want)
                _same(x, before)
                _same(commlib.synchronize(commlib.allreduce_async(x, **kw)), want)
                y = x.copy()
                assert commlib.allreduce_(y, **kw) is y
                _same(y, want)
                _same(commlib.grouped_allreduce([x, x], **kw)[0], want)
                _same(commlib.reducescatter(x, **kw), want)


@pytest.mark.parametrize("dt", [pytest.param(d, id=d.name) for d in SUPPORTED])
def test_single_process_data_movement_returns_the_input(dt):
    for shape in [(0,), (1,), (5,), (2, 3), (3, 0)]:
        x = _values(dt, shape, seed=7)
        _same(commlib.allgather(x), x)
        _same(commlib.broadcast(x, 0), x)
        y = x.copy()
        assert commlib.broadcast_(y, 0) is y
        _same(y, x)
        _same(commlib.alltoall(x), x)
        got, recv = commlib.alltoall(x, splits=[shape[0]])
        _same(got, x)
        _same(recv, np.array([shape[0]], np.int64))


def test_single_process_barrier():
    assert commlib.barrier() is None


@pytest.mark.parametrize("dt", [pytest.param(d, id=d.name) for d in SUPPORTED])
def test_single_process_zero_dim_keeps_its_shape(dt):
    x = _values(dt, (), seed=3)
    assert x.shape == ()
    _same(commlib.allreduce(x, op=commlib.Max), x)
    _same(commlib.synchronize(commlib.allreduce_async(x, op=commlib.Max)), x)
    y = np.array(x)  # a writable 0-d array (x may be a numpy scalar)
    commlib.allreduce_(y, op=commlib.Max)
    _same(y, x)
    _same(commlib.broadcast(x, 0), x)
    _same(commlib.grouped_allreduce([x], op=commlib.Max)[0], x)
    _same(commlib.allreduce(x[()], op=commlib.Max), x)  # numpy scalar in, 0-d array out


@pytest.mark.parametrize("call", [lambda n: commlib.allreduce(np.ones(2), name=n),
                                  lambda n: commlib.allgather_async(np.ones(2), name=n),
                                  lambda n: commlib.broadcast(np.ones(2), 0, name=n),
                                  lambda n: commlib.grouped_allreduce([np.ones(2)], name=n)])
def test_names_with_a_nul_byte_are_refused(call):
    # the core takes C strings: "a\x000" and "a\x001" would both become "a"
    with pytest.raises(ValueError, match="NUL"):
        call("a\x000")


@pytest.mark.parametrize("inplace", [False, True])
def test_grouped_layout_cache_does_not_keep_arrays_alive(inplace):
    import gc
    import weakref

    arrays = [np.full(8, float(i)) for i in range(5)]
    run = commlib.grouped_allreduce_ if inplace else commlib.grouped_allreduce
    for _ in range(2):  # the second call is served by the cached layout
        out = run(arrays, op=commlib.Sum)
        assert all(np.array_equal(o, np.full(8, float(i) * commlib.size()) if inplace
                                  else np.full(8, float(i))) for i, o in enumerate(out))
    refs = [weakref.ref(a) for a in arrays]
    del arrays, out
    gc.collect()
    assert all(r() is None for r in refs)
    # new arrays (which may reuse the ids) get a layout of their own
    fresh = [np.full(3, 7.0) for _ in range(5)]
    assert all(np.array_equal(o, np.full(3, 7.0 * commlib.size())) for o in
               commlib.grouped_allreduce(fresh, op=commlib.Sum))


# each reduction given a scale factor s (prescale or postscale)
SCALED_CALLS = [
    lambda s: commlib.allreduce(np.ones(2), prescale_factor=s),
    lambda s: commlib.allreduce_(np.ones(2), postscale_factor=s),
    lambda s: commlib.grouped_allreduce([np.ones(2), np.ones(3)], prescale_factor=s),
    lambda s: commlib.reducescatter(np.ones(2), postscale_factor=s)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("call", SCALED_CALLS)
def test_non_finite_scale_factors_are_refused(call, bad):
    # a NaN never compares equal: every rank would see a mismatch, every time
    with pytest.raises(ValueError, match="scale factors must be finite"):
        call(bad)


@pytest.mark.parametrize("bad", ["2", b"2", None, 1j, True])
@pytest.mark.parametrize("call", SCALED_CALLS)
def test_scale_factors_that_are_not_numbers_are_type_errors(call, bad):
    # (float("2") would have parsed the string; True would have been 1.0)
    with pytest.raises(TypeError, match=r"(pre|post)scale_factor must be a real number, got"):
        call(bad)


@pytest.mark.parametrize("factor", [2, np.float32(2.0), np.int64(2), 2.0])
def test_scale_factors_take_any_real_number(factor):
    out = commlib.allreduce(np.ones(2), op=commlib.Sum, prescale_factor=factor)
    assert np.array_equal(out, np.full(2, 2.0 * commlib.size()))


def test_array_facts_cache_does_not_keep_arrays_alive():
    import gc
    import weakref

    from commlib import submit

    arrays = [np.full(8, float(i)) for i in range(5)]
    for _ in range(2):  # the second call takes the cached facts
        for i, a in enumerate(arrays):
            a[:] = i
            commlib.allreduce_(a, op=commlib.Sum)
            assert np.array_equal(a, np.full(8, float(i) * commlib.size()))
    keys = [id(a) for a in arrays]
    assert all(k in submit._facts for k in keys)
    refs = [weakref.ref(a) for a in arrays]
    del arrays, a
    gc.collect()
    assert all(r() is None for r in refs)
    assert not any(k in submit._facts for k in keys)  # (the entries went with their arrays)
