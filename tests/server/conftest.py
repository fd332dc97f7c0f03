"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, and raw HTTP helpers."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import openai
import pytest

from gufo.engine.engine import Engine
from gufo.models.kv_cache import KVCache
from gufo.options import RunOptions
from gufo.server.run import listen, make_server
from gufo.server.settings import ServerSettings
from tests.conftest import HANG_GUARD_S

MODEL = "smollm2-135m"
CONTEXT = 512


def load_engine(n_slots: int) -> Engine:
    # One thread: on a shared 2-core machine OpenMP barriers stall badly when oversubscribed.
    return Engine(MODEL, options=RunOptions(threads=1), context=CONTEXT, n_slots=n_slots)


@dataclass
class LiveServer:
    base_url: str
    api_key: str | None = None

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=self.api_key or "none",
            max_retries=0,
            timeout=HANG_GUARD_S,
        )

    def request(
        self, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None
    ) -> tuple[int, dict | str]:
        """Status and parsed JSON (or text) of one request, error statuses included."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        all_headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        all_headers.update(headers or {})
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def metric(self, name: str) -> float:
        _, text = self.request("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def metric_labelled(self, reason: str) -> float:
        """gufo_requests_finished_total for one finish reason."""
        return self.metric(f'gufo_requests_finished_total{{reason="{reason}"}}')


@contextmanager
def live_server(
    settings: ServerSettings, load: Callable[[], Engine], wait_ready: bool = True
) -> Iterator[LiveServer]:
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_server(settings, load, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    live = LiveServer(f"http://127.0.0.1:{port}", settings.api_key)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        while wait_ready and live.request("GET", "/health")[0] != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.1)
        yield live
    finally:
        server.should_exit = True
        thread.join(HANG_GUARD_S)


def wait_for(condition: Callable[[], bool]) -> None:
    """Poll `condition` until it holds; the guard catches a hang, it is no bound on speed."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def assert_error(status: int, body: object, expected: int, code: str | None = None) -> dict:
    """An OpenAI error object with exactly its four fields; returns it."""
    assert status == expected, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and "Traceback" not in error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.fixture(scope="session")
def reference_engine() -> Engine:
    """gufo's own Engine, apart from any server, for the expected greedy outputs."""
    return load_engine(1)


class PageAccounting:
    """The KV page side of the Engine that a scheduler's stand-in engine keeps: a real paged cache of
    one-number entries, so the scheduler's admission reads real page counts (pages are taken only where
    the stand-in reserves them)."""

    context = 512
    tensor_parallel = 1

    def __init__(self, n_slots: int):
        self.cache = KVCache(1, n_slots, 1, self.context, 1, 1, page_size=4)  # pages of the tests' prompts

    def release_pages(self, slot: int, length: int) -> None:
        self.cache.release(slot, length)

    chunk_invariant = False  # a stand-in for the GPU's tiles: prefilled tokens reusable at any length

    @property
    def chunk_invariant_prefill(self) -> bool:
        return self.chunk_invariant or self.invariant_prefill

    def packs_prefill(self, n_tokens: int) -> bool:
        return False  # one prefill per chunk, as Engine.prefill_parts runs chunks that cannot share a pass

    def prefill_parts(self, parts) -> list:
        return [self.prefill(part.tokens, part.slot, part.start) for part in parts]
