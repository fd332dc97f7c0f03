"""Candidate launches of the one-row int8 decode products for the bandwidth sweep
(`scripts/gemv_bandwidth.py --sweep`, issue 21): per format a few tiles, warp counts, a K split and the
lattice formats' decoding switches (gemv_int8.Decoding), timed against launch.INT8_SHAPES' entry. Every
candidate gives the same values up to float32 summation order (tests/kernels/test_triton_gemv.py) and
compiles without scratch for sm_90 (own_fixtures, `gufo kernels own`); the measured winner of a format
goes into its INT8_SHAPES entry.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import GGMLQuantizationType

from gufo.kernels.triton.gemv_int8 import DECODING, Decoding
from gufo.kernels.triton.launch import DecodeConfig, fitted, int8_config

Q = GGMLQuantizationType

SWEEP_SHAPES = ((4096, 4096), (4096, 12288), (12288, 4096))  # (N, K): Qwen3-8B's attention output, down, up
SWEEP_FORMATS = (Q.IQ3_S, Q.IQ3_XXS, Q.IQ2_XXS, Q.IQ4_XS, Q.IQ4_NL, Q.Q4_K)  # Q4_K: the reference
# (BLOCK_N, STEP, num_warps): more rows or warps per program for the lattice formats' dependent grid
# reads to overlap, shorter steps for fewer live registers, and 2 warps for more programs per SM
TILES = ((4, 1024, 4), (8, 1024, 4), (16, 512, 4), (8, 2048, 8), (16, 1024, 8), (32, 512, 8), (4, 2048, 2))
SWITCHED_TILES = (1, 4)  # the TILES that also run with every switch on
# the lattice formats' grid in shared memory (Decoding.shared_grid), alone: on today's tile, with the
# other switches there, and on these TILES (today's neighbours: half the step, twice the warps, both)
SHARED = Decoding(shared_grid=True)
SHARED_TILES = (1, 3, 4)
SPLIT_TILE = DecodeConfig(16, 1024, 4, splits=2)  # fewer row tiles, each K split in two
MAX_CANDIDATES = 20
# candidates that compiled with scratch for sm_90 (Triton 3.6, `gufo kernels own`), so never timed:
# IQ4_NL's one-row 4 x 2048 tile on 2 warps, an 8-byte stack frame
SPILLED = {Q.IQ4_NL: (DecodeConfig(4, 2048, 2),)}


def candidates(qtype: GGMLQuantizationType, n: int, k: int) -> tuple[DecodeConfig, ...]:
    """The sweep's launches of an [n, k] weight, today's (`launch.int8_config`) first, each fitted to
    k; at most MAX_CANDIDATES, no two alike. The lattice formats' switches go on today's tile one by
    one, then all together there and on two of the TILES (all but shared_grid, which goes with them on
    today's tile and alone on SHARED_TILES)."""
    default = int8_config(qtype, n, k)
    found = [default]
    switches = DECODING.get(qtype, ())
    if switches:
        every = Decoding(**{name: True for name in switches if not getattr(SHARED, name)})
        found += [replace(default, decoding=Decoding(**{name: True})) for name in switches]
        found += [replace(default, decoding=d) for d in (every, replace(every, shared_grid=True))]
        found += [DecodeConfig(*TILES[i], decoding=every) for i in SWITCHED_TILES]
        found += [DecodeConfig(*TILES[i], decoding=SHARED) for i in SHARED_TILES]
    found += [DecodeConfig(*tile) for tile in TILES] + [SPLIT_TILE]
    unique: list[DecodeConfig] = []
    for config in (fitted(qtype, c, k) for c in found):
        if config not in unique and config not in SPILLED.get(qtype, ()):
            unique.append(config)
    return tuple(unique[:MAX_CANDIDATES])


def every_candidate(qtype: GGMLQuantizationType) -> tuple[DecodeConfig, ...]:
    """The candidates of all SWEEP_SHAPES, each once (what the tests and `gufo kernels own` check)."""
    unique: list[DecodeConfig] = []
    for n, k in SWEEP_SHAPES:
        unique += [c for c in candidates(qtype, n, k) if c not in unique]
    return tuple(unique)
