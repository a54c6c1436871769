"""Gradient compression applied around allreduce, as in horovod.torch:
``Compression.none`` (no change), ``Compression.fp16`` (floating-point tensors
travel as float16), ``Compression.bf16`` (as bfloat16: float32's range with
fewer mantissa bits, so large gradients do not overflow);
``Compression.powersgd(rank=2, ...)`` (low-rank, with error feedback: for
DistributedOptimizer only, see commlib.torch.optim.powersgd)."""
from __future__ import annotations

import torch

from commlib.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401
from commlib.powersgd import PowerSGD


class _TorchCast(CastCompressor):
    is_floating = staticmethod(lambda dtype: dtype.is_floating_point)
    cast = staticmethod(lambda tensor, dtype: tensor.to(dtype))


class FP16Compressor(_TorchCast):
    """Sends floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """Sends floating-point tensors as bfloat16 (half the bytes of float32,
    float32's exponent range)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    powersgd = PowerSGD
