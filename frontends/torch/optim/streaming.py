"""A started averaging of a snapshot of parameters, waited for later: the
pending meeting of ``LocalSGD(..., streaming=True)`` (see local_sgd.py)."""
from __future__ import annotations

import torch

from .. import mpi_ops as _ops


class PendingParameters:
    """Copies ``params`` (the snapshot, ``inputs``) and starts averaging the
    copies in place across ``process_set`` (one grouped allreduce, progressed
    by the background thread); ``wait()`` returns them averaged."""

    def __init__(self, params, name, process_set=_ops.global_process_set, communicate=True):
        with torch.no_grad():
            self.inputs = [p.detach().clone(memory_format=torch.contiguous_format)
                             for p in params]
        self._sent = [s.clone() for s in self.inputs]
        self._handle = None
        if communicate and self._sent:
            self._handle = _ops.grouped_allreduce_async_(self._sent, name=name, op=_ops.Average,
                                                         process_set=process_set)

    def wait(self) -> list:
        """The averaged snapshot (the snapshot itself when nothing was sent)."""
        if self._handle is not None:
            _ops.synchronize(self._handle)
            self._handle = None
        return self._sent
