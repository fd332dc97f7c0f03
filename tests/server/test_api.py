"""The server through the official openai client: outputs equal gufo's own Engine, usage equals the
tokenizer's counts, streams concatenate to the non-streamed text; prefix reuse, stop strings, logprobs;
and `gufo bench-serve` against it."""

from __future__ import annotations

import hashlib
import json

import pytest

from gufo.engine.sampling import SamplingParams
from gufo.server.settings import ServerSettings
from gufo.tools.bench.serving import Client
from tests.conftest import gufo
from tests.server.conftest import MODEL, live_server, load_engine

GREEDY = {"temperature": 0, "max_tokens": 12}
NO_CACHE = {"cache_prompt": False}  # the expected outputs come from a prefill of the whole prompt


@pytest.fixture(scope="module")
def server():
    with live_server(ServerSettings(MODEL, max_tokens=16), lambda: load_engine(2)) as live:
        yield live


def expected(engine, prompt: str, max_tokens: int = 12) -> tuple[list[int], list[int], str]:
    """Prompt ids, generated ids and text of a greedy `Engine.generate` (EOG shows no text)."""
    tok = engine.tokenizer
    prompt_ids = tok.encode(prompt, add_special=True, parse_special=True)
    ids = engine.generate(prompt_ids, max_tokens, SamplingParams(temperature=0)).generated_ids
    return prompt_ids, ids, tok.decode([t for t in ids if t not in tok.eog_ids])


MESSAGES = [{"role": "user", "content": "Name three colors."}]


def test_chat_equals_engine_and_stream_concatenates(server, reference_engine):
    tok = reference_engine.tokenizer
    prompt_ids, ids, text = expected(reference_engine, tok.apply_chat_template(MESSAGES))
    client = server.client()
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=NO_CACHE, **GREEDY)
    assert reply.choices[0].message.content == text and text
    assert reply.choices[0].finish_reason == ("stop" if ids[-1] in tok.eog_ids else "length")
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(ids)
    assert reply.usage.total_tokens == len(prompt_ids) + len(ids)
    timings = reply.model_extra["timings"]
    assert timings["prompt_n"] == len(prompt_ids) and timings["predicted_n"] == len(ids)
    assert timings["cache_n"] == 0 and timings["prompt_ms"] > 0

    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_CACHE,
        **GREEDY,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reply.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)


def test_completion_equals_engine(server, reference_engine):
    prompt = "The three primary colors are"
    prompt_ids, ids, text = expected(reference_engine, prompt)
    reply = server.client().completions.create(model=MODEL, prompt=prompt, extra_body=NO_CACHE, **GREEDY)
    assert reply.choices[0].text == text
    assert reply.usage.prompt_tokens == len(prompt_ids) and reply.usage.completion_tokens == len(ids)


def test_models_lists_the_served_id(server):
    assert [m.id for m in server.client().models.list()] == [MODEL]


def test_prefix_reuse_reports_cached_tokens(server):
    client = server.client()
    prompt = "Prefix reuse: a long shared opening sentence about rivers, stones and light."
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == n - 1  # the last token gives the logits
    assert again.model_extra["timings"]["cache_n"] == n - 1 and again.model_extra["timings"]["prompt_n"] == 1


