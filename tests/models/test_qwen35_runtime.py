"""The hybrid qwen35 through the runtime: --validate-prefill (also with uneven prefill chunks), cache
snapshots with the recurrent state, speculative greedy parity, and rollback of rejected drafts."""

from __future__ import annotations

from collections.abc import Sequence

import gguf
import pytest
import torch
from qwen35_gguf import tiny_hf_model, write_gguf

from gufo.engine.engine import Engine
from gufo.engine.graphs.decode import GraphDecoder
from gufo.engine.sampling import Sampler, SamplingParams
from gufo.engine.speculative import (
    Draft,
    DraftModelProposer,
    NgramProposer,
    SpeculativeParams,
    Speculator,
)
from gufo.gguf.model_file import open_model_file
from gufo.models.registry import build_model
from gufo.options import RunOptions
from gufo.tools.quality.validate_prefill import validate_prefill
from tests.conftest import gufo
from tests.engine.scripted_proposer import check_rejections_leave_plain_state

pytest.importorskip("transformers")

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_gguf(tiny_hf_model(interval=2), tmp_path_factory.mktemp("qwen35") / "tiny-qwen35.gguf")


@pytest.fixture(scope="module")
def int8_model_path(tmp_path_factory):
    """Q8_0 matrices: every product runs on the CPU's int8 kernel."""
    path = tmp_path_factory.mktemp("qwen35-q8_0") / "tiny-qwen35-q8_0.gguf"
    return write_gguf(tiny_hf_model(interval=2), path, gguf.GGMLQuantizationType.Q8_0)


def state_tensors(engine: Engine, length: int) -> list[torch.Tensor]:
    """The slot-0 cache a continuation reads: KV of positions < length, and the recurrent state."""
    cache = engine.cache
    kv = [t.clone() for layer in range(len(cache.keys)) for t in cache.entries(layer, 0, length)]
    return kv + cache.recurrent.save(0)


def poison(engine: Engine) -> None:
    """NaN everywhere in the cache, so nothing of an earlier run can go unnoticed."""
    cache = engine.cache
    for t in (*cache.keys, *cache.values, *cache.recurrent.conv.values(), *cache.recurrent.delta.values()):
        t.fill_(float("nan"))


@pytest.mark.parametrize("batch_size", [100, 64, 2048])  # 100 + 100 + 56; 4 x 64; one pass
def test_validate_prefill_256(model_path, batch_size):
    engine = Engine(model_path, context=256, batch_size=batch_size)
    result = validate_prefill(engine, 256)
    assert result.passed, result.lines()
    assert result.diff.max_abs_diff < 1e-3 and result.diff.cosine > 0.99999


def test_validate_prefill_cli_with_uneven_ubatch(capsys, model_path):
    code, out, err = gufo(capsys, "bench", "-m", str(model_path), "--validate-prefill", "256", "-ub", "24",
                          "-p", "0", "-n", "0")  # fmt: skip
    assert code == 0 and out == ""
    assert "[Prefill Validation] tokens=256" in err and "top1_match=yes finite=yes" in err


def test_int8_prefill_gives_every_position_the_decode_logits_bit_for_bit(int8_model_path):
    """On the int8 kernel prefill (here in uneven chunks) runs the layers token by token between batched
    products, as decode does: int8 activation rounding turns any float difference of the two paths into
    whole-step flips that grow with depth (the 24-layer 0.8B synth file: cosine 0.995 before)."""
    engine = Engine(int8_model_path, context=128, batch_size=48)
    tokens = [(i * 37 + 5) % 128 for i in range(100)]
    steps = torch.stack([engine.decode(t, i) for i, t in enumerate(tokens)])
    assert float((engine.prefill(tokens, all_logits=True) - steps).abs().max()) == 0.0
    assert engine.model.routes()["decode_layer"] == "cpu:torch-layer-per-token"


def test_snapshot_restore_round_trips_the_recurrent_state(model_path):
    engine = Engine(model_path, context=128)
    prompt = list(range(3, 53))
    engine.prefill(prompt)
    expected_state = state_tensors(engine, len(prompt))
    snapshot = engine.cache.snapshot(0, len(prompt))
    assert snapshot.recurrent is not None
    expected_next = engine.decode(9, len(prompt))
    poison(engine)
    engine.cache.restore(snapshot)
    assert all(
        torch.equal(a, b) for a, b in zip(state_tensors(engine, len(prompt)), expected_state, strict=True)
    )
    assert torch.equal(engine.decode(9, len(prompt)), expected_next)


