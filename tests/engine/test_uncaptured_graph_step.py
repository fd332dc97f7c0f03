"""The decode step a CUDA graph would replay, run uncaptured (what `gufo profile` runs on a GPU): on the
torch reference backend (device positions, the fused attention-heads op) it gives the eager step's
logits and writes the same KV entries."""

from __future__ import annotations

import pytest
import torch

from gufo.engine.graphs.decode import GraphDecoder
from gufo.gguf.model_file import open_model_file
from gufo.models.registry import build_model
from tests.engine.tiny_model import write_tiny_model


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@torch.inference_mode()
def test_uncaptured_step_matches_the_eager_step(tmp_path, arch):
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf", arch)), "torch")
    eager_cache, step_cache = model.new_cache(1, 32), model.new_cache(1, 32)
    prompt = torch.tensor([1, 5, 9, 2, 7, 3, 11])  # longer than gemma3's 5-token window
    for cache in (eager_cache, step_cache):
        model.forward(prompt, cache, 0, 0)
    steps = GraphDecoder(model, step_cache, torch.device("cpu"), capture=False)
    for position, token in enumerate([4, 8, 6], start=len(prompt)):
        eager = model.forward(torch.tensor([token]), eager_cache, 0, position)[-1]
        torch.testing.assert_close(steps.decode([token], position, 0)[-1], eager, rtol=1e-5, atol=1e-5)
    assert steps.graphs == {} and steps.capture_seconds == 0.0  # nothing was captured
    end = len(prompt) + 3
    for eager_keys, step_keys in zip(eager_cache.keys, step_cache.keys, strict=True):
        torch.testing.assert_close(step_keys[0, :, :end], eager_keys[0, :, :end])
