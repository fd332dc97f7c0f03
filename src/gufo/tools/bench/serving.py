"""Serving benchmark: latency and throughput of an OpenAI-compatible server as its clients see them.

A run measures load points: a concurrency C (each repetition starts C streaming requests together) or a
request rate R (each repetition sends `requests` requests at Poisson arrivals of R per second, seeded:
an open loop, each request in its own thread). Requests go to /v1/completions, or /v1/chat/completions
with `endpoint="chat"`; they are greedy, and each has its prompt length (filler words) and max_tokens
drawn uniformly from the workload's ranges; chat requests may carry a `response_format` (json_object
or json_schema), to measure what constrained decoding costs. Each prompt starts with a random prefix
and is sent with `cache_prompt: false`, so no request reuses another's KV; in shared-prefix mode every
prompt starts with the same `shared_prefix_words` words instead and asks the server to reuse cached
prefixes, which measures the prefix cache (the report sums the cached tokens the server reports).

Every streamed chunk is timed; a reply that ends before any text (end-of-generation first) counts its end
as its first token and has no inter-token latency. Inter-token latency is per token: a chunk that
carries k tokens after a gap g counts as k latencies of g/k, k counted with `token_counter` (the tokens
of the text so far, less those before the chunk), or 1 per chunk without one. Completion tokens come
from the stream's usage, else from `token_counter`. Greedy parity: a fixed set of requests runs once
one at a time (this also warms the server up) and once more under each load point, as many of them as
the point sends at once (up to `parity` of them, the rest of the point's requests then other prompts,
so the checked ones still run among as many); the SHA-256 of each checked text must match. The result
holds no prompt, generated text, URL or host name.
"""

from __future__ import annotations

import csv
import hashlib
import http.client
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

import numpy as np

from gufo import __version__
from gufo.errors import BadInputError, GufoError

