"""commlib.keras: the import Horovod users write as ``import horovod.keras as
hvd``. It is commlib.tensorflow.keras itself (Keras 3 on TensorFlow), under a
second name: the same module object, so ``hvd.callbacks``,
``from commlib.keras.callbacks import ...``, ``hvd.elastic`` and every name of
commlib.tensorflow.keras work unchanged."""
import sys

from commlib.tensorflow import keras as _keras
from commlib.tensorflow.keras import callbacks as _callbacks
from commlib.tensorflow.keras import elastic as _elastic

sys.modules[__name__] = _keras
sys.modules[__name__ + ".callbacks"] = _callbacks
sys.modules[__name__ + ".elastic"] = _elastic
