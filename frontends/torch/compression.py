"""Gradient compression applied around allreduce, as in horovod.torch:
``Compression.none`` (no change), ``Compression.fp16`` (floating-point tensors
travel as float16), ``Compression.bf16`` (as bfloat16: float32's range with
fewer mantissa bits, so large gradients do not overflow)."""
from __future__ import annotations

import torch


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)`` before the
    collective and ``decompress(tensor, ctx) -> tensor`` after it."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Leaves tensors unchanged."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != cls.wire_dtype:
            tensor = tensor.type(cls.wire_dtype)
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            tensor = tensor.type(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (half the bytes of float32,
    float32's exponent range)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