def test_stop_string_cuts_text_in_both_modes(server, reference_engine):
    prompt = "The three primary colors are"
    _, _, text = expected(reference_engine, prompt)
    stop = text.split()[1]  # a word inside the greedy text
    client = server.client()
    args = {"model": MODEL, "prompt": prompt, "stop": [stop], "extra_body": NO_CACHE, **GREEDY}
    reply = client.completions.create(**args)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices)
    assert reply.choices[0].text == streamed == text[: text.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_logprobs_of_greedy_tokens(server):
    reply = server.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy takes the top one


def test_bench_serve_reports_parity_and_no_text(server, capsys, tmp_path):
    out = tmp_path / "serve.json"
    args = ["--concurrency", "1,2", "--max-tokens", "4", "-r", "1", "--prompt-words", "8", "-o", str(out)]
    code, stdout, _ = gufo(capsys, "bench-serve", "--base-url", server.base_url, *args)
    assert code == 0
    assert "| 2 |" in stdout and "| yes |" in stdout
    report = json.loads(out.read_text())
    assert [r["concurrency"] for r in report["results"]] == [1, 2]
    assert report["results"][1]["greedy_matches_c1"] is True
    assert all(r["cached_tokens"] == 0 for r in report["results"])
    text = out.read_text()
    assert "127.0.0.1" not in text and "river" not in text  # no host, no prompt


def test_bench_serve_chat_mode_counts_tokens_per_chunk(server, capsys, tmp_path):
    out = tmp_path / "chat.json"
    args = ["--endpoint", "chat", "--tokenizer", MODEL, "--concurrency", "1,2", "--max-tokens", "4"]
    code, stdout, _ = gufo(
        capsys,
        "bench-serve",
        "--base-url",
        server.base_url,
        *args,
        "-r",
        "1",
        "--prompt-words",
        "8",
        "-o",
        str(out),
    )
    assert code == 0 and "ITL per token" in stdout
    report = json.loads(out.read_text())
    assert report["endpoint"] == "chat" and report["itl_unit"] == "token"
    assert report["results"][1]["greedy_matches_c1"] is True


def test_bench_serve_rates_ranges_shared_prefix_and_sweep(server, capsys, tmp_path):
    out, sweep = tmp_path / "rate.json", tmp_path / "sweep.csv"
    args = ["--concurrency", "2", "--request-rate", "20", "--requests", "2", "--prompt-words", "4:8"]
    args += [
        "--max-tokens",
        "2:3",
        "--shared-prefix-words",
        "12",
        "-r",
        "1",
        "-o",
        str(out),
        "--sweep",
        str(sweep),
    ]
    code, stdout, _ = gufo(capsys, "bench-serve", "--base-url", server.base_url, *args)
    assert code == 0 and "| 20/s |" in stdout
    report = json.loads(out.read_text())
    assert report["prompt_words"] == [4, 8] and report["max_tokens"] == [2, 3]
    rows = report["results"]
    assert [(r["concurrency"], r["request_rate"]) for r in rows] == [(2, None), (None, 20.0)]
    assert all(r["greedy_matches_c1"] is True and r["requests"] == 2 for r in rows)
    assert all(r["completion_tokens"] <= 3 for r in rows)
    # the reference requests left the shared prefix cached in a slot: at least one request of each load
    # point reused it (at least a token per shared word)
    assert all(r["cached_tokens"] >= 12 for r in rows)
    lines = sweep.read_text().splitlines()
    assert lines[0].startswith("concurrency,request_rate,requests,request_throughput,aggregate_tps,")
    assert [line.split(",")[:3] for line in lines[1:]] == [["2", "", "2"], ["", "20.0", "2"]]


def test_bench_serve_shared_prefix_without_reuse_is_prefilled_whole(server, capsys, tmp_path):
    """--no-prefix-reuse: the same shared-prefix prompts with cache_prompt=false, so the server reuses
    nothing (the cache's baseline); without --shared-prefix-words the flag is refused. --parity 1 checks
    one of the point's two requests."""
    out = tmp_path / "whole.json"
    args = ["--concurrency", "2", "--prompt-words", "4", "--max-tokens", "2", "--shared-prefix-words", "12"]
    args += ["--no-prefix-reuse", "--parity", "1", "-r", "1", "-o", str(out)]
    code, stdout, _ = gufo(capsys, "bench-serve", "--base-url", server.base_url, *args)
    assert code == 0 and "(cache_prompt=false)" in stdout and "| yes (1) |" in stdout
    report = json.loads(out.read_text())
    assert report["cache_prompt"] is False and report["shared_prefix_words"] == 12
    assert [r["cached_tokens"] for r in report["results"]] == [0]
    assert report["results"][0]["greedy_matches_c1"] is True and report["results"][0]["parity_checked"] == 1
    code, _, stderr = gufo(capsys, "bench-serve", "--base-url", server.base_url, "--no-prefix-reuse")
    refused = "--no-prefix-reuse: needs --shared-prefix-words (without it nothing is reused)"
    assert code == 2 and stderr.strip().endswith(refused)


def test_bench_serve_sends_the_json_schema(server, capsys, tmp_path):
    schema, out = tmp_path / "ok.json", tmp_path / "constrained.json"
    schema.write_text(json.dumps({"enum": ["ok"]}))  # one valid output: the 4 characters "ok" in quotes
    args = ["--endpoint", "chat", "--json-schema", str(schema), "--concurrency", "2", "--max-tokens", "8"]
    args += ["-r", "1", "--prompt-words", "8", "-o", str(out)]
    code, stdout, _ = gufo(capsys, "bench-serve", "--base-url", server.base_url, *args)
    assert code == 0 and "response_format json_schema" in stdout
    report = json.loads(out.read_text())
    assert report["response_format"] == "json_schema"
    assert report["results"][0]["greedy_matches_c1"] is True
    # at most a token per character and the end-of-generation token, under the 8 asked for
    assert all(r["completion_tokens"] <= 4 + 1 for r in report["results"])
    form = {"type": "json_schema", "json_schema": {"name": "bench", "schema": {"enum": ["ok"]}}}
    sample = Client(server.base_url, model=MODEL, endpoint="chat", response_format=form).stream("Hi", 8)
    assert sample.text_sha256 == hashlib.sha256(b'"ok"').hexdigest()
