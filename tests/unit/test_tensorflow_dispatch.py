"""frontends/tensorflow/_dispatch.py recognises Keras and TF1 optimizers from
their types' modules, without importing TensorFlow (one process, no MPI)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

DISPATCH = Path(__file__).resolve().parents[2] / "frontends" / "tensorflow" / "_dispatch.py"


def load():
    spec = importlib.util.spec_from_file_location("_tf_dispatch", DISPATCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake(module, name="Optimizer", base=object):
    return type(name, (base,), {"__module__": module})


def test_does_not_import_tensorflow():
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('d', {str(DISPATCH)!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"assert m.is_keras_optimizer(object()) is False\n"
            f"assert m.is_tf_legacy_optimizer(object()) is False\n"
            f"assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_recognises_by_module_name():
    mod = load()
    base = fake("keras.src.optimizers.optimizer")
    adam = fake("keras.src.optimizers.adam", "Adam", base)
    assert mod.is_keras_optimizer(adam()) and mod.is_keras_optimizer(adam)
    assert mod.is_keras_optimizer(fake("tf_keras.src.optimizers.legacy.adam", "Adam")())
    assert mod.is_keras_optimizer(fake("tensorflow.python.keras.optimizer_v2.adam", "Adam")())
    assert not mod.is_keras_optimizer(fake("torch.optim.sgd", "SGD")())
    assert not mod.is_keras_optimizer(fake("keras.src.layers.core.dense", "Dense")())
    legacy = fake("tensorflow.python.training.optimizer")
    gd = fake("tensorflow.python.training.gradient_descent", "GradientDescentOptimizer", legacy)
    assert mod.is_tf_legacy_optimizer(gd()) and not mod.is_keras_optimizer(gd())


def test_recognises_real_optimizers():
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    import tensorflow as tf

    mod = load()
    assert mod.is_keras_optimizer(keras.optimizers.Adam())
    assert mod.is_keras_optimizer(keras.optimizers.SGD(0.1))
    assert not mod.is_keras_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert mod.is_tf_legacy_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert not mod.is_tf_legacy_optimizer(keras.optimizers.Adam())
    assert not mod.is_keras_optimizer(tf.ones(2))
