"""float16/bfloat16 are reduced through float32 in the core (csrc/half.cc).
On one rank an allreduce is exactly the conversion round trip, so its bit
patterns can be checked against numpy / ml_dtypes for arbitrary inputs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import commlib

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.fixture(scope="module", autouse=True)
def _init():
    commlib.init()


def bits(dtype, size):
    return hnp.arrays(np.uint16, size).map(lambda a: a.view(dtype))


def expected(x, scale):
    """What the core must produce: float32(x) * scale rounded to x.dtype (NaNs stay NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (x.astype(np.float32) * np.float32(scale)).astype(x.dtype)


def same_bits(got, want):
    g = got.astype(np.float32)
    w = want.astype(np.float32)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


@settings(max_examples=60, deadline=None)
@given(x=bits(np.float16, st.integers(0, 300)), scale=st.sampled_from([1.0, 0.5, 2.0, 3.0, 1e-3]))
def test_float16_round_trip_and_scaling(x, scale):
    same_bits(commlib.allreduce(x, op=commlib.Sum, postscale_factor=scale), expected(x, scale))


@settings(max_examples=60, deadline=None)
@given(x=bits(ml_dtypes.bfloat16, st.integers(0, 300)), scale=st.sampled_from([1.0, 0.5, 2.0, 3.0, 1e-3]))
def test_bfloat16_round_trip_and_scaling(x, scale):
    same_bits(commlib.allreduce(x, op=commlib.Sum, postscale_factor=scale), expected(x, scale))


def test_every_float16_bit_pattern_survives():
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    same_bits(commlib.allreduce(x, op=commlib.Sum), x)
