"""commlib.torch.pipelining: pipeline parallelism on commlib's send/recv,
with the names of ``torch.distributed.pipelining``.

    from commlib.torch.pipelining import PipelineStage, Schedule1F1B
    stage = PipelineStage(my_part, stage_index=hvd.rank(), num_stages=hvd.size())
    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)
    out = schedule.step(x, target=y, losses=losses)

See schedules.py for the step's contract and commlib.pipeline for the
schedules as data and their checker.
"""
from commlib.pipeline.checker import ScheduleError

from commlib.pipeline.actions import Action

from .schedules import (Schedule1F1B, ScheduleFromActions, ScheduleGPipe,
                        ScheduleInterleaved1F1B)
from .stage import PipelineStage

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "ScheduleFromActions", "Action", "ScheduleError"]
