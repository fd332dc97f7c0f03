"""A batched decode step of several sequences (different slots, different positions) gives each row
exactly the logits its own one-token step gives (the step the llama.cpp golden tests check), in one
pass of the fused CPU layer, and on a GPU in graph replays of up to 16 rows each (64, in buckets, where
every product runs on the tensor-core rows, int8 or float16)."""

from __future__ import annotations

import gguf
import pytest
import torch

from gufo.engine.engine import Engine
from gufo.engine.sampling import QueuedTokens, first_max_queued
from gufo.errors import BadInputError
from gufo.options import KernelOptions, RunOptions
from tests.engine.tiny_model import write_tiny_model

PROMPTS = [[1, 5, 9, 20], [3, 4], [7, 8, 9, 10, 11, 12, 13]]


def prefilled(model: str, prompts: list[list[int]] = PROMPTS, device: str = "cpu") -> Engine:
    options = RunOptions(threads=2, device=device)
    engine = Engine(model, options=options, context=128, n_slots=len(prompts))
    for slot, prompt in enumerate(prompts):
        engine.prefill(prompt, slot=slot)
    return engine


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_batched_rows_equal_their_own_decode_steps(model, monkeypatch):
    tokens, positions, slots = [42, 43, 44], [len(p) for p in PROMPTS], [0, 1, 2]
    alone = prefilled(model)
    want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, positions, slots, strict=True)])
    batched = prefilled(model)
    assert batched.model.decode_route.multi_slot
    monkeypatch.setattr(Engine, "decode_step", lambda *a, **k: pytest.fail("decode_batch fell back to rows"))
    got = batched.decode_batch(tokens, positions, slots)
    assert torch.equal(got, want)
    # the next step reads the KV entries the batched step wrote: still equal
    monkeypatch.undo()
    after = [alone.decode(7, p + 1, s) for p, s in zip(positions, slots, strict=True)]
    assert torch.equal(batched.decode_batch([7, 7, 7], [p + 1 for p in positions], slots), torch.stack(after))


def test_a_row_past_the_context_is_bad_input():
    engine = prefilled("smollm2-135m")
    with pytest.raises(BadInputError, match="context size 128"):
        engine.decode_batch([1, 2], [5, 128], [0, 1])


