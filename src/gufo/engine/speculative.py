"""Speculative decoding: cheap proposals verified by the target model, faithful to plain decoding.

A proposer drafts up to `draft_max` tokens that may follow the context: prompt lookup (`NgramProposer`:
the tokens that followed the longest recent repeat of the context's last n-gram), a smaller model
with the same vocabulary (`DraftModelProposer`) or the model's own multi-token-prediction block
(`MtpProposer`). The target runs the pending token and the drafts in
one `Engine.decode_tokens` pass, whose logits for each token are bit-identical to a plain decode step,
so greedy output equals plain autoregressive decoding exactly. With temperature > 0 a draft is kept
with probability min(1, p/q) and a rejection draws from normalised max(p - q, 0) (Leviathan et al.
2023, Chen et al. 2023), so the output distribution is the target's.

Rollback: the KV cache is positional per slot and attention reads only up to the current position,
so rejected drafts are undone by not advancing the position; their entries are overwritten later.
Recurrent layers (hybrid models) cannot be rewound so: `decode_tokens` checkpoints their state after
each token and `Engine.keep_tokens` puts back the one after the last kept token (cheaper than running
the kept tokens again, which costs a full model pass per token; a checkpoint copies the state only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from gufo.engine.constraint import TokenConstraint
from gufo.engine.engine import Engine, GenerationResult, OnToken
from gufo.engine.params import SpeculativeParams
from gufo.engine.sampling import Sampler, SamplingParams
from gufo.errors import BadInputError
from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import ModelFile, open_model_file
from gufo.models.archs.qwen35 import MultiTokenPrediction
from gufo.models.base import mtp_block_index
from gufo.models.kv_cache import KVCache

NGRAM_MAX = 4  # longest n-gram prompt lookup tries before shorter ones (at least --ngram-min)


@dataclass
class SpeculativeStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target verification passes

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def add(self, other: SpeculativeStats) -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.steps += other.steps

    def line(self) -> str:
        return (
            f"[Speculative]: drafted={self.drafted} accepted={self.accepted} "
            f"acceptance={self.accepted}/{self.drafted} steps={self.steps}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 6),
            "steps": self.steps,
        }


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # Per drafted token, the distribution it was drawn from; None: each token was certain (q = point mass).
    probs: list[torch.Tensor] | None = None


class Proposer(Protocol):
    def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft: ...


class NgramProposer:
    """Prompt lookup: find the most recent earlier occurrence of the context's last n tokens (longest n
    first, down to ngram_min) and propose the tokens that followed it, up to draft_max."""

    def __init__(self, params: SpeculativeParams):
        self.params = params

    def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft:
        p = self.params
        limit = min(limit, p.draft_max)
        for n in range(max(NGRAM_MAX, p.ngram_min), p.ngram_min - 1, -1):
            if n >= len(history):
                continue
            tail = list(history[-n:])
            for start in range(len(history) - n - 1, -1, -1):
                if list(history[start : start + n]) == tail:
                    # Copy what followed; a match overlapping the end runs out of history, so the copy
                    # goes on over itself (a period-k repeat keeps repeating) instead of stopping short.
                    sequence = list(history)
                    for offset in range(limit):
                        sequence.append(sequence[start + n + offset])
                    tokens = sequence[len(history) :]
                    return Draft(tokens if len(tokens) >= p.draft_min else [])
        return Draft()


def check_same_vocabulary(target: ModelFile, draft: ModelFile) -> None:
    """Drafted ids must mean the same tokens to both models: BadInputError naming what differs."""
    difference = _vocabulary_difference(target, draft)
    if difference is not None:
        raise BadInputError(f"--draft-model {draft.path.name}: vocabulary differs ({difference})")


def _vocabulary_difference(target: ModelFile, draft: ModelFile) -> str | None:
    ours = target.metadata.get("tokenizer.ggml.tokens") or []
    theirs = draft.metadata.get("tokenizer.ggml.tokens") or []
    if len(ours) != len(theirs):
        return f"{len(theirs)} tokens vs the target's {len(ours)}"
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            return f"token {index} is {b!r}, the target's is {a!r}"
    return None


class DraftModelProposer:
    """A smaller model with the same vocabulary drafts autoregressively in its own KV slot, which keeps
    the longest prefix it shares with the context, so each proposal feeds only what changed."""

    def __init__(self, draft: Engine, target: Engine, params: SpeculativeParams, slot: int = 0):
        check_same_vocabulary(target.file, draft.file)
        self.engine, self.params, self.slot = draft, params, slot
        self.fed: list[int] = []  # tokens whose keys and values are in the draft's slot, in order

    def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft:
        limit = min(limit, self.params.draft_max, self.engine.context - len(history))
        if limit < max(1, self.params.draft_min):
            return Draft()
        shared = min(common_prefix(self.fed, history), len(history) - 1)  # feed one token at least
        if shared < len(self.fed) and not self.engine.rewindable:
            shared = 0  # a recurrent state cannot go back: feed the context again
        del self.fed[shared:]  # what follows is overwritten now; a failing pass must not leave it claimed
        logits = self.engine.prefill(history[shared:], self.slot, start=shared)
        self.fed = list(history)

        def advance(token: int, position: int) -> torch.Tensor:
            logits = self.engine.decode(token, position, self.slot)
            self.fed.append(token)
            return logits

        return draw_draft(logits, history, limit, sampler, advance)


def draw_draft(
    logits: torch.Tensor,
    history: Sequence[int],
    limit: int,
    sampler: Sampler,
    advance: Callable[[int, int], torch.Tensor],
) -> Draft:
    """Up to `limit` tokens drafted one after another from the drafter's `logits` for the token after
    `history`: the argmax (greedy) or a draw from the sampler's q; `advance(token, position)` feeds a
    drafted token to the drafter and gives its logits for the next. Drafts are drawn within the request's
    grammar, so q is masked as p is."""
    context = list(history)
    draft = Draft(probs=None if sampler.params.greedy else [])
    constraint = sampler.constraint
    for _ in range(limit):
        if draft.probs is None:
            token = int(torch.argmax(logits if constraint is None else constraint.mask(logits)))
        else:
            q = sampler.probabilities(logits, context)
            token = int(torch.multinomial(q, 1, generator=sampler.generator))
        if constraint is not None and not constraint.advance(token):
            break  # only an argmax of no allowed token (NaN logits): q is 0 where the grammar forbids
        if draft.probs is not None:
            draft.probs.append(q)
        draft.tokens.append(token)
        context.append(token)
        if len(draft.tokens) == limit or (constraint is not None and constraint.ended):
            break
        logits = advance(token, len(context) - 1)
    if constraint is not None:
        constraint.rollback(len(draft.tokens))
    return draft


class MtpProposer:
    """The model's multi-token-prediction block drafts (llama.cpp's draft-mtp for qwen35): the pending
    token with the trunk's hidden state of the position before it gives the first draft, each drafted
    token with the block's own hidden state the next.

    The block's KV entries of the context pair each token with the trunk's hidden state of the position
    before (zeros before the first, as llama.cpp), so a kept draft's entry, first made from the block's
    own state, is made again from the trunk's in the next proposal's first pass; `fed` are the tokens
    whose entries are so made. The trunk's rows come from the engine's `HiddenRows`."""

    def __init__(
        self,
        engine: Engine,
        block: MultiTokenPrediction,
        cache: KVCache,
        params: SpeculativeParams,
        slot: int,
    ):
        self.engine, self.block, self.cache, self.params, self.slot = engine, block, cache, params, slot
        self.rows = engine.keep_hidden_rows()
        self.fed: list[int] = []

    @torch.inference_mode()
    def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft:
        limit = min(limit, self.params.draft_max, self.engine.context - len(history))
        if limit < max(1, self.params.draft_min):
            return Draft()
        shared = min(common_prefix(self.fed, history), len(history) - 1)
        end = len(history)
        trunk = self.block.trunk_hidden(self.rows.take(self.slot, shared - 1, end - 1))
        del self.fed[shared:]  # as DraftModelProposer: a failing pass must not leave entries claimed
        hidden = self.block(torch.tensor(history[shared:]), trunk, self.cache, self.slot, shared)[-1:]
        self.fed = list(history)

        def advance(token: int, position: int) -> torch.Tensor:
            nonlocal hidden
            hidden = self.block(torch.tensor([token]), hidden, self.cache, self.slot, position)
            return self.block.logits(hidden)[-1].cpu()

        return draw_draft(self.block.logits(hidden)[-1].cpu(), history, limit, sampler, advance)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share: a binary search whose slice comparisons run in C (a
    server compares each prompt with every slot's tokens, thousands each, per prefill chunk)."""
    a, b = list(a), list(b)
    shared, differs = 0, min(len(a), len(b)) + 1  # a[:shared] == b[:shared], a[:differs] != b[:differs]
    while differs - shared > 1:
        middle = (shared + differs) // 2
        if a[shared:middle] == b[shared:middle]:
            shared = middle
        else:
            differs = middle
    return shared