def test_position_zero_starts_a_new_sequence(model_path):
    engine = Engine(model_path, context=128)
    first = engine.prefill([1, 5, 6, 7])
    engine.prefill(list(range(10, 60)))  # another sequence in the same slot
    assert torch.equal(engine.prefill([1, 5, 6, 7]), first)


def test_ngram_speculation_is_greedy_faithful(model_path):
    engine = Engine(model_path, context=256)
    speculator = Speculator(engine, NgramProposer(SpeculativeParams("ngram", draft_max=5, ngram_min=1)))
    prompts = [[1, 5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43, 40, 41, 42], [1, 99, 3, 17, 64]]
    accepted = 0
    for prompt in prompts:
        plain = engine.generate(prompt, 48, GREEDY, stop_at_eog=False)
        fast = speculator.generate(prompt, 48, GREEDY, stop_at_eog=False)
        assert fast.generated_ids == plain.generated_ids
        accepted += speculator.stats.accepted
    assert accepted > 0  # drafts were kept, so the verification really ran several tokens


def test_hybrid_draft_model_refeeds_after_rejections(model_path, tmp_path):
    """A qwen35 draft model (other weights, same vocabulary) cannot rewind its recurrent state after its
    drafts are rejected: it feeds the context again, so each proposal equals that of a draft model that
    starts from scratch, and the output stays the target's greedy output."""
    draft_path = write_gguf(tiny_hf_model(interval=2, seed=1), tmp_path / "draft.gguf")
    target = Engine(model_path, context=256)
    draft, fresh_draft = Engine(draft_path, context=256), Engine(draft_path, context=256)
    params = SpeculativeParams("draft", draft_max=3)
    proposals: list[tuple[list[int], list[int]]] = []

    class Checked(DraftModelProposer):
        def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft:
            got = super().propose(history, limit, sampler)
            fresh = DraftModelProposer(fresh_draft, target, params).propose(history, limit, sampler)
            proposals.append((got.tokens, fresh.tokens))
            return got

    speculator = Speculator(target, Checked(draft, target, params))
    prompt = [1, 5, 6, 7, 5, 6, 7, 5, 6]
    plain = target.generate(prompt, 32, GREEDY, stop_at_eog=False)
    assert speculator.generate(prompt, 32, GREEDY, stop_at_eog=False).generated_ids == plain.generated_ids
    assert speculator.stats.accepted < speculator.stats.drafted  # rejections happened
    assert all(got == fresh for got, fresh in proposals)


def test_rejected_drafts_leave_the_state_of_plain_decoding(model_path):
    """Drafts rejected at every position: the KV prefix and the recurrent state equal, bit for bit, a
    run that never drafted."""
    check_rejections_leave_plain_state(Engine(model_path, context=128), state_tensors, poison)


def test_int8_verification_is_one_pass_with_the_decode_logits(int8_model_path):
    """On the batch-invariant int8 route the drafts are verified in one pass (no decode step), each
    token's logits those of its own decode step bit for bit."""
    prompt, tokens = [1, 5, 6, 7, 5, 6], [9, 40, 3, 17, 64, 2]
    plain = Engine(int8_model_path, context=64)
    plain.prefill(prompt)
    steps = torch.stack([plain.decode(t, len(prompt) + i) for i, t in enumerate(tokens)])
    engine = Engine(int8_model_path, context=64)
    engine.prefill(prompt)
    engine.decode_step = None  # any decode step would fail
    assert torch.equal(engine.decode_tokens(tokens, len(prompt)), steps)


def test_int8_rejected_drafts_leave_the_state_of_plain_decoding(int8_model_path):
    """The one-pass verification's checkpoints: after rejections at every draft position the state
    equals a run that never drafted, bit for bit."""
    check_rejections_leave_plain_state(Engine(int8_model_path, context=128), state_tensors, poison)


