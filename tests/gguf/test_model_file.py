"""Malformed GGUF files: one clear line naming the file and the problem, exit code 2, no traceback."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from gufo.errors import BadInputError
from gufo.gguf.model_file import open_model_file
from tests.conftest import HANG_GUARD_S


def write_tiny(
    path: Path,
    arch: str = "llama",
    qtype: str = "F32",
    drop_key: str | None = None,
    **split_options: Any,
) -> Path:
    """A tiny but complete llama-shaped GGUF written with the `gguf` package's writer; with its split options
    (split_max_tensors, small_first_shard), split by it into `NAME-00001-of-0000N.gguf`, ... (then `path`
    itself is not written)."""
    writer = gguf.GGUFWriter(str(path), arch, **split_options)
    keys = {
        "block_count": 1,
        "context_length": 32,
        "embedding_length": 32,
        "feed_forward_length": 64,
        "attention.head_count": 2,
        "attention.head_count_kv": 2,
    }
    for key, value in keys.items():
        if drop_key != f"{arch}.{key}":
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (64, 32),
        "output_norm.weight": (32,),
        "blk.0.attn_norm.weight": (32,),
        "blk.0.ffn_norm.weight": (32,),
        "blk.0.attn_q.weight": (32, 32),
        "blk.0.attn_k.weight": (32, 32),
        "blk.0.attn_v.weight": (32, 32),
        "blk.0.attn_output.weight": (32, 32),
        "blk.0.ffn_gate.weight": (64, 32),
        "blk.0.ffn_up.weight": (64, 32),
        "blk.0.ffn_down.weight": (32, 64),
    }
    for name, shape in shapes.items():
        data = rng.standard_normal(shape).astype(np.float32)
        if qtype != "F32" and len(shape) == 2:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(BadInputError) as info:
        open_model_file(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_valid_tiny_file_opens(tmp_path):
    mf = open_model_file(write_tiny(tmp_path / "ok.gguf"))
    reader = gguf.GGUFReader(mf.path)  # the gguf package is the oracle for offsets and shapes
    for t in reader.tensors:
        mine = mf.tensors[t.name]
        assert mine.offset == t.data_offset
        assert mine.shape == tuple(reversed(t.shape.tolist()))
        assert np.array_equal(mine.data.reshape(-1).view(np.uint8), t.data.reshape(-1).view(np.uint8))
    assert mf.metadata["llama.block_count"] == reader.fields["llama.block_count"].contents()


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    expect_error(path, "empty.gguf", "empty")


def test_wrong_magic(tmp_path):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    expect_error(path, "magic.gguf", "not a GGUF file")


def test_truncated_tensor_data(tmp_path):
    path = write_tiny(tmp_path / "trunc.gguf")
    last = max(gguf.GGUFReader(path).tensors, key=lambda t: t.data_offset)  # oracle: the gguf package
    end = last.data_offset + last.n_bytes
    path.write_bytes(path.read_bytes()[: end - 100])
    expect_error(path, "trunc.gguf", f"tensor {last.name} ends at byte {end}, file has {end - 100}")


def test_tensor_offset_past_end(tmp_path):
    path = write_tiny(tmp_path / "offset.gguf")
    reader = gguf.GGUFReader(path)
    field = reader.tensors[0].field
    offset_pos = field.offset + sum(p.nbytes for p in field.parts[:-1])
    blob = bytearray(path.read_bytes())
    blob[offset_pos : offset_pos + 8] = struct.pack("<Q", 10**9)
    path.write_bytes(bytes(blob))
    expect_error(path, "offset.gguf", f"tensor {reader.tensors[0].name} ends at byte")


def test_truncated_header(tmp_path):
    path = write_tiny(tmp_path / "header.gguf")
    path.write_bytes(path.read_bytes()[:200])
    expect_error(path, "header.gguf", "truncated")


def test_unknown_architecture(tmp_path):
    from gufo.models.registry import check_architecture

    mf = open_model_file(write_tiny(tmp_path / "arch.gguf", arch="mamba9"))
    with pytest.raises(BadInputError, match="unknown architecture 'mamba9'"):
        check_architecture(mf)


def test_unsupported_quant_type(tmp_path):
    from gufo.models.registry import check_supported_types

    # I32 has 4-byte elements like F32, so retyping an F32 tensor keeps the file consistent.
    assert (
        gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.I32]
        == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.F32]
    )
    f32 = write_tiny(tmp_path / "i32.gguf")
    reader = gguf.GGUFReader(f32)
    target = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    type_pos = target.field.offset + sum(p.nbytes for p in target.field.parts[:-2])
    blob = bytearray(f32.read_bytes())
    blob[type_pos : type_pos + 4] = struct.pack("<I", gguf.GGMLQuantizationType.I32)
    f32.write_bytes(bytes(blob))
    with pytest.raises(BadInputError, match=r"tensor blk\.0\.attn_q\.weight.*I32"):
        check_supported_types(open_model_file(f32))


def test_missing_required_metadata(tmp_path):
    from gufo.models.registry import build_model

    path = write_tiny(tmp_path / "meta.gguf", drop_key="llama.embedding_length")
    with pytest.raises(BadInputError, match="meta.gguf: required metadata key 'llama.embedding_length'"):
        build_model(open_model_file(path), "torch")


@pytest.mark.parametrize("case", ["empty", "magic", "truncated"])
def test_cli_exit_code_and_single_line(tmp_path, case):
    path = tmp_path / f"{case}.gguf"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "magic":
        path.write_bytes(b"NOPE" * 10)
    else:
        good = write_tiny(tmp_path / "good.gguf")
        path.write_bytes(good.read_bytes()[:-64])
    proc = subprocess.run(
        [sys.executable, "-m", "gufo.cli.main", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gufo: error:") and path.name in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_unknown_architecture_exit_2(tmp_path, capsys):
    from gufo.cli.main import main

    path = write_tiny(tmp_path / "arch.gguf", arch="mamba9")
    assert main(["run", "-m", str(path), "-p", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "arch.gguf: unknown architecture 'mamba9'" in err[0]