def accept_or_resample(
    p: torch.Tensor, q: torch.Tensor | None, drafted: int, generator: torch.Generator
) -> tuple[int, bool]:
    """Speculative sampling of one position: keep `drafted` with probability min(1, p/q), else draw from
    normalised max(p - q, 0). q None: the draft was a point mass on `drafted`. Returns (token, kept)."""
    q_drafted = 1.0 if q is None else float(q[drafted])
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    if u * q_drafted < float(p[drafted]):
        return drafted, True
    if q is None:
        residual = p.clone()
        residual[drafted] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    if total <= 0.0:  # p == q up to rounding: a rejection is then (nearly) impossible; draw from p
        residual, total = p, float(p.sum())
    return int(torch.multinomial(residual / total, 1, generator=generator)), False


def grammatical_prefix(draft: Draft, constraint: TokenConstraint) -> Draft:
    """The draft up to the first token the request's grammar rejects (the matcher left as it was): a
    rejected token could never be kept, so verifying it and what follows would waste the pass. Cutting
    depends on the drafted token, so a draft drawn from q must be drawn within the grammar (q masked, as
    `DraftModelProposer` does) for the accept rule to stay exact; a point-mass draft is cut freely."""
    kept = 0
    for token in draft.tokens:
        if not constraint.advance(token):
            break
        kept += 1
    constraint.rollback(kept)
    return Draft(draft.tokens[:kept], None if draft.probs is None else draft.probs[:kept])