@torch.inference_mode()
def test_a_step_of_several_sequences_matches_each_alone(model_path):
    """A step of three sequences in one uncaptured pass (each row's slot and position on the device, as a
    server's batched graph replay takes them): each row its own eager step's logits, each slot its own
    recurrent state and KV entries. The rows name their slots out of order; one row starts a new
    sequence (position 0) in a slot whose state another sequence left."""
    model = build_model(open_model_file(model_path), "torch")
    eager_cache, rows_cache = model.new_cache(3, 32), model.new_cache(3, 32)
    prompts = {0: [1, 5, 9, 2, 7, 3, 11], 1: [4, 4, 8], 2: [8, 1, 6, 2, 9]}
    for cache in (eager_cache, rows_cache):
        for slot, prompt in prompts.items():
            model.forward(torch.tensor(prompt), cache, slot, 0)
    steps = GraphDecoder(model, rows_cache, torch.device("cpu"), max_tokens=3, capture=False)
    order = [2, 0, 1]
    lengths = {0: 7, 1: 0, 2: 5}  # slot 1's sequence starts over
    for tokens in ([3, 10, 7], [12, 2, 5]):
        positions = [lengths[slot] for slot in order]
        got = steps.decode_rows(tokens, positions, order)
        for row, (token, position, slot) in enumerate(zip(tokens, positions, order, strict=True)):
            eager = model.forward(torch.tensor([token]), eager_cache, slot, position)[-1]
            torch.testing.assert_close(got[row], eager, rtol=1e-5, atol=1e-5)
            lengths[slot] += 1
    for slot, length in lengths.items():
        states = zip(eager_cache.recurrent.save(slot), rows_cache.recurrent.save(slot), strict=True)
        for eager_state, rows_state in states:
            torch.testing.assert_close(rows_state, eager_state, rtol=1e-5, atol=1e-5)
        for layer in range(len(eager_cache.keys)):
            torch.testing.assert_close(
                rows_cache.entries(layer, slot, length), eager_cache.entries(layer, slot, length)
            )


