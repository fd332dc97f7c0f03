"""Determinism as a contract (issue 23, acceptance 3 on the CPU): the same greedy request gets the same
text whatever else the server holds or does: streamed or not, alone or among 8 concurrent requests, with
its whole prompt prefilled, with a prefix another request left cached, or with all of it cached; and
among 8 concurrent requests sharing a long prefix, which they copy from one another's slots."""

from __future__ import annotations

import concurrent.futures

import pytest

from gufo.engine.engine import Engine
from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import open_model_file
from gufo.options import RunOptions
from gufo.server.settings import ServerSettings
from gufo.tokenizer import Tokenizer
from tests.server.conftest import live_server

SESSIONS = 8
MAX_TOKENS = 64
OTHER_TOKENS = 16  # tokens of the requests running beside the target (CPU time: CI budget)
TEXT = (
    "The river left the mountains in spring and carried the melted snow past the old mill, where the "
    "miller's daughter kept a notebook of every flood since her grandfather's time. She wrote down the "
    "height of the water on the stone wall, the colour of the sky, and the names of the boats that "
    "passed. Each autumn she read the notebook again from the first page, and she noticed that the "
    "floods came in cycles of about seven years, with a small one between them. When the village "
    "council asked whether they should build a new dam above the mill, she opened the notebook and"
)
SHARED = 53  # prompt tokens the prefix request shares with the target: no chunk or block boundary


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def served(request):
    alias = request.param

    def load() -> Engine:
        return Engine(alias, options=RunOptions(threads=1), context=512, n_slots=SESSIONS)

    tokenizer = Tokenizer.from_gguf(open_model_file(resolve_model(alias)).metadata)
    prompt = tokenizer.encode(TEXT, add_special=True, parse_special=False)
    with live_server(ServerSettings(alias, max_tokens=MAX_TOKENS, max_pending=SESSIONS), load) as live:
        yield alias, live, prompt


def completion(
    live, model: str, prompt: list[int], cache_prompt: bool, stream: bool = False, tokens=MAX_TOKENS
):
    """(text, cached_tokens) of one greedy request."""
    args = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    extra = {"extra_body": {"cache_prompt": cache_prompt}}
    client = live.client()
    if not stream:
        reply = client.completions.create(**args, **extra)
        return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens
    usage = {"stream_options": {"include_usage": True}}
    chunks = list(client.completions.create(**args, **extra, stream=True, **usage))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    return text, chunks[-1].usage.prompt_tokens_details.cached_tokens


def test_greedy_text_is_a_function_of_the_request_alone(served):
    check_greedy_text_is_a_function_of_the_request_alone(*served)


def check_greedy_text_is_a_function_of_the_request_alone(
    model: str, live, prompt: list[int], real_text: bool = True
) -> None:
    """`real_text`: a real model's, whose replies are checked to be full length too (a random one's may
    end at once: an end-of-generation token is as likely as any)."""
    assert len(prompt) >= 100
    outputs = {}
    # A request that shares the first SHARED tokens (it only needs its prompt prefilled), then the
    # target, which reuses exactly those: its prefill starts inside what a fresh one does in one chunk.
    other = prompt[:SHARED] + [t for t in reversed(prompt[SHARED:]) if t != prompt[SHARED]][:40]
    completion(live, model, other, cache_prompt=True, tokens=1)
    outputs["after a shared prefix"], cached = completion(live, model, prompt, cache_prompt=True)
    assert cached == SHARED
    outputs["alone, whole prompt prefilled"], cached = completion(live, model, prompt, cache_prompt=False)
    assert cached == 0
    # All but the last token cached: that one is prefilled alone.
    outputs["streamed, all but the last token cached"], cached = completion(
        live, model, prompt, cache_prompt=True, stream=True
    )
    assert cached == len(prompt) - 1
    # Among 8: prefilled while seven other prompts of other lengths decode, then decoded in the same
    # batched steps as they are (for their first OTHER_TOKENS tokens).
    others = [prompt[i : i + 20 + 9 * i] for i in range(1, SESSIONS)]
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        running = [pool.submit(completion, live, model, p, False, tokens=OTHER_TOKENS) for p in others]
        target = pool.submit(completion, live, model, prompt, False)
        outputs["among 8 concurrent"], _ = target.result()
        texts = [r.result()[0] for r in running]
    reference = outputs["alone, whole prompt prefilled"]
    if real_text:
        assert all(texts) and len(reference) > 100  # 64 tokens of text, not an early end
    assert {k: v for k, v in outputs.items() if v != reference} == {}


