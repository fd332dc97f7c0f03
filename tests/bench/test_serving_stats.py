"""`gufo bench-serve`'s arithmetic against hand-computed values: the statistics of a load point, the
report table's cached tokens, the sweep table, Poisson arrivals, the workload's length ranges and shared
prefix, and the flag syntax."""

from __future__ import annotations

import csv
import hashlib
import http.server
import json
import math
import threading

import numpy as np
import pytest

from gufo.errors import BadInputError
from gufo.tools.bench.lists import parse_positive_floats, parse_span
from gufo.tools.bench.serving import (
    Client,
    LoadPoint,
    Sample,
    Workload,
    markdown,
    percentiles,
    poisson_arrivals,
    run_serving_bench,
    summarize,
    write_sweep,
)
from tests.conftest import gufo


def sample(chunk_times: list[float], tokens: int, end: float, prompt: int = 10, cached: int = 0) -> Sample:
    return Sample(chunk_times[0], chunk_times, [1] * len(chunk_times), prompt, cached, tokens, "", end)


def test_summary_of_two_rounds_by_hand():
    first = [sample([0.1, 0.2, 0.4], 3, 0.5, cached=5), sample([0.3, 0.5], 2, 0.6)]
    second = [sample([0.2, 0.6], 2, 0.8, prompt=20)]
    got = summarize([(first, 1.0), (second, 0.5)])
    assert got["requests"] == 3
    assert got["prompt_tokens"] == pytest.approx(40 / 3)
    assert got["cached_tokens"] == 5 and got["cached_fraction"] == pytest.approx(5 / 40)
    assert got["completion_tokens"] == pytest.approx(7 / 3)
    # TTFTs 0.1, 0.3, 0.2 s; ITLs 0.1, 0.2 | 0.2 | 0.4 s; end-to-end 0.5, 0.6, 0.8 s
    assert got["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert got["itl_ms"]["p50"] == pytest.approx(200.0)
    assert got["e2e_ms"]["p50"] == pytest.approx(600.0)
    # decode: (3 - 1) / 0.3, (2 - 1) / 0.2, (2 - 1) / 0.4 tokens per second
    assert got["decode_tps_per_request"] == pytest.approx((2 / 0.3 + 5 + 2.5) / 3)
    assert got["prefill_tps"] == pytest.approx((10 / 0.1 + 10 / 0.3 + 20 / 0.2) / 3)
    # round 1: 5 tokens and 2 requests in 1 s; round 2: 2 tokens and 1 request in 0.5 s
    assert got["aggregate_tps_samples"] == pytest.approx([5.0, 4.0])
    assert got["aggregate_tps"] == pytest.approx(4.5)
    assert got["request_throughput"] == pytest.approx((2.0 + 2.0) / 2)


def test_percentiles_interpolate_linearly_in_milliseconds():
    got = percentiles([0.004, 0.001, 0.003, 0.002])
    # sorted 1, 2, 3, 4 ms: rank q * 3 between neighbours
    assert got == pytest.approx({"p50": 2.5, "p95": 3.85, "p99": 3.97})
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_sweep_csv_has_one_row_per_load_point(tmp_path):
    def result(concurrency, rate, ttft, itl, e2e):
        load = {"concurrency": concurrency, "request_rate": rate, "requests": 4}
        stats = {"ttft_ms": ttft, "itl_ms": itl, "e2e_ms": e2e, "cached_fraction": None}
        return {**load, "request_throughput": 2.5, "aggregate_tps": 80.0, "greedy_matches_c1": True, **stats}

    p = {"p50": 10.0, "p95": 15.0, "p99": 20.0}
    q = {"p50": 1.0, "p95": 2.0, "p99": 3.0}
    report = {"results": [result(4, None, p, q, p), result(None, 0.5, q, p, q)]}
    path = tmp_path / "sweep.csv"
    write_sweep(report, path)
    rows = list(csv.DictReader(path.open()))
    assert [(r["concurrency"], r["request_rate"]) for r in rows] == [("4", ""), ("", "0.5")]
    assert rows[0]["ttft_p50_ms"] == "10.0" and rows[0]["ttft_p99_ms"] == "20.0"
    assert rows[1]["itl_p50_ms"] == "10.0" and rows[1]["e2e_p99_ms"] == "3.0"
    assert rows[0]["aggregate_tps"] == "80.0" and rows[0]["cached_fraction"] == ""


def test_poisson_arrivals_have_exponential_gaps_of_mean_one_over_rate():
    rate, n = 4.0, 20001
    times = poisson_arrivals(rate, n, np.random.default_rng(7))
    assert len(times) == n and times[0] == 0.0
    gaps = np.diff(times)
    assert (gaps > 0).all()
    # mean 1/R = 0.25 with standard error 0.25 / sqrt(20000); P(gap > 1/R) = 1/e, error sqrt(p (1 - p) / n)
    assert abs(gaps.mean() - 0.25) < 5 * 0.25 / math.sqrt(n - 1)
    p = math.exp(-1)
    assert abs((gaps > 0.25).mean() - p) < 5 * math.sqrt(p * (1 - p) / (n - 1))
    assert poisson_arrivals(rate, 5, np.random.default_rng(7)) == times[:5]  # seeded
    assert poisson_arrivals(rate, 1, np.random.default_rng(7)) == [0.0]


def test_load_points_send_at_once_or_at_their_rate():
    assert LoadPoint(concurrency=3).arrivals(np.random.default_rng(0)) == [0.0, 0.0, 0.0]
    assert LoadPoint(concurrency=3).label == "C=3"
    point = LoadPoint(rate=2.0, requests=4)
    assert point.count == 4 and point.label == "2 req/s"
    assert point.arrivals(np.random.default_rng(1)) == poisson_arrivals(2.0, 4, np.random.default_rng(1))


def test_workload_draws_lengths_in_its_ranges_after_the_shared_prefix():
    workload = Workload(prompt_words=(3, 5), max_tokens=(7, 8), shared_prefix_words=6, seed=0)
    requests = workload.requests([f"p{i}" for i in range(200)], np.random.default_rng(0))
    shared = workload.shared_prefix()
    assert len(shared.split()) == 2 + 6  # "Shared context:" and six words
    assert all(r.prompt.startswith(shared) for r in requests)
    filler = [len(r.prompt[len(shared) :].split()) - 1 for r in requests]  # less the "pI:" label
    assert set(filler) == {3, 4, 5} and {r.max_tokens for r in requests} == {7, 8}
    assert Workload((3, 3), (9, 9)).shared_prefix() == ""


@pytest.mark.parametrize("text,expected", [("128", (128, 128)), ("16:64", (16, 64)), ("5:5", (5, 5))])
def test_spans(text, expected):
    assert parse_span(text, "--max-tokens") == expected


@pytest.mark.parametrize("text", ["0", "64:16", "1:2:3", "a", "", "-4", "3:", "0:4"])
def test_bad_spans_name_the_flag(text):
    with pytest.raises(BadInputError, match="--max-tokens"):
        parse_span(text, "--max-tokens")


def test_rates():
    assert parse_positive_floats("0.5,1,4", "--request-rate") == [0.5, 1.0, 4.0]
    for bad in ("0", "-1", "x", "1,,2", "nan", "inf"):
        with pytest.raises(BadInputError, match="--request-rate"):
            parse_positive_floats(bad, "--request-rate")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--response-format", "json_object"], "--response-format needs --endpoint chat"),
        (["--endpoint", "chat", "--json-schema", "missing.json"], "--json-schema missing.json: No such file"),
        (["--endpoint", "chat", "--json-schema", "{path}"], "not JSON"),
        (["--endpoint", "chat", "--json-schema", "{list}"], "a JSON schema is an object"),
    ],
)
def test_constrained_requests_need_chat_and_a_schema_object(capsys, tmp_path, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{type: object")
    (tmp_path / "list.json").write_text("[]")
    flags = [f.format(path="bad.json", list="list.json") for f in flags]
    # checked before any request: nothing listens at this URL
    code, _, err = gufo(capsys, "bench-serve", "--base-url", "http://127.0.0.1:9", *flags)
    assert code == 2 and err.startswith("gufo: error: ") and message in err
    assert err.count("\n") == 1


def test_the_table_shows_cached_tokens_per_request_in_shared_prefix_mode():
    result = summarize([([sample([0.1, 0.2], 2, 0.3, prompt=40, cached=32), sample([0.1], 1, 0.2)], 1.0)])
    result |= {"concurrency": 2, "request_rate": None, "greedy_matches_c1": True}
    report = {
        "model": "m", "endpoint": "completions", "max_tokens": [2, 2], "prompt_words": [5, 5],
        "repetitions": 1, "seed": 0, "itl_unit": "chunk", "results": [result],
    }  # fmt: skip
    shared = markdown(report | {"shared_prefix_words": 30}).splitlines()
    assert shared[2].endswith("| greedy = C1 | cached / prompt tokens per request |")
    assert shared[4].endswith("| yes | 16.0 / 25.00 |")  # 32 cached of 40 + 10 prompt tokens, 2 requests
    plain = markdown(report | {"shared_prefix_words": 0}).splitlines()
    assert plain[2].endswith("| greedy = C1 |") and plain[4].endswith("| yes |")


class LoadSensitiveClient:
    """A stand-in server: each text is a function of its prompt, except that a prompt starting with
    `drifts` answers otherwise every time after its first (a server whose output is not a function of
    the request alone; the bench sends each reference before its load points, so the parity check must
    catch exactly those). Counting sends, not timing overlaps, keeps it deterministic on a loaded host."""

    model = "stand-in"
    cache_prompt = False
    endpoint = "completions"
    response_format = None
    token_counter = None

    def __init__(self, drifts: str | None = None):
        self.drifts = drifts
        self.lock = threading.Lock()
        self.prompts: list[str] = []

    def first_model(self) -> str:
        return self.model

    def stream(self, prompt: str, max_tokens: int) -> Sample:
        with self.lock:
            sent_before = prompt in self.prompts
            self.prompts.append(prompt)
        drifted = self.drifts is not None and prompt.startswith(self.drifts) and sent_before
        text = prompt + (" (drifted)" if drifted else "")
        return Sample(0.01, [0.01, 0.02], [1, 1], 5, 0, 2, hashlib.sha256(text.encode()).hexdigest(), 0.02)


@pytest.mark.parametrize(("parity", "checked"), [(None, 4), (2, 2), (0, 0)])
def test_parity_checks_at_most_the_asked_requests_among_as_many(parity, checked):
    """--parity N: N reference requests alone, then each load point's first N of its C requests are
    those, among C - N others sent with them; None checks all C, 0 none (no reference requests)."""
    client = LoadSensitiveClient()
    workload = Workload((3, 3), (2, 2))
    report = run_serving_bench(client, [LoadPoint(concurrency=4)], workload, 1, parity=parity)
    (row,) = report["results"]
    assert row["parity_checked"] == checked and report["parity_limit"] == parity
    assert row["greedy_matches_c1"] is (None if checked == 0 else True)
    # references alone, the timed round's 4, then the parity round's 4 when there is one
    assert len(client.prompts) == checked + 4 + (4 if checked else 0)
    assert sum(p.startswith("Note ") for p in client.prompts) == 2 * checked
    assert ("yes (2)" in markdown(report)) is (parity == 2)


def test_parity_catches_a_checked_request_whose_text_changes_under_load():
    client = LoadSensitiveClient(drifts="Note 1:")
    workload = Workload((3, 3), (2, 2))
    caught = run_serving_bench(client, [LoadPoint(concurrency=4)], workload, 1, parity=2)
    assert caught["results"][0]["greedy_matches_c1"] is False and "| NO (2) |" in markdown(caught)
    missed = run_serving_bench(
        LoadSensitiveClient(drifts="Note 1:"), [LoadPoint(concurrency=4)], workload, 1, parity=1
    )
    assert missed["results"][0]["greedy_matches_c1"] is True  # request 1 was not among the checked


class EmptyReplyHandler(http.server.BaseHTTPRequestHandler):
    """A server whose every completion ends at once, without text (end-of-generation first): a role
    chunk, the usage, [DONE]."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        events = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
        ]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args) -> None:
        pass


def test_a_reply_without_text_is_measured_not_fatal():
    """A completion that ends before any text (a model whose first token is end-of-generation) is a
    sample like any other: its end counts as its first token, no inter-token latency, the usage's token
    counts, the empty text's hash; the load point's statistics hold it."""
    httpd = http.server.HTTPServer(("127.0.0.1", 0), EmptyReplyHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{httpd.server_port}", model="m", endpoint="chat")
        got = client.stream("Hi", 4)
    finally:
        httpd.shutdown()
    assert got.chunk_times == [] and got.itls == [] and got.decode_tps is None
    assert got.ttft == got.end > 0 and (got.prompt_tokens, got.completion_tokens) == (7, 1)
    assert got.text_sha256 == hashlib.sha256(b"").hexdigest()
    stats = summarize([([got], 0.5)])
    assert stats["itl_ms"]["p50"] is None and stats["aggregate_tps"] == 2.0
    assert stats["ttft_ms"]["p50"] == pytest.approx(got.ttft * 1e3)
