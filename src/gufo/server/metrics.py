"""Server metrics in the Prometheus text exposition format (version 0.0.4).

Written by hand: a few counters and two histograms do not justify a dependency. Updated from the
event loop and from the scheduler thread, so every update and the rendering hold one lock.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

# Seconds; TTFT spans queueing and prefill, inter-token latency one decode step.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        out, cumulative = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            label = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{le="{label}"}} {cumulative}')
        out += [f"{name}_sum {self.total!r}", f"{name}_count {cumulative}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.http_requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated_tokens = 0
        self.finished: dict[str, int] = {}
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def http_request(self, route: str, status: int) -> None:
        with self._lock:
            key = (route, status)
            self.http_requests[key] = self.http_requests.get(key, 0) + 1

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens

    def token(self, ttft: float | None, itl: float | None) -> None:
        with self._lock:
            self.generated_tokens += 1
            if ttft is not None:
                self.ttft.observe(ttft)
            if itl is not None:
                self.itl.observe(itl)

    def speculated(self, drafted: int, accepted: int) -> None:
        with self._lock:
            self.drafted_tokens += drafted
            self.accepted_tokens += accepted

    def finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def render(self, gauges: Callable[[], dict[str, int]]) -> str:
        """The exposition text; `gauges` gives the scheduler's current counts (name -> value)."""
        lines: list[str] = []

        def family(name: str, kind: str, text: str, samples: list[str]) -> None:
            lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples])

        with self._lock:
            family(
                "gufo_http_requests_total",
                "counter",
                "HTTP requests answered, by route and status code.",
                [
                    f'gufo_http_requests_total{{route="{route}",code="{status}"}} {n}'
                    for (route, status), n in sorted(self.http_requests.items())
                ],
            )
            family(
                "gufo_requests_finished_total",
                "counter",
                "Generation requests finished, by reason (stop, length, cancelled, error).",
                [
                    f'gufo_requests_finished_total{{reason="{reason}"}} {n}'
                    for reason, n in sorted(self.finished.items())
                ],
            )
            for name, value, text in (
                ("gufo_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of admitted requests."),
                ("gufo_cached_tokens_total", self.cached_tokens, "Prompt tokens reused from a slot's KV."),
                ("gufo_generated_tokens_total", self.generated_tokens, "Tokens sampled."),
                ("gufo_draft_tokens_total", self.drafted_tokens, "Speculative draft tokens verified."),
                ("gufo_draft_tokens_accepted_total", self.accepted_tokens, "Draft tokens kept."),
            ):
                family(name, "counter", text, [f"{name} {value}"])
            family(
                "gufo_time_to_first_token_seconds",
                "histogram",
                "From submission to the first sampled token.",
                self.ttft.lines("gufo_time_to_first_token_seconds"),
            )
            family(
                "gufo_inter_token_latency_seconds",
                "histogram",
                "Between consecutive tokens of one request.",
                self.itl.lines("gufo_inter_token_latency_seconds"),
            )
        texts = {
            "gufo_requests_active": "Requests holding a slot.",
            "gufo_queue_depth": "Requests waiting for a slot or for KV pages.",
            "gufo_sessions": "KV slots (sessions).",
            "gufo_kv_pages": "Pages of the KV cache (64 positions each).",
            "gufo_kv_pages_free": "KV pages no session holds (finished requests' cached prefixes hold some).",
            "gufo_kv_pages_stored": "KV pages the prefix store keeps for later prompts (freed on demand).",
            "gufo_worker_up": "1 while the generation worker runs, 0 once it has stopped (see /health).",
        }
        for name, value in gauges().items():
            family(name, "gauge", texts[name], [f"{name} {value}"])
        return "\n".join(lines) + "\n"
