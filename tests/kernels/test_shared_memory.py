"""`fitting_stages`: the pipeline stages a tile launch keeps on a device, against the shared memory per
block worked out by hand for the prefill tiles' launches on an H100 (227 KiB: all kept) and an RTX 4090 or
A10-class card (99 KiB: fewer)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from gufo.kernels.triton import shared_memory  # noqa: E402

H100, SM89 = 232448, 101376  # bytes a block may use: sm_90, sm_86/sm_89


@pytest.mark.parametrize(
    "limit,fixed,per_stage,want",
    [
        (H100, 0, (128 + 256) * 64 * 2, 3),  # the tile product, 128x256x64 float16: 144 KiB in 3 stages
        (SM89, 0, (128 + 256) * 64 * 2, 2),  # 96 KiB in 2
        (H100, 128 * 128 * 2, 64 * 256 * 2, 3),  # the tile attention, 128-wide heads: 128 KiB in 3
        (SM89, 128 * 128 * 2, 64 * 256 * 2, 2),  # 96 KiB in 2
        (SM89, 0, 200_000, 1),  # nothing fits: one stage (Triton's launch then says why)
    ],
)
def test_stages_fit_the_block_limit(monkeypatch, limit, fixed, per_stage, want):
    monkeypatch.setattr(shared_memory, "_block_limit", lambda index: limit)
    assert shared_memory.fitting_stages(torch.device("cuda", 0), 3, fixed, per_stage) == want


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_devices_without_the_limit_keep_their_stages(device):
    assert shared_memory.fitting_stages(torch.device(device), 3, 0, 10**9) == 3
