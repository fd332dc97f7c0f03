"""--tensor-parallel refusals through the CLI: one line, exit 2, before any process group exists."""

from __future__ import annotations

import pytest

from tests.conftest import gufo
from tests.engine.tiny_model import write_tiny_model


@pytest.fixture(autouse=True)
def not_under_torchrun(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def one_error_line(capsys, *args: str) -> str:
    code, out, err = gufo(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gufo: error: ")
    return lines[0]


def test_run_refuses_smollm2_over_two_ranks(capsys):
    line = one_error_line(capsys, "run", "-m", "smollm2-135m", "-tp", "2", "-p", "hi")
    assert line.endswith(
        "--tensor-parallel 2 cannot split 3 KV heads (9 query heads, 3 per KV head) into 2 equal groups; "
        "degrees that split it: 3"
    )


def test_bench_refuses_gemma3_over_three_ranks(capsys):
    args = ("bench", "-m", "gemma3-270m", "--tensor-parallel", "3", "-p", "8", "-n", "0")
    line = one_error_line(capsys, *args)
    assert line.endswith(
        "cannot split 1 KV head (4 query heads, 4 per KV head) into 3 equal groups; "
        "degrees that split it: 2, 4"
    )


def test_serve_refuses_a_split_that_cuts_a_block(capsys, tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf", "qwen3", n_heads=8, n_kv_heads=4, n_ff=192)
    line = one_error_line(capsys, "serve", "-m", str(model), "-tp", "4", "--port", "0")
    assert "would cut Q8_0 blocks of blk.0.ffn_down.weight" in line


def test_tensor_parallel_needs_torchrun(capsys):
    line = one_error_line(capsys, "run", "-m", "smollm2-135m", "-tp", "3", "-p", "hi")
    assert "not launched by torchrun (WORLD_SIZE is unset); launch: python -m torch.distributed.run" in line


def test_world_size_must_equal_degree(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = one_error_line(capsys, "bench", "-m", "smollm2-135m", "-tp", "3", "-p", "8", "-n", "0")
    assert "--tensor-parallel 3: torchrun started 2 processes (WORLD_SIZE=2)" in line


def test_help_documents_the_launch_line(capsys):
    with pytest.raises(SystemExit):
        gufo(capsys, "run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "torch.distributed.run --standalone --nproc-per-node N" in text
