"""GGUF block formats: unpack to integers + per-group scales, and dequantize (bit-exact with gguf-py)."""

from gufo.formats.blocks import (
    FLOAT_QTYPES,
    QUANTIZED_QTYPES,
    SUPPORTED_QTYPES,
    UnpackedBlocks,
    block_shape,
    dequantize,
    unpack,
    unsupported_reason,
)

__all__ = [
    "FLOAT_QTYPES",
    "QUANTIZED_QTYPES",
    "SUPPORTED_QTYPES",
    "UnpackedBlocks",
    "block_shape",
    "dequantize",
    "unpack",
    "unsupported_reason",
]
