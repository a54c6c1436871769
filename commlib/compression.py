"""Gradient compressors shared by the framework frontends (Horovod's
``Compression.none``, ``Compression.fp16``, ...): ``compress`` before the
collective, ``decompress`` after it.

Framework-free: a frontend subclasses ``CastCompressor`` with its framework's
``is_floating(dtype)`` and ``cast(tensor, dtype)`` and a ``wire_dtype``.
"""
from __future__ import annotations


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


class CastCompressor(Compressor):
    """Sends floating-point tensors as ``wire_dtype`` and casts the result
    back to the original dtype; other dtypes pass unchanged (ctx None)."""

    wire_dtype = None

    @staticmethod
    def is_floating(dtype) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if cls.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)
