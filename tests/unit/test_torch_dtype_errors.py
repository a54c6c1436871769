"""commlib.torch's refusal of dtypes it cannot move: the message lists what
it moves, and for the 1-byte float8 kinds says how to move their bytes
(one process, no MPI: the check runs before anything is sent)."""
import pytest

torch = pytest.importorskip("torch")

from commlib.torch.collectives.tensor_io import check_tensor  # noqa: E402

FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
          if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_refusal_says_how_to_move_its_bytes(dtype):
    with pytest.raises(TypeError, match="unsupported dtype") as e:
        check_tensor(torch.zeros(4, dtype=dtype), "allgather")
    assert "tensor.view(torch.uint8)" in str(e.value) and f".view({dtype})" in str(e.value)


def test_other_refusals_give_no_float8_hint():
    with pytest.raises(TypeError, match="unsupported dtype torch.complex64; commlib supports uint8") as e:
        check_tensor(torch.zeros(4, dtype=torch.complex64), "allreduce")
    assert "view(torch.uint8)" not in str(e.value)


def test_uint8_view_of_float8_is_accepted():
    x = torch.zeros(4, dtype=FLOAT8[0]) if FLOAT8 else pytest.skip("no float8 dtype in this torch")
    assert check_tensor(x.view(torch.uint8), "allgather").dtype == torch.uint8
