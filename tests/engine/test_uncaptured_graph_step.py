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
        fed = torch.tensor([token]) if position % 2 else [token]  # an id on the device, or the host's
        torch.testing.assert_close(steps.decode(fed, position, 0)[-1], eager, rtol=1e-5, atol=1e-5)
    assert steps.graphs == {} and steps.capture_seconds == 0.0  # nothing was captured
    end = len(prompt) + 3
    for layer in range(len(eager_cache.keys)):
        torch.testing.assert_close(step_cache.entries(layer, 0, end), eager_cache.entries(layer, 0, end))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@torch.inference_mode()
def test_a_step_of_several_sequences_matches_each_alone(tmp_path, arch):
    """A step of three sequences in one pass (each row's slot and position on the device, as a server's
    batched graph replay takes them) gives each row its own eager step's logits and writes each slot's KV
    entries only; the rows name their slots out of order, and the second step's ids are a tensor on the
    device (a server's queued step)."""
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf", arch)), "torch")
    eager_cache, rows_cache = model.new_cache(3, 32), model.new_cache(3, 32)
    prompts = {0: [1, 5, 9, 2, 7, 3, 11], 1: [4, 4], 2: [8, 1, 6, 2, 9]}
    for cache in (eager_cache, rows_cache):
        for slot, prompt in prompts.items():
            model.forward(torch.tensor(prompt), cache, slot, 0)
    steps = GraphDecoder(model, rows_cache, torch.device("cpu"), max_tokens=3, capture=False)
    order = [2, 0, 1]
    lengths = {slot: len(prompt) for slot, prompt in prompts.items()}
    for tokens in ([3, 10, 7], torch.tensor([12, 2, 5])):
        positions = [lengths[slot] for slot in order]
        got = steps.decode_rows(tokens, positions, order)
        for row, (token, position, slot) in enumerate(zip(tokens, positions, order, strict=True)):
            eager = model.forward(torch.tensor([int(token)]), eager_cache, slot, position)[-1]
            torch.testing.assert_close(got[row], eager, rtol=1e-5, atol=1e-5)
            lengths[slot] += 1
    for layer in range(len(eager_cache.keys)):
        for slot, length in lengths.items():
            got, _ = rows_cache.entries(layer, slot, rows_cache.page_size)
            torch.testing.assert_close(got[:, :length], eager_cache.entries(layer, slot, length)[0])
            assert not got[:, length:].any()  # nothing written past each sequence


@torch.inference_mode()
def test_uncaptured_draft_verification_matches_the_eager_steps(tmp_path):
    """Several consecutive tokens of one sequence in one step (speculative verification) beside the
    inputs' slots row of batched steps: each token its eager step's logits."""
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf", "llama")), "torch")
    eager_cache, step_cache = model.new_cache(2, 32), model.new_cache(2, 32)
    prompt = torch.tensor([1, 5, 9, 2])
    for cache in (eager_cache, step_cache):
        model.forward(prompt, cache, 1, 0)
    steps = GraphDecoder(model, step_cache, torch.device("cpu"), max_tokens=3, capture=False)
    got = steps.decode([4, 8, 6], len(prompt), 1)
    for row, token in enumerate([4, 8, 6]):
        eager = model.forward(torch.tensor([token]), eager_cache, 1, len(prompt) + row)[-1]
        torch.testing.assert_close(got[row], eager, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_rows_over_shared_pages_match_rows_over_own_pages(tmp_path):
    """Slot 1 takes over 13 of slot 0's 20 tokens (one shared page of 8, a copied second), both step
    twice in one uncaptured rows step (device positions through the page table), then slot 1 goes back
    to 5 tokens, inside the shared page, and steps again (a copy on write): every row bit for bit a
    cache's where slot 1 holds pages of its own, and slot 0's entries untouched by slot 1's."""
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf", "llama")), "torch")
    own, shared = (model.new_cache(2, 64, page_size=8) for _ in range(2))
    prompt = torch.tensor([(7 * i) % 29 + 1 for i in range(20)])
    for slot, cache in ((0, own), (1, own), (0, shared)):
        model.forward(prompt, cache, slot, 0)  # slot 1 of `own`: its first 13 entries computed alike
    own.release(1, 13)
    shared.copy_prefix(0, 1, 13)
    assert shared.held[1][0] == shared.held[0][0] and shared.held[1][1] != shared.held[0][1]
    steps = [
        GraphDecoder(model, cache, torch.device("cpu"), max_tokens=2, capture=False)
        for cache in (own, shared)
    ]
    for positions, tokens in (([20, 13], [3, 7]), ([21, 14], [11, 2])):
        want, got = (step.decode_rows(tokens, positions, [0, 1]) for step in steps)
        assert torch.equal(got, want)
    for cache in (own, shared):
        cache.release(1, 5)
    want, got = (step.decode_rows([9], [5], [1]) for step in steps)
    assert torch.equal(got, want) and shared.held[1][0] != shared.held[0][0]
    for layer in range(len(own.keys)):
        pairs = zip(shared.entries(layer, 0, 22), own.entries(layer, 0, 22), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
