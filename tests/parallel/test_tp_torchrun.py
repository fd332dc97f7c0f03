"""`gufo run` and `gufo bench` launched by torchrun on the CPU (gloo): rank 0's output and token trace
equal the single process's, the other ranks print nothing, bench rows carry the degree and per-rank
memory. This is the engine's int8 CPU path, where greedy ids (not logits to 1e-4) are the contract."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gufo.options import RunOptions
from tests.conftest import HANG_GUARD_S, gufo
from tests.engine.tiny_model import write_tiny_model


def torchrun(world: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 shared cores: one thread per rank
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    command += ["-m", "gufo.cli.main", *args, "-tp", str(world), "-t", "1"]
    return subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)


def trace_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("[TokenTrace]"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "tiny.gguf"
    return str(write_tiny_model(path, "qwen3", n_heads=8, n_kv_heads=4, n_ff=128))


# Sharded products add their K ranges in another order (row-parallel all-reduce) and round their own
# int8 activations, so the logits differ from one process's a little: greedy ids are the contract only
# where the top two logits are further apart than that. smollm2's 15th token after "The capital of France
# is" is a near-tie ('1' over '2' by 0.044), which a 3-way split flipped on one CPU and not on another.
TP_MARGIN = 0.25
MIN_COMPARED = 8


def clear_greedy_tokens(model: str, prompt: str, most: int) -> int:
    """How many leading greedy tokens of the single process lead the runner-up by TP_MARGIN or more."""
    from gufo.engine.engine import Engine

    engine = Engine(model, options=RunOptions(threads=1), context=64, n_slots=1)
    ids = engine.tokenizer.encode(prompt)
    logits = engine.prefill(ids, 0)
    for step in range(most):
        top = logits.float().topk(2)
        if float(top.values[0] - top.values[1]) < TP_MARGIN:
            return step
        logits = engine.decode(int(top.indices[0]), len(ids) + step, 0)
    return most


@pytest.mark.parametrize(
    "model,world,prompt",
    [("tiny", 2, "t1 t2 t3 t4"), ("smollm2-135m", 3, "The capital of France is")],
)
def test_run_greedy_trace_equals_single_process(capsys, tiny, model, world, prompt):
    model = tiny if model == "tiny" else model
    tokens = clear_greedy_tokens(model, prompt, 16)
    assert tokens >= MIN_COMPARED  # the comparison still covers a sentence
    args = ["run", "-m", model, "-p", prompt, "-n", str(tokens), "--temp", "0", "--ignore-eos", "--verbose"]
    code, out, err = gufo(capsys, *args, "-t", "1")
    assert code == 0
    launched = torchrun(world, *args)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert launched.stdout == out  # rank 0 alone prints the text
    assert trace_line(launched.stderr) == trace_line(err)
    assert launched.stderr.count("[TokenTrace]") == 1


def test_bench_reports_degree_and_rank_memory(tiny):
    # depth (snapshot/restore mirrored to the followers) and prefill validation run on every rank
    args = ["bench", "-m", tiny, "-p", "16", "-n", "4", "-d", "8", "-r", "2", "-o", "json"]
    launched = torchrun(2, *args, "--validate-prefill", "8")
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert "top1_match=yes" in launched.stderr
    rows = json.loads(launched.stdout)
    assert [row["test"] for row in rows] == ["pp16 @ d8", "tg4 @ d8"]
    for row in rows:
        assert row["tensor_parallel"] == 2
        assert len(row["rank_peak_memory"]) == 2 and all(m > 0 for m in row["rank_peak_memory"])
        assert row["routes"]["decode_layer"] == "torch:torch-layer"  # the fused C layer has no all-reduce


CHUNK = 4  # prefill chunk of both servers: small enough that the second request reuses some


def test_serve_rank0_answers_like_a_single_process(tiny):
    """Rank 0 listens; a greedy completion (two sessions, prefix reuse on the second request) equals the
    in-process single-process server's; Ctrl-C on torchrun stops every rank."""
    from gufo.engine.engine import Engine
    from gufo.server.settings import ServerSettings
    from tests.server.conftest import LiveServer, live_server

    bodies = [
        {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
        for prompt in ("t1 t2 t3", "t1 t2 t3 t4 t5")
    ]
    settings = ServerSettings(model_id="tiny", prefill_chunk=CHUNK)
    with live_server(
        settings, lambda: Engine(tiny, options=RunOptions(threads=1), context=64, n_slots=2)
    ) as server:
        expected = [server.request("POST", "/v1/completions", body)[1] for body in bodies]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "gufo.cli.main", "serve", "-m", tiny, "-tp", "2", "-t", "1", "-c", "64"]
    command += [
        "--sessions",
        "2",
        "--prefill-chunk",
        str(CHUNK),
        "--port",
        "0",
        "--served-model-name",
        "tiny",
    ]
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,  # Ctrl-C goes to torchrun's whole process group, as in a terminal
    )
    try:
        port = None
        while port is None:
            line = proc.stderr.readline()
            assert line, "torchrun exited before serving"
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            port = match and match.group(1)
        live = LiveServer(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + HANG_GUARD_S
        while live.request("GET", "/health")[0] != 200:
            assert time.monotonic() < deadline and proc.poll() is None, "the sharded model did not load"
            time.sleep(0.2)
        first_prompt = expected[0]["usage"]["prompt_tokens"]
        for body, want in zip(bodies, expected, strict=True):
            status, got = live.request("POST", "/v1/completions", body)
            assert status == 200, got
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
            cached = got["usage"].pop("prompt_tokens_details")["cached_tokens"]
            # The sharded prefill is not batch-invariant: it reuses only whole prefill chunks of prompt
            # tokens (gufo.server.scheduler), where the single process reuses any prefix.
            reusable = min(want["usage"].pop("prompt_tokens_details")["cached_tokens"], first_prompt)
            assert cached == reusable // CHUNK * CHUNK
            assert got["usage"] == want["usage"]
        assert cached > 0  # the second request reused KV on every rank
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=HANG_GUARD_S)  # every rank ends: none hangs in a collective
        err = proc.stderr.read()  # torchrun itself prints a SignalException traceback, gufo's ranks do not
        assert err.count("gufo: interrupted") == 2 and "/gufo/" not in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