def verify(
    rows: torch.Tensor, draft: Draft, sampler: Sampler, history: list[int], stats: SpeculativeStats
) -> Iterator[int]:
    """The tokens of one verification pass, the i-th from rows[i]: each kept draft, then the target's
    own choice where a draft is rejected, or one more from the last row when all are kept. The caller
    appends each token to `history` before taking the next (penalties must see it) and stops taking
    when generation ends."""
    stats.steps += 1
    stats.drafted += len(draft.tokens)
    for index, drafted in enumerate(draft.tokens):
        if sampler.params.greedy:
            token = sampler(rows[index], history)
            kept = token == drafted
        else:
            p = sampler.probabilities(rows[index], history)
            q = None if draft.probs is None else draft.probs[index]
            token, kept = accept_or_resample(p, q, drafted, sampler.generator)
            sampler.accept(token)
        stats.accepted += kept
        yield token
        if not kept:
            return
    yield sampler(rows[len(draft.tokens)], history)


class Speculator:
    """Generation with speculation on one engine slot; same interface as `Engine.generate`."""

    def __init__(self, engine: Engine, proposer: Proposer):
        self.engine, self.proposer = engine, proposer
        self.stats = SpeculativeStats()

    def step(
        self, history: list[int], wanted: int, sampler: Sampler, slot: int, stats: SpeculativeStats
    ) -> tuple[torch.Tensor, Iterator[int]]:
        """Draft after `history`, whose last token is sampled but not yet in the cache, and verify the
        draft in one target pass: the target's rows and the tokens they give (see `verify`). At most
        `wanted` tokens are still wanted, so the draft is one shorter: keeping it all adds one more."""
        draft = self.proposer.propose(history, wanted - 1, sampler)
        if sampler.constraint is not None:
            draft = grammatical_prefix(draft, sampler.constraint)
        rows = self.engine.decode_tokens([history[-1], *draft.tokens], len(history) - 1, slot)
        return rows, verify(rows, draft, sampler, history, stats)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        stop_at_eog: bool = True,
        on_token: OnToken | None = None,
        slot: int = 0,
        constraint: TokenConstraint | None = None,
    ) -> GenerationResult:
        engine = self.engine
        result, sampler, logits = engine.start_generation(prompt_ids, max_tokens, params, slot, constraint)
        self.stats = stats = SpeculativeStats()
        history = list(prompt_ids)
        started = time.perf_counter()
        out = result.generated_ids

        def emit(token: int) -> bool:
            """Record a token; True when generation ends with it."""
            out.append(token)
            history.append(token)
            if on_token is not None and on_token(token):
                result.stopped_by = "stop"
                return True
            if stop_at_eog and token in engine.tokenizer.eog_ids:
                result.stopped_by = "eog"
                return True
            return len(out) == max_tokens

        done = max_tokens == 0 or emit(sampler(logits, history))
        while not done:
            _, tokens = self.step(history, max_tokens - len(out), sampler, slot, stats)
            used = 0  # tokens of the pass whose results stay in the cache
            for token in tokens:
                used += 1
                done = emit(token)
                if done:
                    break
            engine.keep_tokens(slot, used)
        result.generation_seconds = time.perf_counter() - started
        return result