PREFIX = (
    "You are the archivist of a small coastal town. The town keeps its records in a stone house by the "
    "harbour: ship manifests, weather logs, the minutes of every council meeting, letters from families "
    "who emigrated, and the tide tables that the fishermen still copy by hand each winter. Visitors ask "
    "you about the town's history, and you answer from the records alone, naming the document and the "
    "year you found it in. When the records are silent you say so plainly and suggest where else one "
    "might look, such as the parish registers in the church or the customs office at the port. You "
    "speak simply and briefly, without guessing, and you never invent a date, a name or a ship."
)
QUESTIONS = [
    "The oldest record in the stone house is a letter from 1791, and it begins with the words",
    "Tell me about the storm of the great flood.",
    "Which ships carried the emigrants?",
    "Who kept the tide tables first?",
    "Describe the council's oldest minutes.",
    "Where did the customs office stand?",
    "Name the families that left for the south.",
    "Summarize the weather logs of the coldest winter.",
]


def test_requests_sharing_a_long_prefix_copy_it_and_keep_their_greedy_text(served):
    """Eight requests sharing a long prefix at once: all but the first admitted copy the whole prefix
    from another slot (the CPU's prefill is batch-invariant: any shared prefix), and the target's text
    is the one it gets alone with nothing cached."""
    model, live, _ = served
    tokenizer = Tokenizer.from_gguf(open_model_file(resolve_model(model)).metadata)
    prefix = tokenizer.encode(PREFIX, add_special=True, parse_special=False)
    suffixes = [tokenizer.encode(" " + q, add_special=False, parse_special=False) for q in QUESTIONS]
    prompts = [prefix + s for s in suffixes]
    assert len(prefix) >= 100 and len({s[0] for s in suffixes}) == SESSIONS == len(prompts)
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        replies = [
            pool.submit(completion, live, model, p, True, tokens=MAX_TOKENS if i == 0 else OTHER_TOKENS)
            for i, p in enumerate(prompts)
        ]
        results = [r.result() for r in replies]
    cached = sorted(c for _, c in results)
    assert cached[0] < len(prefix) and cached[1:] == [len(prefix)] * (SESSIONS - 1), cached
    alone, cached_alone = completion(live, model, prompts[0], cache_prompt=False)
    assert cached_alone == 0 and len(alone) > 100
    assert results[0][0] == alone


@pytest.mark.gpu
def test_gpu_greedy_text_on_the_tiles_is_a_function_of_the_request_alone(tmp_path_factory):
    """The same on a GPU whose prompts run on the fixed tiles (`--prefill-products tiles`, chunk-invariant
    prefill): the target reuses exactly the SHARED prefilled tokens another request left (no chunk
    boundary there) and all but its last token later, and its text is the same every way. A `gufo synth`
    qwen3 file (4 layers of Qwen3-0.6B's shapes, the test vocabulary's tokens): its random weights give
    text that is noise, the same noise every way."""
    import os

    import torch

    from gufo.options import KernelOptions
    from gufo.tools.synth.presets import find_preset
    from gufo.tools.synth.type_mix import find_mix
    from gufo.tools.synth.writer import plan_qwen3, write_synth

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    vocab = open_model_file(resolve_model(os.environ.get("GUFO_TEST_VOCAB", "smollm2-135m")))
    plan = plan_qwen3("0.6b", find_preset("qwen3", "0.6b").with_layers(4), find_mix("Q8_0"), vocab)
    path = tmp_path_factory.mktemp("synth") / "qwen3-q8_0.gguf"
    write_synth(plan, path)
    tiles = RunOptions(device="cuda", kernels=KernelOptions(prefill_products="tiles"))

    def load() -> Engine:
        engine = Engine(path, options=tiles, context=512, n_slots=SESSIONS)
        assert engine.tiled_prefill
        return engine

    tokenizer = Tokenizer.from_gguf(open_model_file(path).metadata)
    prompt = tokenizer.encode(TEXT, add_special=True, parse_special=False)
    with live_server(ServerSettings(str(path), max_tokens=MAX_TOKENS, max_pending=SESSIONS), load) as live:
        check_greedy_text_is_a_function_of_the_request_alone(str(path), live, prompt, real_text=False)
