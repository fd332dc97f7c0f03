"""Serving benchmark: latency and throughput of an OpenAI-compatible server as its clients see them.

Per concurrency C, each repetition starts C streaming requests together (/v1/completions, or
/v1/chat/completions with `endpoint="chat"`; greedy, `cache_prompt: false` and a random prefix per
request, so no request reuses another's KV) and times every streamed chunk. Inter-token latency is per
token: a chunk that carries k tokens after a gap g counts as k latencies of g/k, k counted with
`token_counter` (the tokens of the text so far, less those before the chunk), or 1 per chunk without
one. Completion tokens come from the stream's usage, else from `token_counter`. Greedy parity: prompts
0..C-1 run once one at a time (this also warms the server up) and once all together; the SHA-256 of
each text must match. The result holds no prompt, generated text, URL or host name.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

import numpy as np

from gufo import __version__
from gufo.errors import BadInputError, GufoError

# Filler for prompts: plain words, so every request has about the same token count on any tokenizer.
WORDS = ("river", "stone", "light", "garden", "morning", "window", "paper", "music", "field", "winter")


TokenCounter = Callable[[str], int]


@dataclass
class Sample:
    """One streamed request, times in seconds from sending it."""

    ttft: float
    chunk_times: list[float]
    chunk_tokens: list[int]  # tokens each chunk carries
    prompt_tokens: int | None
    cached_tokens: int
    completion_tokens: int
    text_sha256: str

    @property
    def itls(self) -> list[float]:
        gaps = np.diff(self.chunk_times)
        return [float(gap) / k for gap, k in zip(gaps, self.chunk_tokens[1:], strict=True) for _ in range(k)]

    @property
    def decode_tps(self) -> float | None:
        span = self.chunk_times[-1] - self.chunk_times[0] if self.chunk_times else 0.0
        return (self.completion_tokens - 1) / span if span > 0 else None


@dataclass
class Client:
    base_url: str
    api_key: str | None = None
    timeout: float = 600.0
    model: str = ""
    endpoint: str = "completions"  # or "chat"
    token_counter: TokenCounter | None = None
    _parts: SplitResult = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInputError(f"--base-url: expected http://HOST:PORT[/v1], got {self.base_url!r}")
        self._parts = parts

    def _connection(self) -> http.client.HTTPConnection:
        parts = self._parts
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.hostname, parts.port, timeout=self.timeout)

    def _path(self, route: str) -> str:
        prefix = self._parts.path.rstrip("/")
        return (prefix if prefix.endswith("/v1") else prefix + "/v1") + route

    def _request(self, method: str, route: str, body: dict | None = None) -> http.client.HTTPResponse:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = self._connection()
        try:
            conn.request(method, self._path(route), json.dumps(body) if body else None, headers)
            response = conn.getresponse()
        except OSError as err:
            raise GufoError(f"cannot reach the server at --base-url: {err}") from None
        if response.status != 200:
            raise GufoError(f"{method} {route}: HTTP {response.status}: {error_message(response.read())}")
        return response

    def first_model(self) -> str:
        models = json.loads(self._request("GET", "/models").read())["data"]
        if not models:
            raise GufoError("GET /models: the server lists no model")
        return models[0]["id"]

    def stream(self, prompt: str, max_tokens: int) -> Sample:
        chat = self.endpoint == "chat"
        body = {
            "model": self.model,
            **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "cache_prompt": False,
        }
        started = time.perf_counter()
        response = self._request("POST", "/chat/completions" if chat else "/completions", body)
        chunk_times: list[float] = []
        texts: list[str] = []
        usage: dict = {}
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise GufoError(f"stream error: {event['error'].get('message')}")
            usage = event.get("usage") or usage
            text = "".join(chunk_text(c, chat) for c in event.get("choices") or [])
            if text:
                chunk_times.append(time.perf_counter() - started)
                texts.append(text)
        if not chunk_times:
            raise GufoError("a stream ended without text")
        text = "".join(texts)
        completion_tokens = usage.get("completion_tokens")
        if completion_tokens is None:
            if self.token_counter is None:
                raise GufoError("the stream has no usage: pass --tokenizer to count its tokens")
            completion_tokens = self.token_counter(text)
        return Sample(
            ttft=chunk_times[0],
            chunk_times=chunk_times,
            chunk_tokens=self._chunk_tokens(texts),
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            completion_tokens=completion_tokens,
            text_sha256=hashlib.sha256(text.encode()).hexdigest(),
        )

    def _chunk_tokens(self, texts: list[str]) -> list[int]:
        if self.token_counter is None:
            return [1] * len(texts)
        counts, before, so_far = [], 0, ""
        for text in texts:
            so_far += text
            total = self.token_counter(so_far)
            counts.append(max(total - before, 1))  # a chunk that merged into the previous token counts 1
            before = total
        return counts


def chunk_text(choice: dict, chat: bool) -> str:
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def error_message(body: bytes) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", errors="replace")


def make_prompt(prefix: str, words: int) -> str:
    return f"{prefix}: " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def run_round(client: Client, prompts: list[str], max_tokens: int) -> tuple[list[Sample], float]:
    """All prompts at once, one thread each; the samples in prompt order and the round's seconds."""
    samples: list[Sample | None] = [None] * len(prompts)
    errors: list[Exception] = []
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        barrier.wait()
        try:
            samples[i] = client.stream(prompts[i], max_tokens)
        except Exception as err:  # re-raised on the calling thread
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return [s for s in samples if s is not None], seconds


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values) * 1e3, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def run_serving_bench(
    client: Client,
    concurrency: list[int],
    max_tokens: int,
    repetitions: int,
    prompt_words: int,
    progress: Callable[[str], None] | None = None,
) -> dict:
    say = progress or (lambda _: None)
    client.model = client.model or client.first_model()
    parity_prompts = [make_prompt(f"Note {j}", prompt_words) for j in range(max(concurrency))]
    say(f"reference: {len(parity_prompts)} greedy requests one at a time")
    reference = [client.stream(p, max_tokens).text_sha256 for p in parity_prompts]
    results = []
    for c in concurrency:
        samples: list[Sample] = []
        aggregate: list[float] = []
        for rep in range(repetitions):
            say(f"C={c} repetition {rep + 1}/{repetitions}")
            prompts = [make_prompt(secrets.token_hex(6), prompt_words) for _ in range(c)]
            round_samples, seconds = run_round(client, prompts, max_tokens)
            samples += round_samples
            aggregate.append(sum(s.completion_tokens for s in round_samples) / seconds)
        parity = None
        if c > 1:
            say(f"C={c} greedy parity round")
            together, _ = run_round(client, parity_prompts[:c], max_tokens)
            parity = [s.text_sha256 for s in together] == reference[:c]
        results.append(
            {
                "concurrency": c,
                "requests": len(samples),
                "prompt_tokens": mean([s.prompt_tokens for s in samples]),
                "cached_tokens": sum(s.cached_tokens for s in samples),
                "completion_tokens": mean([s.completion_tokens for s in samples]),
                "ttft_ms": percentiles([s.ttft for s in samples]),
                "itl_ms": percentiles([x for s in samples for x in s.itls]),
                "prefill_tps": mean([s.prompt_tokens / s.ttft if s.prompt_tokens else None for s in samples]),
                "decode_tps_per_request": mean([s.decode_tps for s in samples]),
                "aggregate_tps": mean(aggregate),
                "aggregate_tps_samples": aggregate,
                "greedy_matches_c1": parity,
            }
        )
    return {
        "model": client.model,
        "endpoint": client.endpoint,
        "itl_unit": "chunk" if client.token_counter is None else "token",
        "max_tokens": max_tokens,
        "prompt_words": prompt_words,
        "repetitions": repetitions,
        "gufo_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }


def markdown(report: dict) -> str:
    def triple(p: dict) -> str:
        return " / ".join("-" if v is None else f"{v:.1f}" for v in p.values())

    def number(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    lines = [
        f"model {report['model']} ({report['endpoint']}), max_tokens {report['max_tokens']}, "
        f"prompt ~{report['prompt_words']} words, {report['repetitions']} repetitions, "
        f"ITL per {report['itl_unit']}",
        "",
        "| C | TTFT p50/p95/p99 ms | ITL p50/p95/p99 ms | prefill t/s | decode t/s/req | aggregate t/s "
        "| greedy = C1 |",
        "|--:|---|---|--:|--:|--:|:-:|",
    ]
    for r in report["results"]:
        parity = {None: "-", True: "yes", False: "NO"}[r["greedy_matches_c1"]]
        lines.append(
            f"| {r['concurrency']} | {triple(r['ttft_ms'])} | {triple(r['itl_ms'])} "
            f"| {number(r['prefill_tps'])} | {number(r['decode_tps_per_request'])} "
            f"| {number(r['aggregate_tps'])} | {parity} |"
        )
    return "\n".join(lines)
