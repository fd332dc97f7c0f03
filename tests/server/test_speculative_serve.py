"""`gufo serve --speculative`: through the official openai client, greedy output equals the same server
without speculation token for token (the oracle), with drafts accepted per the metrics, also under a
JSON schema or a required tool call (whose output `jsonschema` validates); max_tokens, stop strings and
streaming behave as without it; bad flag combinations are one line and exit 2."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from gufo.engine.speculative import SpeculativeParams
from gufo.kernels.decode import CpuDecodeLayer
from gufo.server.settings import ServerSettings
from tests.conftest import gufo
from tests.server.conftest import MODEL, live_server, load_engine
from tests.server.test_structured import PARAMETERS, TOOLS, WEATHER

pytestmark = pytest.mark.skipif(not CpuDecodeLayer.available(), reason="needs AVX2 and a C compiler")

REPETITIVE = "one two three four, one two three four, one two three four, one two"
OTHER = "red green blue, red green blue, red green blue, red"
GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 24, "extra_body": {"cache_prompt": False}}
ACCEPTED = "gufo_draft_tokens_accepted_total"
DRAFTED = "gufo_draft_tokens_total"


def settings(**speculation) -> ServerSettings:
    return ServerSettings(MODEL, max_tokens=48, **speculation)


@pytest.fixture(scope="module")
def plain():
    with live_server(settings(), lambda: load_engine(2)) as live:
        yield live


@pytest.fixture(scope="module")
def ngram():
    spec = SpeculativeParams("ngram", draft_max=4)
    with live_server(settings(speculative=spec), lambda: load_engine(2)) as live:
        yield live


def complete(server, prompt: str = REPETITIVE, **overrides):
    return server.client().completions.create(**{"prompt": prompt, "logprobs": 0, **GREEDY, **overrides})


def tokens_of(reply) -> list[tuple[str, float]]:
    """Each generated token's text and log-probability: equal logits give equal pairs."""
    logprobs = reply.choices[0].logprobs
    return list(zip(logprobs.tokens, logprobs.token_logprobs, strict=True))


def test_greedy_equals_plain_serving_and_drafts_are_accepted(plain, ngram):
    accepted_before, drafted_before = ngram.metric(ACCEPTED), ngram.metric(DRAFTED)
    expected, reply = complete(plain), complete(ngram)
    assert tokens_of(reply) == tokens_of(expected) and len(tokens_of(reply)) == 24
    assert reply.choices[0].text == expected.choices[0].text
    accepted, drafted = ngram.metric(ACCEPTED) - accepted_before, ngram.metric(DRAFTED) - drafted_before
    assert 0 < accepted <= drafted
    timings = reply.model_extra["timings"]
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert plain.metric(DRAFTED) == 0 and "draft_n" not in expected.model_extra["timings"]


def test_chat_equals_plain_serving(plain, ngram):
    messages = [{"role": "user", "content": "Repeat after me: la la la la la la la la."}]
    replies = [s.client().chat.completions.create(messages=messages, **GREEDY) for s in (plain, ngram)]
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content
    assert replies[0].usage == replies[1].usage


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 6, 11])
def test_max_tokens_is_honored_exactly(plain, ngram, max_tokens):
    expected, reply = complete(plain, max_tokens=max_tokens), complete(ngram, max_tokens=max_tokens)
    assert expected.choices[0].finish_reason == "length"  # the repetitive prompt never ends early
    assert tokens_of(reply) == tokens_of(expected)
    assert reply.usage.completion_tokens == max_tokens and reply.choices[0].finish_reason == "length"


