"""`gufo serve` and `gufo bench-serve` on the command line: bad input is one line and exit 2; a real
`gufo serve` process answers, then stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import gufo
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


def test_bad_flag_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        gufo(capsys, "serve", "--request-timeout", "0")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--request-timeout" in err and len(err.strip().splitlines()) == 1


def test_serve_process_answers_and_stops_on_interrupt():
    proc = subprocess.Popen(
        [sys.executable, "-m", "gufo.cli.main", "serve", "-m", MODEL, "--port", "0", "-c", "256", "-t", "1"],
        stderr=subprocess.PIPE,
        text=True,
        # a runner started in the background (`cmd &`) ignores SIGINT, and children inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        url = f"http://127.0.0.1:{match.group(1)}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
                    assert json.load(response) == {"status": "ok"}
                    break
            except urllib.error.HTTPError as err:
                assert err.code == 503 and time.monotonic() < deadline
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            assert [m["id"] for m in json.load(response)["data"]] == [MODEL]
        proc.send_signal(signal.SIGINT)  # uvicorn shuts down, then the CLI reports the interrupt
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read()
        assert "Traceback" not in err and err.rstrip().endswith("gufo: interrupted")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
