"""The engine on a GPU against the same engine on the CPU (itself checked against llama.cpp's goldens),
on a small `gufo synth` qwen3 file; and --validate-prefill on the GPU. Skipped without a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from gufo.engine.engine import Engine, PrefillPart
from gufo.options import KernelOptions, RunOptions
from gufo.tools.quality.logit_diff import compare_logits
from gufo.tools.quality.validate_prefill import validate_prefill
from gufo.tools.synth.presets import find_preset
from gufo.tools.synth.type_mix import find_mix
from gufo.tools.synth.writer import plan_qwen3, write_synth

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["Q4_K_M", "Q8_0", "Q4_0"])
def synth_model(request, tmp_path_factory):
    from gufo.gguf.aliases import resolve_model
    from gufo.gguf.model_file import open_model_file

    vocab = open_model_file(resolve_model(os.environ.get("GUFO_TEST_VOCAB", "smollm2-135m")))
    shape = find_preset("qwen3", "0.6b")
    plan = plan_qwen3("0.6b", shape.with_layers(4), find_mix(request.param), vocab)
    out = tmp_path_factory.mktemp("synth") / f"qwen3-{request.param}.gguf"
    write_synth(plan, out)
    return out


def test_gpu_logits_match_the_cpu_engine(synth_model):
    tokens = list(range(100, 164))
    cpu = Engine(synth_model, context=128).prefill(tokens, all_logits=True)
    gpu_engine = Engine(synth_model, options=RunOptions(device="cuda"), context=128)
    gpu = gpu_engine.prefill(tokens, all_logits=True)
    for position in (0, 31, 63):
        diff = compare_logits(cpu[position], gpu[position])
        # the CPU quantizes activations to int8 per 32 values (as llama.cpp); the GPU does not
        assert diff.finite and diff.cosine > 0.999, (position, diff)
    decoded = gpu_engine.decode(7, len(tokens))
    assert compare_logits(Engine(synth_model, context=128).prefill([*tokens, 7]), decoded).cosine > 0.999


def test_validate_prefill_on_gpu(synth_model):
    engine = Engine(synth_model, options=RunOptions(device="cuda"), context=512)
    engine.batch_size = 100  # 256 = 100 + 100 + 56: chunks that do not divide the prompt
    result = validate_prefill(engine, 256)
    assert result.passed, result.lines()


def test_prefill_graphs_equal_eager_prefill(synth_model):
    """Full prefill chunks replay piecewise graphs (attention eager between them): every token's logits
    and the KV they write equal the eager layers' bit for bit, for chunks at three depths in slot 1."""
    prompt = list(range(100, 292))  # 3 chunks of 64: one capture, then two replays deeper in the cache
    graphed = Engine(synth_model, options=RunOptions(device="cuda"), context=256, n_slots=2, batch_size=64)
    eager = Engine(
        synth_model, options=RunOptions(device="cuda", graphs=False), context=256, n_slots=2, batch_size=64
    )
    got = graphed.prefill(prompt, slot=1, all_logits=True)
    want = eager.prefill(prompt, slot=1, all_logits=True)
    assert list(graphed.prefill_graphs.graphs) == [64]
    assert torch.equal(got, want)
    for layer in range(len(eager.cache.keys)):
        mine, theirs = (engine.cache.entries(layer, 1, len(prompt)) for engine in (graphed, eager))
        pairs = zip(mine, theirs, strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)


# chunk lengths replayed padded to their bucket (batch 64: buckets 16, 32, 64), and two that fill theirs
PADDED_LENGTHS = (1, 5, 16, 17, 31, 33, 50, 64)
# A padded chunk's products run on more rows than the eager chunk's, so they may take another tiling or
# split of the float32 sums; activations are rounded to float16 (unit roundoff 2**-11) before products,
# so an element that rounds the other way moves the result by about 2**-11 of its size. 16 such ulps of
# the largest logit bound what 4 layers add up; a lead over twice that cannot swap the top-1 token.
LOGIT_ULPS = 16 * 2.0**-11


def test_padded_prefill_chunks_agree_with_eager_prefill(synth_model):
    """Chunks of several lengths, padded to their bucket and replayed, give every token the eager
    layers' top-1 token and logits within float16 rounding, and write the same KV within it too."""
    graphed = Engine(synth_model, options=RunOptions(device="cuda"), context=256, batch_size=64)
    eager = Engine(synth_model, options=RunOptions(device="cuda", graphs=False), context=256, batch_size=64)
    for length in PADDED_LENGTHS:
        prompt = [100 + (7 * i + length) % 400 for i in range(length)]
        got = graphed.prefill(prompt, all_logits=True)
        want = eager.prefill(prompt, all_logits=True)
        bound = LOGIT_ULPS * float(want.abs().max())
        for position in range(length):
            diff = compare_logits(want[position], got[position])
            assert diff.finite and diff.max_abs_diff <= bound, (length, position, diff)
            if diff.reference_margin > 2 * bound:
                assert diff.top1_match, (length, position, diff)
        for layer in range(len(eager.cache.keys)):
            mine, theirs = (
                graphed.cache.entries(layer, 0, length)[0],
                eager.cache.entries(layer, 0, length)[0],
            )
            assert torch.allclose(mine, theirs, atol=LOGIT_ULPS * float(theirs.abs().max()))
    assert sorted(graphed.prefill_graphs.graphs) == [16, 32, 64]


