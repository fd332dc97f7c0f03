"""GGUF block formats: unpack to integers + per-group scales, and dequantize (bit-exact with gguf-py).

The legacy, K-quant, IQ (codebook), TQ (ternary) and MXFP4 formats all unpack into `UnpackedBlocks`.
"""

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