# Filler for prompts: plain words, so every request has about the same token count on any tokenizer.
WORDS = ("river", "stone", "light", "garden", "morning", "window", "paper", "music", "field", "winter")
PARITY_SEED_OFFSET = 1  # the parity requests' lengths come from seed + 1, the timed ones' from seed


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
    end: float = 0.0  # the stream's end ([DONE])

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
    cache_prompt: bool = False  # let the server reuse cached prefixes (shared-prefix mode)
    response_format: dict | None = (
        None  # chat only: OpenAI's response_format, to measure constrained decoding
    )
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
            "cache_prompt": self.cache_prompt,
            **({"response_format": self.response_format} if self.response_format else {}),
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
        end = time.perf_counter() - started
        text = "".join(texts)
        completion_tokens = usage.get("completion_tokens")
        if completion_tokens is None:
            if self.token_counter is None:
                raise GufoError("the stream has no usage: pass --tokenizer to count its tokens")
            completion_tokens = self.token_counter(text)
        return Sample(  # a reply without text (end-of-generation first) has its end as its first token
            ttft=chunk_times[0] if chunk_times else end,
            chunk_times=chunk_times,
            chunk_tokens=self._chunk_tokens(texts),
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            completion_tokens=completion_tokens,
            text_sha256=hashlib.sha256(text.encode()).hexdigest(),
            end=end,
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


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    """What the requests send: prompt filler words and max_tokens each drawn uniformly from an inclusive
    range (`seed` makes the draws and the arrival times repeatable), and a shared prompt prefix, which the
    server may reuse from its cache unless `reuse_prefix` is off (the baseline the cache's gain is
    measured against)."""

    prompt_words: tuple[int, int]
    max_tokens: tuple[int, int]
    shared_prefix_words: int = 0
    seed: int = 0
    reuse_prefix: bool = True

    def shared_prefix(self) -> str:
        """The words every prompt starts with in shared-prefix mode (a pattern unlike the filler's)."""
        if not self.shared_prefix_words:
            return ""
        words = (WORDS[(3 * i + 1) % len(WORDS)] for i in range(self.shared_prefix_words))
        return "Shared context: " + " ".join(words) + "\n"

    def requests(self, labels: list[str], rng: np.random.Generator) -> list[Request]:
        """One request per label (the prompt's own prefix, after the shared one), lengths drawn from rng."""
        shared = self.shared_prefix()
        out = []
        for label in labels:
            words = int(rng.integers(self.prompt_words[0], self.prompt_words[1], endpoint=True))
            tokens = int(rng.integers(self.max_tokens[0], self.max_tokens[1], endpoint=True))
            out.append(Request(shared + make_prompt(label, words), tokens))
        return out


@dataclass(frozen=True)
class LoadPoint:
    """C concurrent requests per repetition, or `requests` requests at `rate` per second."""

    concurrency: int | None = None
    rate: float | None = None
    requests: int = 0

    @property
    def count(self) -> int:
        """Requests per repetition."""
        return self.concurrency if self.concurrency is not None else self.requests

    @property
    def label(self) -> str:
        return f"C={self.concurrency}" if self.concurrency is not None else f"{self.rate:g} req/s"

    def arrivals(self, rng: np.random.Generator) -> list[float]:
        """Seconds after the start at which each request of a repetition is sent."""
        if self.rate is None:
            return [0.0] * self.count
        return poisson_arrivals(self.rate, self.count, rng)


def poisson_arrivals(rate: float, count: int, rng: np.random.Generator) -> list[float]:
    """Send times of `count` requests arriving as a Poisson process of `rate` per second: the first at 0,
    then gaps drawn from the exponential distribution of mean 1 / rate."""
    gaps = rng.exponential(1.0 / rate, max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


def make_prompt(prefix: str, words: int) -> str:
    return f"{prefix}: " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def run_load(client: Client, requests: list[Request], arrivals: list[float]) -> tuple[list[Sample], float]:
    """Each request in its own thread, sent `arrivals[i]` seconds after a common start; the samples in
    request order and the seconds from the start until the last one ended."""
    samples: list[Sample | None] = [None] * len(requests)
    errors: list[Exception] = []
    begin: list[float] = []
    barrier = threading.Barrier(len(requests), action=lambda: begin.append(time.perf_counter()))

    def one(i: int) -> None:
        barrier.wait()
        time.sleep(max(0.0, begin[0] + arrivals[i] - time.perf_counter()))
        try:
            samples[i] = client.stream(requests[i].prompt, requests[i].max_tokens)
        except Exception as err:  # re-raised on the calling thread
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - begin[0]
    if errors:
        raise errors[0]
    return [s for s in samples if s is not None], seconds


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p95/p99 in milliseconds of values in seconds (numpy's linear interpolation)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values) * 1e3, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def summarize(rounds: list[tuple[list[Sample], float]]) -> dict:
    """The statistics of one load point's repetitions (each: its samples and its seconds)."""
    samples = [s for round_samples, _ in rounds for s in round_samples]
    aggregate = [sum(s.completion_tokens for s in got) / seconds for got, seconds in rounds]
    prompt_tokens = [s.prompt_tokens for s in samples]
    return {
        "requests": len(samples),
        "prompt_tokens": mean(prompt_tokens),
        "cached_tokens": sum(s.cached_tokens for s in samples),
        "cached_fraction": (
            sum(s.cached_tokens for s in samples) / sum(prompt_tokens)
            if None not in prompt_tokens and sum(prompt_tokens)
            else None
        ),
        "completion_tokens": mean([s.completion_tokens for s in samples]),
        "ttft_ms": percentiles([s.ttft for s in samples]),
        "itl_ms": percentiles([x for s in samples for x in s.itls]),
        "e2e_ms": percentiles([s.end for s in samples]),
        "prefill_tps": mean([s.prompt_tokens / s.ttft if s.prompt_tokens else None for s in samples]),
        "decode_tps_per_request": mean([s.decode_tps for s in samples]),
        "aggregate_tps": mean(aggregate),
        "aggregate_tps_samples": aggregate,
        "request_throughput": mean([len(got) / seconds for got, seconds in rounds]),
    }


def run_serving_bench(
    client: Client,
    points: list[LoadPoint],
    workload: Workload,
    repetitions: int,
    progress: Callable[[str], None] | None = None,
    parity: int | None = None,
) -> dict:
    """The report of `points` (`repetitions` each) of `workload`; `parity`: most requests of a load point
    whose greedy text is checked against the same request sent alone (None: all of them; 0: none)."""
    say = progress or (lambda _: None)
    client.model = client.model or client.first_model()
    client.cache_prompt = workload.shared_prefix_words > 0 and workload.reuse_prefix
    rng = np.random.default_rng(workload.seed)
    parity_rng = np.random.default_rng(workload.seed + PARITY_SEED_OFFSET)
    most = max(point.count for point in points)
    n_parity = most if parity is None else min(parity, most)
    parity_requests = workload.requests([f"Note {j}" for j in range(n_parity)], parity_rng)
    say(f"reference: {n_parity} greedy requests one at a time")
    reference = [client.stream(r.prompt, r.max_tokens).text_sha256 for r in parity_requests]
    results = []
    for point in points:
        rounds = []
        for rep in range(repetitions):
            say(f"{point.label} repetition {rep + 1}/{repetitions}")
            requests = workload.requests([secrets.token_hex(6) for _ in range(point.count)], rng)
            rounds.append(run_load(client, requests, point.arrivals(rng)))
        matches = None
        checked = min(point.count, n_parity)
        if point.count > 1 and checked:
            say(f"{point.label} greedy parity round")
            others = workload.requests([secrets.token_hex(6) for _ in range(point.count - checked)], rng)
            together, _ = run_load(client, parity_requests[:checked] + others, point.arrivals(rng))
            matches = [s.text_sha256 for s in together[:checked]] == reference[:checked]
        results.append(
            {
                "concurrency": point.concurrency,
                "request_rate": point.rate,
                **summarize(rounds),
                "greedy_matches_c1": matches,
                "parity_checked": checked if matches is not None else 0,
            }
        )
    return {
        "model": client.model,
        "endpoint": client.endpoint,
        "response_format": (client.response_format or {}).get("type"),
        "itl_unit": "chunk" if client.token_counter is None else "token",
        "max_tokens": list(workload.max_tokens),
        "prompt_words": list(workload.prompt_words),
        "shared_prefix_words": workload.shared_prefix_words,
        "cache_prompt": client.cache_prompt,
        "parity_limit": parity,
        "seed": workload.seed,
        "repetitions": repetitions,
        "gufo_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }


def span(pair: list[int]) -> str:
    """A workload range as the flag takes it: `N` or `A:B`."""
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}:{pair[1]}"


def load_label(row: dict) -> str:
    return str(row["concurrency"]) if row["concurrency"] is not None else f"{row['request_rate']:g}/s"


def markdown(report: dict) -> str:
    def triple(p: dict) -> str:
        return " / ".join("-" if v is None else f"{v:.1f}" for v in p.values())

    def number(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    shared = report["shared_prefix_words"]
    constrained = report.get("response_format")
    lines = [
        f"model {report['model']} ({report['endpoint']}"
        + (f", response_format {constrained}" if constrained else "")
        + f"), max_tokens {span(report['max_tokens'])}, "
        f"prompt ~{span(report['prompt_words'])} words"
        + (f" after a shared prefix of {shared} words" if shared else "")
        + (" (cache_prompt=false)" if shared and not report.get("cache_prompt", True) else "")
        + f", {report['repetitions']} repetitions, seed {report['seed']}, ITL per {report['itl_unit']}",
        "",
        "| C or rate | TTFT p50/p95/p99 ms | ITL p50/p95/p99 ms | prefill t/s | decode t/s/req "
        "| aggregate t/s | req/s | greedy = C1 |"
        + (" cached / prompt tokens per request |" if shared else ""),
        "|--:|---|---|--:|--:|--:|--:|:-:|" + ("--:|" if shared else ""),
    ]
    for r in report["results"]:
        parity = {None: "-", True: "yes", False: "NO"}[r["greedy_matches_c1"]]
        if report.get("parity_limit") is not None and r["greedy_matches_c1"] is not None:
            parity += f" ({r['parity_checked']})"  # how many of the point's requests were checked
        # the server's usage counts, so that a shared-prefix run shows how much of the prefix was reused
        cached = (
            f" {r['cached_tokens'] / r['requests']:.1f} / {number(r['prompt_tokens'])} |" if shared else ""
        )
        lines.append(
            f"| {load_label(r)} | {triple(r['ttft_ms'])} | {triple(r['itl_ms'])} "
            f"| {number(r['prefill_tps'])} | {number(r['decode_tps_per_request'])} "
            f"| {number(r['aggregate_tps'])} | {number(r['request_throughput'])} | {parity} |{cached}"
        )
    return "\n".join(lines)


SWEEP_COLUMNS = (
    "concurrency",
    "request_rate",
    "requests",
    "request_throughput",
    "aggregate_tps",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "cached_fraction",
    "greedy_matches_c1",
)


def sweep_rows(report: dict) -> list[dict]:
    """Throughput against latency, one row per load point (the `--sweep` table)."""
    rows = []
    for r in report["results"]:
        row = {name: r.get(name) for name in SWEEP_COLUMNS}
        for stat in ("ttft", "itl", "e2e"):
            for p in ("p50", "p99"):
                row[f"{stat}_{p}_ms"] = r[f"{stat}_ms"][p]
        rows.append(row)
    return rows


def write_sweep(report: dict, path: Path) -> None:
    """The sweep table as CSV (empty cells for missing values)."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, SWEEP_COLUMNS)
        writer.writeheader()
        for row in sweep_rows(report):
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