def test_prefill_graphs_serve_every_slot_alike(synth_model):
    """One set of graphs per chunk length serves every slot: the same prompt (a full chunk and a padded
    tail) in slots 0 and 2 gives bit-identical logits and KV, after other prompts ran in slot 1."""
    engine = Engine(synth_model, options=RunOptions(device="cuda"), context=256, n_slots=3, batch_size=64)
    prompt = list(range(300, 400))  # 64 + 36, the tail padded to 64
    first = engine.prefill(prompt, slot=0, all_logits=True)
    engine.prefill(list(range(10, 130)), slot=1)  # 64 + 56: the same graphs, other values in the buffers
    second = engine.prefill(prompt, slot=2, all_logits=True)
    assert torch.equal(first, second)
    assert list(engine.prefill_graphs.graphs) == [64]
    for layer in range(len(engine.cache.keys)):
        zero, one, two = (engine.cache.entries(layer, slot, len(prompt)) for slot in range(3))
        assert all(torch.equal(a, b) for a, b in zip(zero, two, strict=True))
        assert not torch.equal(zero[0], one[0])  # slot 1 holds its own prompt


@pytest.mark.parametrize("length", [40, 150, 200])
def test_chunked_prefill_repeats_bit_for_bit(synth_model, length):
    """A prompt prefilled in chunks of 64 (its tail padded) gives the same logits again: the first run
    captures the graphs, the second replays them, after a prompt whose tail shares the bucket."""
    engine = Engine(synth_model, options=RunOptions(device="cuda"), context=256, batch_size=64)
    prompt = [1 + (5 * i) % 500 for i in range(length)]
    first = engine.prefill(prompt, all_logits=True)
    engine.prefill(list(range(200, 200 + length - 3)), all_logits=True)
    assert torch.equal(engine.prefill(prompt, all_logits=True), first)


def test_packed_prefill_gives_each_part_its_numbers_alone(synth_model):
    """Chunks of more than 64 tokens of three sequences in one packed pass (`prefill_parts`: one replay of
    their rows, padded to 512, each part's attention over its own slot) give each part the last logits
    and the KV its chunk gets alone (`prefill`, its own bucket), bit for bit; twice, the second time
    deeper in the slots. The oracle is the engine's single-sequence prefill, itself checked against
    the CPU engine and eager layers above. On gufo's fixed tiles only: with cuBLAS (which picks kernels
    by the shape: a chunk of 100 tokens alone moved its logits by 0.017 on the H100) nothing packs."""
    tiles = RunOptions(device="cuda", kernels=KernelOptions(prefill_products="tiles"))
    packed = Engine(synth_model, options=tiles, context=512, n_slots=3, batch_size=256)
    alone = Engine(synth_model, options=tiles, context=512, n_slots=3, batch_size=256)
    prompts = [[1 + (11 * i + 3 * slot) % 500 for i in range(400)] for slot in range(3)]
    cuts = [(0, 150), (0, 100), (0, 200)], [(150, 250), (100, 300), (200, 290)]  # 450 rows, then 390
    for rounds in cuts:
        parts = [PrefillPart(slot, a, prompts[slot][a:b]) for slot, (a, b) in enumerate(rounds)]
        got = packed.prefill_parts(parts)
        want = [alone.prefill(part.tokens, part.slot, part.start) for part in parts]
        for part, mine, theirs in zip(parts, got, want, strict=True):
            assert torch.equal(mine, theirs), (part.slot, part.start, float((mine - theirs).abs().max()))
    assert 512 in packed.prefill_graphs.graphs  # the packed pass replayed, not each part alone
    for layer in range(len(alone.cache.keys)):
        for slot, (_, end) in enumerate(cuts[1]):
            mine, theirs = packed.cache.entries(layer, slot, end), alone.cache.entries(layer, slot, end)
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), (layer, slot)
    cublas = Engine(synth_model, options=RunOptions(device="cuda"), context=512, n_slots=3, batch_size=256)
    assert not cublas.packs_prefill(100) and packed.packs_prefill(65) and packed.packs_prefill(1)


