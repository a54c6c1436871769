"""Bad arguments to the optimizers, process sets and join are refused when
they are given, with a TypeError or ValueError that names them, not taken
(a float backward_passes_per_step, a string of digits as a process set) or
left to fail at the first gradient (compression=1). One process:
commlib.init() works in a singleton MPI process."""
import numpy as np
import pytest

import commlib
from commlib import checks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def initialized():
    commlib.init()
    yield


@pytest.mark.parametrize("value, error", [(1.5, TypeError), ("2", TypeError), (True, TypeError),
                                          (None, TypeError), (0, ValueError), (-1, ValueError)])
def test_positive_count(value, error):
    with pytest.raises(error, match="passes"):
        checks.positive_count(value, "passes")


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3)])
def test_integers_of_any_kind_are_taken(value):
    assert checks.positive_count(value, "passes") == 3 and type(checks.integer(value, "x")) is int


@pytest.mark.parametrize("ranks", ["01", b"01", 5, [0, 0.5], [True], [None]])
def test_process_set_ranks_are_integers(ranks):
    with pytest.raises(TypeError, match="ProcessSet takes a list of ranks|rank must be an integer"):
        commlib.ProcessSet(ranks)


@pytest.mark.parametrize("seed", ["1", 1.5, None])
def test_powersgd_seed_is_an_integer(seed):
    from commlib.powersgd import PowerSGD

    with pytest.raises(TypeError, match="PowerSGD seed must be an integer"):
        PowerSGD(seed=seed)


@pytest.mark.parametrize("device", ["x", "0", 1.5])
def test_join_device_is_an_integer(device):
    with pytest.raises(TypeError, match="join's device must be an integer"):
        commlib.join(device=device)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_torch_optimizer_arguments():
    torch = pytest.importorskip("torch")
    import commlib.torch as hvd

    model = torch.nn.Linear(2, 2)

    def make(**kwargs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)

    for bad in (1.5, "2", True):
        with pytest.raises(TypeError, match="backward_passes_per_step must be an integer"):
            make(backward_passes_per_step=bad)
    with pytest.raises(ValueError, match="backward_passes_per_step must be a positive integer"):
        make(backward_passes_per_step=0)
    with pytest.raises(TypeError, match="compression must be a compressor"):
        make(compression=1)
    with pytest.raises(TypeError, match="gradient_predivide_factor must be a real number"):
        make(gradient_predivide_factor="x")
    opt = make(backward_passes_per_step=2)
    with pytest.raises(TypeError, match="backward_passes_per_step must be an integer"):
        opt.set_backward_passes_per_step(2.5)
    assert opt.backward_passes_per_step == 2
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    for call in (hvd.allreduce, hvd.allreduce_, lambda t: hvd.broadcast_(t, 0), hvd.allgather):
        with pytest.raises(TypeError, match="nested tensors are not supported"):
            call(nested)
    with pytest.raises(TypeError, match="join's device must be an integer"):
        hvd.join(device="x")
    for kwargs in ({"model": 5}, {"optimizer": [model]}, {"model": model, "optimizer": "sgd"}):
        with pytest.raises(TypeError, match="TorchState's (model|optimizer) must have state_dict"):
            hvd.elastic.TorchState(**kwargs)
    assert hvd.elastic.TorchState(model=model).model is model


def test_tensorflow_optimizer_arguments():
    tf = pytest.importorskip("tensorflow")
    import keras

    import commlib.tensorflow as hvd
    import commlib.tensorflow.keras as hvd_keras

    with pytest.raises(TypeError, match="compression must be a compressor"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=1)
    with pytest.raises(TypeError, match="backward_passes_per_step must be an integer"):
        hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=1.5)
    with pytest.raises(TypeError, match="compression must be a compressor"):
        hvd.DistributedGradientTape(tf.GradientTape(), compression="fp16")
    with pytest.raises(TypeError, match="batches_per_commit must be an integer"):
        hvd_keras.elastic.CommitStateCallback(None, batches_per_commit=1.5)
