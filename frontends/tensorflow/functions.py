"""Horovod's ``horovod.tensorflow.functions`` names (re-exported from
commlib.tensorflow.collectives.state_sync)."""
from .collectives.state_sync import (allgather_object, broadcast_object,  # noqa: F401 - re-exported
                                     broadcast_object_fn, broadcast_variables)
