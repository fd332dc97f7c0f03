"""CPU backend linear: int8 integer dot products over unpacked GGUF blocks (AVX2), see csrc/qgemm_cpu.c.

The C source is compiled on first use with the system C compiler into the user cache and loaded with
ctypes (it links the OpenMP runtime torch already loaded, so both share one thread pool). Without a
compiler or AVX2 the registry falls back to the torch reference and says so once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch
from gguf import GGMLQuantizationType

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.registry import register
from gufo.quant import QUANTIZED_QTYPES, unpack

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "qgemm_cpu.c"
ACT_BLOCK = 32
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def _cpu_has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def library() -> ctypes.CDLL | None:
    """Compile (once per source version) and load the kernel library; None when it cannot be built."""
    if not _cpu_has_avx2():
        log.warning("CPU lacks AVX2: using the torch reference kernels (slow)")
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found (set CC): using the torch reference kernels (slow)")
        return None
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out_dir = Path(platformdirs.user_cache_dir("gufo")) / "kernels"
    target = out_dir / f"qgemm_cpu-{digest}.so"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = Path(tmp) / target.name
            proc = subprocess.run(
                [compiler, *CFLAGS, str(SOURCE), "-o", str(partial), "-lm"], capture_output=True, text=True
            )
            if proc.returncode != 0:
                log.warning(
                    "compiling the CPU kernels failed, using the torch reference: %s", proc.stderr[-500:]
                )
                return None
            os.replace(partial, target)  # atomic: concurrent first runs never load a half-written file
    lib = ctypes.CDLL(str(target))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.gufo_quantize_act.argtypes = [i32, i32, ptr, ptr, ptr, ptr, ptr]
    lib.gufo_qgemm.argtypes = [i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    return lib


UNSIGNED8, SIGNED8, NIBBLES = 0, 1, 2  # weight layouts understood by gufo_qgemm


@dataclass
class Int8Weight:
    q: torch.Tensor  # uint8 [N, K] (shifted values or int8 bytes), or [N, K / 2] nibbles
    scale: torch.Tensor  # float32 [N, K / group]
    offset: torch.Tensor | None  # float32 [N, K / group], shift already folded in
    group: int
    kind: int  # UNSIGNED8, SIGNED8 or NIBBLES


@dataclass
class QuantizedActivations:
    q: torch.Tensor
    scale: torch.Tensor
    sum16: torch.Tensor
    sum32: torch.Tensor


def quantize_activations(x: torch.Tensor) -> QuantizedActivations:
    lib = library()
    assert lib is not None
    m, k = x.shape
    x = x.contiguous()
    # One allocation for the scales and sums (each a contiguous [m, ...] block): decode calls this
    # about a hundred times per token.
    blocks = k // ACT_BLOCK
    floats = torch.empty(4 * m * blocks)
    act = QuantizedActivations(
        torch.empty(m, k, dtype=torch.int8),
        floats[: m * blocks].view(m, blocks),
        floats[2 * m * blocks :].view(m, 2 * blocks),
        floats[m * blocks : 2 * m * blocks].view(m, blocks),
    )
    lib.gufo_quantize_act(
        m, k, x.data_ptr(), act.q.data_ptr(), act.scale.data_ptr(), act.sum16.data_ptr(), act.sum32.data_ptr()
    )
    return act


def int8_matmul(act: QuantizedActivations, weight: Int8Weight) -> torch.Tensor:
    lib = library()
    assert lib is not None
    m, k = act.q.shape
    n = weight.q.shape[0]
    y = torch.empty(m, n)
    sums = act.sum16 if weight.group == 16 else act.sum32
    lib.gufo_qgemm(
        m,
        n,
        k,
        weight.group,
        weight.kind,
        act.q.data_ptr(),
        act.scale.data_ptr(),
        sums.data_ptr(),
        weight.q.data_ptr(),
        weight.scale.data_ptr(),
        weight.offset.data_ptr() if weight.offset is not None else None,
        y.data_ptr(),
    )
    return y


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K / 2]: per 32-column block, byte i = col i | col (i + 16) << 4."""
    n, k = values.shape
    blocks = values.reshape(n, k // ACT_BLOCK, 2, ACT_BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


class CpuInt8Linear:
    """Registered for every quantized qtype on the `cpu` backend."""

    name = "cpu-int8-avx2"

    @staticmethod
    def available() -> bool:
        return library() is not None

    @staticmethod
    def prepare(info: TensorInfo) -> Int8Weight:
        blocks = unpack(info.qtype, info.data.reshape(-1, info.data.shape[-1]))
        q = blocks.q
        low, high = int(q.min()), int(q.max())
        shift = max(0, -low)
        if high + shift > 127:  # 8-bit values: keep signed, dot via abs/sign
            return Int8Weight(
                q.contiguous().view(torch.uint8),
                blocks.scale.contiguous(),
                blocks.offset,
                blocks.group,
                SIGNED8,
            )
        offset = blocks.offset
        if shift:
            folded = -float(shift) * blocks.scale
            offset = folded if offset is None else offset + folded
        unsigned = (q.to(torch.int16) + shift).to(torch.uint8)
        kind = UNSIGNED8
        if high + shift <= 15:
            unsigned, kind = pack_nibbles(unsigned), NIBBLES
        return Int8Weight(
            unsigned.contiguous(),
            blocks.scale.contiguous(),
            offset.contiguous() if offset is not None else None,
            blocks.group,
            kind,
        )

    @staticmethod
    def apply(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1]).float()
        return int8_matmul(quantize_activations(flat), weight).reshape(*lead, -1)


for _qtype in QUANTIZED_QTYPES:
    register("cpu", "linear", _qtype)(CpuInt8Linear)

__all__ = ["CpuInt8Linear", "GGMLQuantizationType", "Int8Weight", "int8_matmul", "quantize_activations"]