def check_draft_model(target: ModelFile, draft_model: str | None) -> None:
    """The draft model exists and shares the target's vocabulary: checked before anything loads."""
    if draft_model is None:
        raise BadInputError("--speculative draft needs --draft-model MODEL")
    check_same_vocabulary(target, open_model_file(resolve_model(draft_model)))


def check_proposer(target: ModelFile, params: SpeculativeParams, draft_model: str | None) -> None:
    """What the mode drafts from is there (a draft model of the same vocabulary, the file's MTP block):
    checked before anything loads."""
    if params.mode == "draft":
        check_draft_model(target, draft_model)
    elif params.mode == "mtp":
        mtp_block_index(target)


def multi_token_prediction(engine: Engine) -> MultiTokenPrediction:
    """The engine's model's multi-token-prediction block, loaded now; BadInputError where there is none."""
    load = getattr(engine.model, "multi_token_prediction", None)
    if load is None:
        raise BadInputError(
            f"--speculative mtp: gufo runs no multi-token-prediction block of {engine.config.architecture}"
        )
    return load(engine.file, engine.backend)


def make_speculators(
    engine: Engine, params: SpeculativeParams, draft_model: str | None = None
) -> list[Speculator]:
    """One Speculator per KV slot of `engine`, each with its own proposer state; a draft model gets
    as many slots, slot i drafting for the target's slot i. The verification graphs are captured after
    the proposers are made: an MTP proposer has the graphs hand out hidden rows, which captures them
    again (`Engine.keep_hidden_rows`)."""
    n_slots = engine.cache.n_slots
    check_proposer(engine.file, params, draft_model)
    proposers = _proposers(engine, params, draft_model)
    for slot in range(n_slots):  # the last sampled token plus at most draft_max drafts per pass
        engine.prepare_verification(params.draft_max + 1, slot)
    return [Speculator(engine, proposer) for proposer in proposers]


def _proposers(engine: Engine, params: SpeculativeParams, draft_model: str | None) -> list[Proposer]:
    """The mode's proposer of each slot of `engine`."""
    n_slots = engine.cache.n_slots
    if params.mode == "ngram":
        return [NgramProposer(params) for _ in range(n_slots)]
    if params.mode == "mtp":
        block = multi_token_prediction(engine)
        cache = block.new_cache(n_slots, engine.context)
        return [MtpProposer(engine, block, cache, params, slot) for slot in range(n_slots)]
    draft = Engine(
        draft_model,
        replace(engine.options, device=engine.device),
        context=engine.context,
        n_slots=n_slots,
        batch_size=engine.batch_size,
    )
    return [DraftModelProposer(draft, engine, params, slot) for slot in range(n_slots)]


def make_speculator(engine: Engine, params: SpeculativeParams, draft_model: str | None = None) -> Speculator:
    """For generation on slot 0 of a one-slot engine (the CLI's)."""
    return make_speculators(engine, params, draft_model)[0]