def test_stream_concatenates_to_the_plain_text(plain, ngram):
    expected = complete(plain).choices[0].text
    chunks = list(
        ngram.client().completions.create(
            prompt=REPETITIVE, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 24


def test_stop_string_cuts_the_same_text(plain, ngram):
    expected = complete(plain).choices[0].text
    stop = expected.split()[3]  # a word inside the greedy text, after drafts have been accepted
    args = {"prompt": REPETITIVE, "stop": [stop], **GREEDY}
    reply = ngram.client().completions.create(**args)
    streamed = ngram.client().completions.create(stream=True, **args)
    assert reply.choices[0].text == "".join(c.choices[0].text for c in streamed if c.choices)
    assert reply.choices[0].text == expected[: expected.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_sampled_requests_honor_max_tokens_and_the_seed(ngram, seed):
    sampled = {**GREEDY, "temperature": 0.8, "seed": seed, "max_tokens": 16}
    first, again = (complete(ngram, **sampled) for _ in range(2))
    assert tokens_of(first) == tokens_of(again)  # the same seed draws the same tokens
    count, finish = first.usage.completion_tokens, first.choices[0].finish_reason
    assert count == 16 if finish == "length" else count <= 16 and finish == "stop", (count, finish)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
COPY = [{"role": "user", "content": 'Repeat this JSON: {"name": "Ada", "age": 36}'}]  # ngram drafts it


def person(server, **sampling) -> tuple[str, list[tuple[str, float]]]:
    """The text of a schema-constrained reply (validated by `jsonschema`) and its tokens' logprobs."""
    reply = server.client().chat.completions.create(
        model=MODEL, messages=COPY, response_format=PERSON_FORMAT, max_tokens=32, logprobs=True, **sampling
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice  # the grammar ended the reply
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    return choice.message.content, [(t.token, t.logprob) for t in choice.logprobs.content]


def required_call(server, **sampling) -> tuple[str, dict]:
    reply = server.client().chat.completions.create(
        model=MODEL, messages=WEATHER, tools=TOOLS[:1], tool_choice="required", max_tokens=48, **sampling
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS[call.function.name])
    return call.function.name, arguments


def test_constrained_greedy_equals_plain_serving(plain, ngram):
    """The draft keeps to the grammar and verification masks the target: greedy output is plain
    constrained serving's, token for token, with drafts kept."""
    accepted_before = ngram.metric(ACCEPTED)
    assert person(ngram, temperature=0) == person(plain, temperature=0)
    assert ngram.metric(ACCEPTED) > accepted_before
    assert required_call(ngram, temperature=0) == required_call(plain, temperature=0)


def test_constrained_sampled_output_keeps_the_grammar(ngram):
    person(ngram, temperature=1.0, seed=4)  # the target's masked distribution, the accept rule exact


def concurrent_texts(server, prompts: list[str]) -> list[str]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return [reply.choices[0].text for reply in pool.map(lambda p: complete(server, p), prompts)]


def test_concurrent_requests_keep_their_own_drafts(plain, ngram):
    """Two slots at once: each slot's proposer sees only its own context."""
    expected = [complete(plain, prompt).choices[0].text for prompt in (REPETITIVE, OTHER)]
    assert concurrent_texts(ngram, [REPETITIVE, OTHER]) == expected


def test_draft_model_serving_equals_plain_serving(plain):
    """The model drafts for itself (same vocabulary), with one draft slot per target slot."""
    spec = {"speculative": SpeculativeParams("draft", draft_max=4), "draft_model": MODEL}
    expected = [complete(plain, prompt).choices[0].text for prompt in (REPETITIVE, OTHER)]
    with live_server(settings(**spec), lambda: load_engine(2)) as draft:
        assert concurrent_texts(draft, [REPETITIVE, OTHER]) == expected
        assert draft.metric(ACCEPTED) > 0
        # The draft model drafts within the grammar (its distribution masked as the target's is).
        assert person(draft, temperature=0) == person(plain, temperature=0)
        person(draft, temperature=1.0, seed=5)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--speculative", "draft"], "--draft-model"),
        (["--draft-model", MODEL], "--draft-model needs --speculative draft"),
        (["--speculative", "ngram", "--draft-model", MODEL], "--draft-model"),
        (["--speculative", "ngram", "--draft-min", "9", "--draft-max", "4"], "--draft-min"),
        (["--speculative", "draft", "--draft-model", "gemma3-270m"], "vocabulary differs"),
        (["--speculative", "draft", "--draft-model", "no-such-draft.gguf"], "no-such-draft"),
    ],
)
def test_bad_speculative_flags_are_one_line_and_exit_2(capsys, args, fragment):
    code, _, err = gufo(capsys, "serve", "-m", MODEL, "--port", "0", *args)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1
