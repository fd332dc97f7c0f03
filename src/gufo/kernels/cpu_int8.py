"""CPU backend linear: int8 integer dot products over unpacked GGUF blocks (AVX2), see csrc/qgemm_cpu.c.

The C sources in csrc/ (these and the other CPU kernels) are compiled on first use with the system C
compiler into one library in the user cache and loaded with ctypes (it links the OpenMP runtime torch
already loaded, so both share one thread pool). Without a compiler or AVX2 the registry falls back to
the torch reference and says so once.
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

from gufo.formats import QUANTIZED_QTYPES, unpack
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.contracts import LINEAR, LinearKernel
from gufo.kernels.registry import Registration

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
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
    files = sorted(CSRC.glob("*.[ch]"))
    sources = [str(f) for f in files if f.suffix == ".c"]
    content = b"".join(f.read_bytes() for f in files) + " ".join(CFLAGS).encode()
    digest = hashlib.sha256(content).hexdigest()[:16]
    out_dir = Path(platformdirs.user_cache_dir("gufo")) / "kernels"
    target = out_dir / f"qgemm_cpu-{digest}.so"
    if not target.exists():
        log.info("compiling the CPU kernels with %s (once per version of their source)", compiler)
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = Path(tmp) / target.name
            proc = subprocess.run(
                [compiler, *CFLAGS, *sources, "-o", str(partial), "-lm"], capture_output=True, text=True
            )
            if proc.returncode != 0:
                log.warning(
                    "compiling the CPU kernels failed, using the torch reference: %s", proc.stderr[-500:]
                )
                return None
            os.replace(partial, target)  # atomic: concurrent first runs never load a half-written file
    lib = ctypes.CDLL(str(target))
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.gufo_linear.argtypes = [i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr, ptr]
    lib.gufo_linear.restype = i32
    lib.gufo_rms_norm.argtypes = [i32, i32, ptr, ptr, ctypes.c_float, ptr]
    lib.gufo_decode_layer.argtypes = [ptr, i32, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr, i32, ptr, ptr, i32]
    return lib


UNSIGNED8, SIGNED8, NIBBLES = 0, 1, 2  # weight layouts understood by gufo_qgemm


@dataclass
class Int8Weight:
    q: torch.Tensor  # uint8 [N, K] (shifted values or int8 bytes), or [N, K / 2] nibbles
    scale: torch.Tensor  # float32 [N, K / group]
    offset: torch.Tensor | None  # float32 [N, K / group], shift already folded in
    group: int
    kind: int  # UNSIGNED8, SIGNED8 or NIBBLES


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K / 2]: per 32-column block, byte i = col i | col (i + 16) << 4."""
    n, k = values.shape
    blocks = values.reshape(n, k // ACT_BLOCK, 2, ACT_BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


_LIB: ctypes.CDLL | None = None  # set once `available()` has built the library


class CpuInt8Linear(LinearKernel):
    """Registered for every quantized qtype on the `cpu` backend."""

    name = "cpu-int8-avx2"
    batch_invariant = True  # each row quantized on its own, each output a fixed-order sum over K

    @staticmethod
    def available() -> bool:
        global _LIB
        _LIB = library()
        return _LIB is not None

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
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()
        m, k = flat.shape
        n = weight.q.shape[0]
        y = torch.empty(m, n)
        failed = _LIB.gufo_linear(
            m,
            n,
            k,
            weight.group,
            weight.kind,
            flat.data_ptr(),
            weight.q.data_ptr(),
            weight.scale.data_ptr(),
            weight.offset.data_ptr() if weight.offset is not None else None,
            y.data_ptr(),
        )
        if failed:
            raise MemoryError(f"CPU linear: no memory for a {m}x{k} activation buffer")
        return y.reshape(*lead, n)


KERNELS = tuple(Registration("cpu", LINEAR, CpuInt8Linear(), qtype) for qtype in QUANTIZED_QTYPES)
