"""`gufo bench-serve`'s client against a scripted SSE server that sends no usage: completion tokens
and per-token latencies come from the token counter."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gufo.errors import GufoError
from gufo.tools.bench.serving import Client

CHUNKS = ["one two", " three", " four five six"]  # 2, 1 and 3 words


def words(text: str) -> int:
    """The scripted tokenizer: one token per word."""
    return len(text.split())


class ScriptedStream(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        chat = self.path.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in CHUNKS:
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *_) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedStream)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_no_usage_counts_tokens_with_the_counter(base_url, endpoint):
    sample = Client(base_url, model="m", endpoint=endpoint, token_counter=words).stream("hi", 8)
    assert sample.completion_tokens == 6 and sample.chunk_tokens == [2, 1, 3]
    assert len(sample.itls) == 1 + 3  # the first chunk's gap is the TTFT; the others one per token
    assert sample.prompt_tokens is None


def test_no_usage_and_no_counter_is_one_clear_error(base_url):
    with pytest.raises(GufoError, match="--tokenizer"):
        Client(base_url, model="m").stream("hi", 8)
