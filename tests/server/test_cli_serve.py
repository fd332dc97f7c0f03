"""`gufo serve` and `gufo bench-serve` on the command line: bad input is one line and exit 2; a real
`gufo serve` process answers, then stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import gguf
import pytest

from gufo.server.run import listen
from tests.conftest import HANG_GUARD_S, gufo
from tests.gguf.test_model_file import write_tiny
from tests.server.conftest import MODEL


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["serve", "-m", "no-such-model.gguf"], "no-such-model"),
        (["bench-serve", "--base-url", "ftp://127.0.0.1:1"], "--base-url"),
        (["bench-serve", "--base-url", "http://127.0.0.1:1", "--concurrency", "1,0"], "--concurrency"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, fragment):
    code, _, err = gufo(capsys, *args)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flag,value", [("--request-timeout", "0"), ("--kv-memory", "0M"), ("--kv-memory", "8GiB")]
)
def test_bad_flag_value_is_a_usage_error(capsys, flag, value):
    with pytest.raises(SystemExit) as exited:
        gufo(capsys, "serve", flag, value)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_kv_memory_below_one_context_is_one_error_line(capsys):
    """Found while the model loads (after the server listens): the status line, then one error line."""
    code, _, err = gufo(capsys, "serve", "-m", MODEL, "-c", "256", "--kv-memory", "1M", "--port", "0")
    assert code == 2
    assert err.splitlines()[1:] == [
        "gufo: error: a KV cache of 0 pages (0 MiB) holds less than one sequence of 256 tokens (the context "
        "size): more KV memory or a smaller context"
    ]


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_port_outside_the_tcp_range_is_a_usage_error(capsys, port):
    """--port 70000 was a traceback from bind() (OverflowError)."""
    with pytest.raises(SystemExit) as exited:
        gufo(capsys, "serve", "--port", port)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gufo serve: error: argument --port: expected a TCP port number 0-65535, got '{port}' "
        "(see gufo serve --help)"
    ]


def test_port_in_use_is_bad_input(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = gufo(capsys, "serve", "-m", MODEL, "--port", str(port))
    assert code == 2
    assert err.splitlines() == [f"gufo: error: cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_truncated_model_is_refused_before_listening(capsys, tmp_path):
    """It listened, then the load failed in the background with uvicorn's lines around the error."""
    good = write_tiny(tmp_path / "good.gguf")
    last = max(gguf.GGUFReader(good).tensors, key=lambda t: t.data_offset)  # oracle: the gguf package
    end = last.data_offset + last.n_bytes
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: end - 64])
    code, _, err = gufo(capsys, "serve", "-m", str(truncated), "--port", "0")  # returns: nothing served
    assert code == 2
    assert err.splitlines() == [
        f"gufo: error: truncated.gguf: tensor {last.name} ends at byte {end}, file has {end - 64}"
    ]


def start_serve(*flags: str) -> tuple[subprocess.Popen, str]:
    """A real `gufo serve` process on a free port, once /health says ok, and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gufo.cli.main", "serve", "-m", MODEL, "--port", "0", "-c", "512", "-t", "1"]
        + list(flags),
        stderr=subprocess.PIPE,
        text=True,
        # a runner started in the background (`cmd &`) ignores SIGINT, and children inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    line = proc.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert match, line
    url = f"http://127.0.0.1:{match.group(1)}"
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=HANG_GUARD_S) as response:
                assert json.load(response) == {"status": "ok"}
                return proc, url
        except urllib.error.HTTPError as err:
            assert err.code == 503 and time.monotonic() < deadline
            time.sleep(0.2)


def test_serve_process_answers_and_stops_on_interrupt():
    proc, url = start_serve()
    try:
        assert proc.stderr.readline() == f"gufo: ready: {MODEL} answers on {url}/v1\n"  # once loaded
        with urllib.request.urlopen(f"{url}/v1/models", timeout=HANG_GUARD_S) as response:
            assert [m["id"] for m in json.load(response)["data"]] == [MODEL]
        proc.send_signal(signal.SIGINT)  # uvicorn shuts down, then the CLI reports the interrupt
        assert proc.wait(timeout=HANG_GUARD_S) == 130
        err = proc.stderr.read()
        assert "Traceback" not in err and err.rstrip().endswith("gufo: interrupted")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def sse_events(url: str, body: dict, first_text: threading.Event, out: list) -> None:
    """A stream's data events, in order; `first_text` is set once text has arrived."""
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    events = []
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                if line[6:] != "[DONE]" and json.loads(line[6:]).get("choices"):
                    first_text.set()
    first_text.set()
    out.append(events)


def plain_reply(url: str, body: dict, out: list) -> None:
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            out.append((response.status, json.load(response)))
    except urllib.error.HTTPError as err:
        out.append((err.code, json.load(err)))


def test_sigterm_ends_running_requests_cleanly_and_frees_the_port():
    proc, url = start_serve("--sessions", "2", "--max-tokens", "400", "--shutdown-timeout", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        # Long generations: end-of-text and the chat markers are banned, so they outlast the timeout.
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
        body["logit_bias"] = {"0": -100, "1": -100, "2": -100}
        streamed, replied, first_text = [], [], threading.Event()
        threads = [
            threading.Thread(target=sse_events, args=(url, {**body, "stream": True}, first_text, streamed)),
            threading.Thread(target=plain_reply, args=(url, body, replied)),
        ]
        for thread in threads:
            thread.start()
        assert first_text.wait(HANG_GUARD_S)
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it is done, so the process ends by it
        assert proc.wait(timeout=HANG_GUARD_S) == -signal.SIGTERM
        for thread in threads:
            thread.join(HANG_GUARD_S)
        events = streamed[0]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        if "error" in last:  # still running at the timeout
            assert last["error"]["code"] == "shutting_down" and last["error"]["type"] == "unavailable_error"
        else:
            assert last["choices"][0]["finish_reason"] in ("stop", "length")
        status, reply = replied[0]
        assert status == 200 or (status == 503 and reply["error"]["code"] == "shutting_down"), reply
        assert "Traceback" not in proc.stderr.read()
        listen("127.0.0.1", port).close()  # the port is free again
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