def gpu_model(name: str, tmp_path) -> str:
    """A model for the GPU tier: a real one by its alias, or "tiny", written here (a device machine may
    lack the model packages)."""
    if name != "tiny":
        return name
    return str(write_tiny_model(tmp_path / "tiny.gguf", n_embd=256, n_ff=512, head_dim=64))


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m", "tiny"])
def test_gpu_rows_equal_their_own_decode_steps(model, tmp_path, monkeypatch):
    """18 sequences (two replays: 16 rows, then 2), their slots out of order: each row bit for bit its own
    one-token graph step, this step and the next (which reads the KV entries the rows wrote)."""
    prompts = [[(7 * i + j) % 29 + 1 for j in range(1 + i % 5)] for i in range(18)]
    slots = [(5 * i) % 18 for i in range(18)]
    positions = [len(prompts[s]) for s in slots]
    path = gpu_model(model, tmp_path)
    alone, batched = prefilled(path, prompts, "cuda"), prefilled(path, prompts, "cuda")
    for step in range(2):
        tokens = [(step + s) % 29 + 1 for s in slots]
        rows = zip(tokens, positions, slots, strict=True)
        want = torch.stack([alone.decode(t, p, s) for t, p, s in rows])
        with monkeypatch.context() as patched:
            patched.setattr(
                Engine, "decode_step", lambda *a, **k: pytest.fail("decode_batch fell back to rows")
            )
            got = batched.decode_batch(tokens, positions, slots).cpu()
        assert torch.equal(got, want), step
        positions = [p + 1 for p in positions]


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["smollm2-135m", "tiny"])
@pytest.mark.parametrize("n_rows", [1, 18])
def test_gpu_steps_fed_queued_ids_are_the_steps_fed_host_ids(n_rows, model, tmp_path):
    """Greedy steps chained on the device as a server queues them: each step is fed the previous step's
    first maxima as device ids (`first_max_queued`), every third row a host id instead
    (`QueuedTokens.mixed`); each row's logits are bit for bit those of its one-token step fed the same id
    from the host, and `QueuedTokens.tolist` reads the ids the host's own rule picks."""
    prompts = [[(7 * i + j) % 29 + 1 for j in range(1 + i % 5)] for i in range(n_rows)]
    slots = [(5 * i) % n_rows for i in range(n_rows)]
    positions = [len(prompts[s]) for s in slots]
    path = gpu_model(model, tmp_path)
    alone, queued = prefilled(path, prompts, "cuda"), prefilled(path, prompts, "cuda")
    picked = QueuedTokens(torch.tensor([(10 + s) % 29 + 1 for s in slots], device="cuda"))
    for step in range(3):
        rows = [None if i % 3 == 2 else (i + step) % n_rows for i in range(n_rows)]
        host = [(20 + i) % 29 + 1 for i in range(n_rows)]
        got = queued.decode_batch(picked.mixed(rows, host), positions, slots)
        previous = picked.tolist()
        tokens = [host[i] if r is None else previous[r] for i, r in enumerate(rows)]
        want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, positions, slots, strict=True)])
        assert torch.equal(got.cpu(), want), step
        picked = QueuedTokens(first_max_queued(got))
        assert picked.tolist() == [row.tolist().index(max(row.tolist())) for row in want], step
        positions = [p + 1 for p in positions]


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["tensor", "f16"])
@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_K])
def test_gpu_64_rows_on_the_tensor_rows_equal_their_own_decode_steps(tmp_path, qtype, route, monkeypatch):
    """A model whose every product runs on the tensor-core rows (--row-products tensor, every matrix on
    int8 rows; or f16, every matrix float16) takes the 64-row route (the vector products keep 16); 70
    sequences, slots out of order, in steps of 70 rows (a 64-row replay, then 6), 33 (the 48-row bucket,
    15 padding rows) and 17 (the 32-row one): each row bit for bit its own one-token graph step, each
    step reading the KV entries the previous one wrote, and no real slot written past its sequence by
    the steps (the padding rows write the trash page; prefill's padded graph buckets leave KV past a
    prompt, which nothing reads before the real token there writes: docs/decisions.md, "Prefill replays
    piecewise CUDA graphs")."""
    path = write_tiny_model(tmp_path / "tiny.gguf", n_embd=256, n_ff=512, head_dim=64, qtype=qtype)
    wide = KernelOptions(row_products=route, int8_min_weights=0)
    vector = Engine(path, RunOptions(device="cuda", kernels=KernelOptions(int8_min_weights=0)), context=64)
    assert vector.model.decode_route.name == "cuda:torch-layer-per-token"
    assert vector.graph_decoder.max_tokens == 16 and vector.cache.scratch_slot is None
    n = 70
    prompts = [[(7 * i + j) % 29 + 1 for j in range(1 + i % 5)] for i in range(n)]
    engines = []
    for _ in range(2):
        engine = Engine(path, RunOptions(device="cuda", kernels=wide), context=64, n_slots=n)
        for slot, prompt in enumerate(prompts):
            engine.prefill(prompt, slot=slot)
        engines.append(engine)
    alone, batched = engines
    assert batched.model.decode_route.name == "cuda:torch-layer-per-token-64-rows"
    assert batched.graph_decoder.max_tokens == 64 and batched.cache.scratch_slot == n
    layers = range(len(batched.cache.keys))
    after_prefill = {
        (layer, s): batched.cache.entries(layer, s, 64)[0].clone() for layer in layers for s in range(n)
    }
    order = [(3 * i) % n for i in range(n)]
    lengths = {slot: len(prompt) for slot, prompt in enumerate(prompts)}
    for step, slots in enumerate((order, order[:33], order[33:50])):
        tokens = [(step + s) % 29 + 1 for s in slots]
        positions = [lengths[s] for s in slots]
        want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, positions, slots, strict=True)])
        with monkeypatch.context() as patched:
            patched.setattr(
                Engine, "decode_step", lambda *a, **k: pytest.fail("decode_batch fell back to rows")
            )
            got = batched.decode_batch(tokens, positions, slots).cpu()
        assert torch.equal(got, want), step
        lengths.update((s, p + 1) for s, p in zip(slots, positions, strict=True))
    for (layer, slot), before in after_prefill.items():
        keys = batched.cache.entries(layer, slot, 64)[0]
        assert torch.equal(keys[:, lengths[slot] :], before[:, lengths[slot] :]), slot
