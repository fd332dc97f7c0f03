"""Compile two small Triton kernels for an AMD and an NVIDIA target on the CPU, into TRITON_CACHE_DIR.

Usage: TRITON_CACHE_DIR=DIR python triton_kernels.py   (needs the `triton` package; no GPU)
"""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def tri_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def tri_matmul(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


ADD_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
MM_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
MM_SIG |= {"BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
TARGETS = [GPUTarget("hip", "gfx1151", 32), GPUTarget("cuda", 90, 32)]
for target in TARGETS:
    add = ASTSource(tri_add, ADD_SIG, constexprs={"BLOCK": 1024})
    mm = ASTSource(tri_matmul, MM_SIG, constexprs={"BM": 64, "BN": 64, "BK": 32})
    for src in (add, mm):
        triton.compile(src, target=target, options={"num_warps": 4})
