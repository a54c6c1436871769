"""Horovod's ``horovod.torch.functions`` names (re-exported from
commlib.torch.collectives.state_sync)."""
from .collectives.state_sync import (allgather_object, broadcast_object,  # noqa: F401 - re-exported
                                     broadcast_optimizer_state, broadcast_parameters, broadcast_state,
                                     init_state)