@torch.inference_mode()
def test_uncaptured_verification_step_keeps_states_and_hidden_rows(model_path):
    """Several drafts of one sequence in one uncaptured pass (what a GPU's captured verification replays
    for `--speculative mtp`): each token its eager one-token step's logits and last-layer rows (the
    proposer's input), the checkpoints the recurrent state after each token but the last, the state
    after the pass the state after the last token. Near, not equal: torch's CPU products of 4 rows
    round apart from 1 row's (the GPU route's are batch-invariant)."""
    model = build_model(open_model_file(model_path), "torch")
    eager_cache, step_cache = model.new_cache(1, 32), model.new_cache(1, 32)
    prompt, tokens = [1, 5, 9, 2, 7], [3, 10, 7, 12]
    for cache in (eager_cache, step_cache):
        model.forward(torch.tensor(prompt), cache, 0, 0)
    steps = GraphDecoder(model, step_cache, torch.device("cpu"), max_tokens=4, capture=False)
    steps.keep_hidden()
    checkpoints = [step_cache.recurrent.save(0) for _ in range(len(tokens) - 1)]
    got = steps.decode(tokens, len(prompt), 0, checkpoints)
    for row, token in enumerate(tokens):
        hidden = model.final_hidden(torch.tensor([token]), eager_cache, 0, len(prompt) + row)
        torch.testing.assert_close(steps.hidden[row], hidden[-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[row], model.head(hidden, True)[-1], rtol=1e-4, atol=1e-4)
        kept = checkpoints[row] if row < len(checkpoints) else step_cache.recurrent.save(0)
        for state, eager_state in zip(kept, eager_cache.recurrent.save(0), strict=True):
            torch.testing.assert_close(state, eager_state, rtol=1e-4, atol=1e-4)
    assert not step_cache.recurrent.keeping(0)  # the pass's checkpoints only


@torch.inference_mode()
@pytest.mark.parametrize("n_tokens", [1, 3])
def test_a_device_position_step_at_zero_starts_the_slot_afresh(model_path, n_tokens):
    """A step at position 0 on the device (as a captured step replays it; uncaptured here) over a slot
    whose recurrent state another sequence left: the recurrent kernels restart the state (no host
    clear), so logits and states are a fresh cache's; a verification step keeps its checkpoints too."""
    model = build_model(open_model_file(model_path), "torch")
    fresh_cache, step_cache = model.new_cache(1, 32), model.new_cache(1, 32)
    model.forward(torch.tensor([4, 4, 8, 1]), step_cache, 0, 0)  # the state the step must not read
    tokens = [3, 10, 7][:n_tokens]
    steps = GraphDecoder(model, step_cache, torch.device("cpu"), max_tokens=3, capture=False)
    checkpoints = [step_cache.recurrent.save(0) for _ in range(n_tokens - 1)]
    got = steps.decode(tokens, 0, 0, checkpoints if checkpoints else None)
    for t, token in enumerate(tokens):
        want = model.forward(torch.tensor([token]), fresh_cache, 0, t)[-1]
        torch.testing.assert_close(got[t], want, rtol=1e-4, atol=1e-4)
        kept = checkpoints[t] if t < len(checkpoints) else step_cache.recurrent.save(0)
        for state, fresh_state in zip(kept, fresh_cache.recurrent.save(0), strict=True):
            torch.testing.assert_close(state, fresh_state, rtol=1e-4, atol=1e-4)


def test_only_attention_layers_hold_kv(model_path):
    engine = Engine(model_path, context=64)
    pages = [k.shape[1] for k in engine.cache.keys]
    assert pages == [
        0,
        2,
        0,
        2,
    ]  # interval 2: layers 1 and 3 are full attention (64 positions, the trash page)
    assert sorted(engine.cache.recurrent.conv) == [0, 2]
    assert not engine.rewindable
    assert engine.model.routes()["decode_layer"] == "torch:torch-layer"


@pytest.mark.gpu
def test_cuda_matches_the_cpu_with_and_without_graphs(model_path):
    """Same torch ops on the GPU; captured decode steps must advance the recurrent state once each."""
    tokens = [(i * 37) % 128 for i in range(200)]
    cpu = Engine(model_path, context=256).prefill(tokens, all_logits=True)
    for graphs in (True, False):
        engine = Engine(model_path, options=RunOptions(device="cuda", graphs=graphs), context=256)
        steps = torch.stack([engine.decode(t, i) for i, t in enumerate(tokens)])
        assert float((steps - cpu).abs().max()) < 1e-2  # float16 KV on GPUs (3e-3 measured on an H200)
        assert torch.equal(steps.argmax(-1), cpu.argmax(-1))
        # prefill products take float16 operands on the GPU (the Triton linear route), so only near
        prefill = engine.prefill(tokens, all_logits=True)
        assert float((prefill.argmax(-1) == cpu.argmax(-1)).float().mean()) > 0.9
        assert validate_prefill(engine, 256).passed


@pytest.mark.gpu
def test_cuda_batched_rows_equal_each_row_alone(model_path):
    """Graph replays of several sequences' steps (captured up front, as a server does; rows out of order,
    one starting at position 0): each row's logits and each slot's recurrent state bit for bit those of
    its own one-row steps."""
    prompts = {0: [1, 5, 9, 2, 7, 3, 11], 1: [4, 4, 8], 2: [8, 1, 6, 2, 9], 3: [3]}
    engines = [Engine(model_path, options=RunOptions(device="cuda"), context=64, n_slots=4) for _ in range(2)]
    for engine in engines:
        for slot, prompt in prompts.items():
            engine.prefill(prompt, slot=slot)
    alone, batched = engines
    assert batched.model.routes()["decode_layer"] == "cuda:torch-layer-per-token"
    batched.prepare_rows(4)  # a server's captures up front: their warm-ups must keep every slot's state
    order, lengths = [2, 0, 3, 1], {0: 7, 1: 0, 2: 5, 3: 1}  # slot 1's sequence starts over
    for tokens in ([3, 10, 7, 1], [12, 2, 5, 6], [9, 9, 9, 9]):
        positions = [lengths[slot] for slot in order]
        want = torch.stack([alone.decode(*row) for row in zip(tokens, positions, order, strict=True)])
        assert torch.equal(batched.decode_batch(tokens, positions, order), want)
        lengths.update((slot, length + 1) for slot, length in zip(order, positions, strict=True))
    for slot in prompts:
        states = zip(alone.cache.recurrent.save(slot), batched.cache.recurrent.save(slot), strict=True)
        assert all(torch.equal(a, b) for a, b in states), slot


@pytest.mark.parametrize("chunk", [4, 5])
def test_a_prompt_resumed_from_a_saved_state_gets_its_fresh_tokens(int8_model_path, chunk):
    """The server's scheduler on the tiny Q8_0 qwen35 (CPU: prefill batch-invariant): prompts that resume
    another's saved recurrent state (a shared prefix, a next turn) generate exactly the greedy tokens of
    the same prompts run alone on a fresh engine, and reuse what the saved states hold."""
    from gufo.server.metrics import Metrics
    from gufo.server.scheduler import Scheduler
    from tests.server.test_queued_steps import run_jobs

    first = [7, 3, 9, 12, 5, 8, 2, 11, 4, 6, 10, 1, 13]
    waves = [
        [{"prompt": first, "max_tokens": 6, "params": GREEDY}],
        [  # the next turn takes the first's slot and resumes at its end; the other copies a saved state
            {"prompt": first + [9, 9, 2, 5], "max_tokens": 6, "params": GREEDY},
            {"prompt": first[:9] + [14, 15, 3], "max_tokens": 6, "params": GREEDY},
        ],
    ]
    engine = Engine(int8_model_path, RunOptions(threads=2), context=64, n_slots=2)
    assert engine.invariant_prefill and not engine.rewindable
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=chunk, state_checkpoints=6)
    done = run_jobs(engine, scheduler, waves)
    alone = Engine(int8_model_path, RunOptions(threads=2), context=64)
    for job, tokens, _ in done:
        want = alone.generate(job.prompt_ids, max_tokens=job.max_tokens, params=GREEDY).generated_ids
        assert tokens == want[: len(tokens)] and len(tokens) == len(want), job.prompt_ids
    # room for every state saved: the second prompt copies the last chunk end within its 9 shared tokens
    assert [j.cached_tokens for j, _, _ in done] == [0, len(first), 9 // chunk * chunk]


def test_a_served_next_turn_resumes_its_saved_state_with_the_same_text(int8_model_path):
    """The real server and the official client on the tiny Q8_0 qwen35: a conversation's next turn sent
    alone without prefix reuse, then after its first turn (whose saved states it resumes), gets the
    same greedy text, streamed too; usage counts the resumed tokens as cached."""
    from gufo.server.settings import ServerSettings
    from tests.server.conftest import live_server
    from tests.server.test_determinism import completion

    def load() -> Engine:
        return Engine(int8_model_path, RunOptions(threads=1), context=128, n_slots=2)

    turn = [7, 3, 9, 12, 5, 8, 2, 11, 4, 6, 10, 1, 13, 2, 2, 9]
    settings = ServerSettings("tiny", max_tokens=12, max_pending=2, prefill_chunk=8)
    with live_server(settings, load) as live:

        def ask(prompt: list[int], cache: bool = True, stream: bool = False) -> tuple[str, int]:
            return completion(live, "tiny", prompt, cache, stream, tokens=12)

        next_turn = turn + [5, 5, 3, 8, 1]
        alone, cached = ask(next_turn, cache=False)
        assert cached == 0
        ask(turn)  # saves its state at 8 and 16 (its end: the CPU's prefill is batch-invariant)
        assert ask(next_turn) == (alone, len(turn))
        ask(turn)
        assert ask(next_turn, stream=True) == (alone, len(turn))


@pytest.mark.parametrize("chunk", [4, 64])
def test_a_conversation_through_a_prompt_cache_gets_each_turns_fresh_tokens(int8_model_path, chunk):
    """`gufo chat`'s reuse on the tiny Q8_0 qwen35 (CPU: prefill batch-invariant): each turn generated
    after the prefix the slot kept (the turn before and its reply, or a saved state where the turn
    differs inside the reply) gives exactly the greedy tokens of the turn alone on a fresh engine."""
    from gufo.engine.prompt_cache import PromptCache

    engine = Engine(int8_model_path, RunOptions(threads=2), context=96)
    alone = Engine(int8_model_path, RunOptions(threads=2), context=96)
    cache = PromptCache(engine, chunk, state_checkpoints=4)
    first = [7, 3, 9, 12, 5, 8, 2, 11, 4, 6]
    one = engine.generate(first, 6, GREEDY, stop_at_eog=False, prompt_cache=cache)
    second = first + one.generated_ids + [9, 9, 2]  # the whole reply, as a template renders it back
    two = engine.generate(second, 6, GREEDY, stop_at_eog=False, prompt_cache=cache)
    third = second[:12] + [14, 15, 3]  # differs inside the first reply: back to a saved state
    three = engine.generate(third, 6, GREEDY, stop_at_eog=False, prompt_cache=cache)
    for prompt, result in zip((first, second, third), (one, two, three), strict=True):
        assert result.generated_ids == alone.generate(prompt, 6, GREEDY, stop_at_eog=False).generated_ids
    # the first turn and its reply but the last token (never fed); then the first turn's end, where a
    # state was saved (at 4 and 8 too with chunks of 4: the latest within the 12 shared tokens is 10)
    assert [one.cached_tokens, two.cached_tokens, three.cached_tokens] == [0, len(first) + 5, len(first)]
