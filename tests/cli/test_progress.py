"""What a command says on stderr while it loads: the model's tensor bytes (counted by the `gguf`
package) with --progress, nothing without it off a terminal, and the library's stage records (the
default model's assembly, the C kernels' compilation) as log records, never prints."""

from __future__ import annotations

import logging

import pytest

from gufo.gguf import aliases
from gufo.kernels import cpu_int8
from tests.conftest import gguf_reader, gufo


def tensor_megabytes(path) -> int:
    return round(sum(int(t.n_bytes) for t in gguf_reader(path).tensors) / 1e6)


def test_load_progress_counts_the_files_tensor_bytes(capsys, model_path):
    code, out, err = gufo(capsys, "run", "-m", "smollm2-135m", "-p", "Hi", "-n", "1", "-t", "1", "--progress")
    assert code == 0 and out
    megabytes = tensor_megabytes(model_path("smollm2-135m"))
    lines = err.splitlines()
    assert lines[0] == f"gufo: loading smollm2-135m: {megabytes} MB of tensors"
    assert lines[1].startswith(f"gufo: loaded smollm2-135m ({megabytes} MB) in ")
    assert lines[2].startswith("prompt: ")


def test_no_progress_off_a_terminal_nor_with_quiet(capsys):
    for flags in ([], ["--progress", "--quiet"]):
        code, _, err = gufo(capsys, "run", "-m", "smollm2-135m", "-p", "Hi", "-n", "1", "-t", "1", *flags)
        assert code == 0
        assert [line.split(":")[0] for line in err.splitlines()] == ["prompt"], err


@pytest.mark.skipif(not cpu_int8._cpu_has_avx2(), reason="the C kernels need AVX2")
def test_stages_are_log_records(tmp_path, monkeypatch, caplog):
    """Assembling the default model and compiling the C kernels say so before they start."""
    monkeypatch.setattr(aliases, "cache_dir", lambda: tmp_path / "models")
    monkeypatch.setattr(cpu_int8.platformdirs, "user_cache_dir", lambda name: str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "false")  # a compiler that fails at once: the stage is announced, then refused
    with caplog.at_level(logging.INFO, logger="gufo"):
        path = aliases.resolve_model("gemma3-270m")
        assert cpu_int8.library.__wrapped__() is None
    assert path.parent == tmp_path / "models"
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records[0] == (logging.INFO, f"assembling gemma3-270m from its package into {path} (first use)")
    assert records[1] == (
        logging.INFO,
        "compiling the CPU kernels with false (once per version of their source)",
    )
    assert records[2][0] == logging.WARNING and "compiling the CPU kernels failed" in records[2][1]


@pytest.mark.parametrize(
    "level,line", [(logging.INFO, "gufo: stage"), (logging.WARNING, "gufo: warning: stage")]
)
def test_records_become_gufo_lines(capsys, level, line):
    from gufo.cli.progress import LineFormatter

    record = logging.LogRecord("gufo.x", level, __file__, 1, "stage", None, None)
    assert LineFormatter("%(message)s").format(record) == line