def test_tiled_prefill_gives_a_token_its_numbers_whatever_its_chunk(synth_model):
    """On the fixed tiles (`tiled_prefill`) a prompt prefilled whole and in chunks cut anywhere (1, 36,
    113 and 149 tokens, the last 1) gives the same last logits and the same KV, bit for bit; so a prompt
    that reuses another's prefilled tokens up to any length (`PromptCache`, reusing 123) gets the logits
    of its own fresh prefill. The oracle is the engine's whole-prompt prefill, itself within float16
    rounding of cuBLAS's (the default route, checked against the CPU engine above)."""
    from gufo.engine.prompt_cache import PromptCache

    tiles = RunOptions(device="cuda", kernels=KernelOptions(prefill_products="tiles"))
    whole = Engine(synth_model, options=tiles, context=512, n_slots=2, batch_size=256)
    assert whole.tiled_prefill and whole.chunk_invariant_prefill and not whole.invariant_prefill
    assert whole.model.routes()["attention_prefill"] == "cuda:triton-attention-prefill-tiles"
    prompt = [1 + (13 * i) % 500 for i in range(300)]
    want = whole.prefill(prompt, all_logits=True)
    chunked = Engine(synth_model, options=tiles, context=512, n_slots=2, batch_size=256)
    start = 0
    for length in (1, 36, 113, 149, 1):
        got = chunked.prefill(prompt[start : start + length], start=start)
        start += length
        assert torch.equal(got, want[start - 1]), start
    for layer in range(len(whole.cache.keys)):
        mine, theirs = chunked.cache.entries(layer, 0, 300), whole.cache.entries(layer, 0, 300)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), layer
    cublas = Engine(synth_model, options=RunOptions(device="cuda"), context=512).prefill(prompt)
    assert compare_logits(cublas, want[-1]).cosine > 0.999
    cache = PromptCache(chunked, 256)
    cache.prefill(1, prompt)
    second = prompt[:123] + [7, 8, 9]
    logits, reused = cache.prefill(1, second)
    assert reused == 123 and torch.equal(logits, whole.prefill(second, slot=1))


def test_a_server_captures_its_prefill_buckets_at_load(synth_model):
    """`prepare_prefill` captures every bucket a server's chunks reach, so its prompts only replay."""
    engine = Engine(synth_model, options=RunOptions(device="cuda"), context=256, batch_size=64)
    engine.prepare_prefill(64)
    assert sorted(engine.prefill_graphs.graphs) == [16, 32, 64]
    captured = engine.graph_capture_seconds
    engine.prefill(list(range(100, 170)))  # 64 + 6: replays only
    assert engine.graph_capture_seconds == captured


def test_graph_replay_equals_eager_decode(synth_model):
    """Captured decode steps give the eager steps' logits, across a span boundary and in slot 1; one
    graph serves both spans."""
    prompt = list(range(200, 450))  # decode from position 250: spans 256 and 512
    graphed = Engine(synth_model, options=RunOptions(device="cuda"), context=600, n_slots=2)
    eager = Engine(synth_model, options=RunOptions(device="cuda", graphs=False), context=600, n_slots=2)
    for engine in (graphed, eager):
        engine.prefill(prompt, slot=1)
    for offset, token in enumerate(range(11, 21)):
        want = eager.decode(token, len(prompt) + offset, slot=1)
        got = graphed.decode(token, len(prompt) + offset, slot=1)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), offset
    assert graphed.graph_capture_seconds > 0 and list(graphed.graph_decoder.graphs) == [(1, 1)]


def test_speculative_verification_is_bit_identical(synth_model):
    """Drafted tokens verified in one pass (a captured multi-token graph, and eagerly) give exactly the
    graph-replayed one-token steps' logits (greedy speculation cannot change the output), across a
    256-entry span boundary."""
    engine = Engine(synth_model, options=RunOptions(device="cuda"), context=600)
    eager = Engine(synth_model, options=RunOptions(device="cuda", graphs=False), context=600)
    prompt = list(range(300, 550))
    drafted = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41]  # positions 250..259
    engine.prepare_verification(len(drafted))  # captured up front: verification replays, never captures
    assert set(engine.graph_decoder.graphs) == {(0, n) for n in range(1, len(drafted) + 1)}
    captured = engine.graph_decoder.capture_seconds  # the decode graphs' (prefill captures its own)
    verified = []
    for each in (engine, eager):
        each.prefill(prompt)
        assert each.batch_invariant_decode
        verified.append(each.decode_tokens(drafted, len(prompt)).cpu())
    assert engine.graph_decoder.capture_seconds == captured
    for i, token in enumerate(drafted):
        step = engine.decode(token, len(prompt) + i)
        assert torch.equal(verified[0][i], step) and torch.equal(verified[1][i], step), i
