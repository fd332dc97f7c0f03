"""`gufo synth --split-max-size`: the parts, read back by the `gguf` package, have llama.cpp's gguf-split
names and keys, at most the size each, and together the tensors of the unsplit file of the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType

from gufo.cli.main import main
from gufo.gguf.model_file import open_model_file
from tests.conftest import gufo

MAX_BYTES = 3_000_000  # --split-max-size 3M: llama.cpp's M is 1000^2 bytes
SYNTH = ["synth", "--preset", "0.6b", "--qtype", "Q4_K_M", "--layers", "1", "--seed", "5"]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory) -> Path:
    """A GGUF with only a 256-token vocabulary: the synth files stay small and quick to read back."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(256)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, small_vocab) -> tuple[gguf.GGUFReader, list[Path]]:
    """The unsplit file, read, and the paths of the split one's parts, both from the same seed."""
    folder = tmp_path_factory.mktemp("synth")
    whole = folder / "whole" / "q.gguf"
    whole.parent.mkdir()
    out = folder / "split" / "q.gguf"
    out.parent.mkdir()
    assert main([*SYNTH, "--vocab-from", str(small_vocab), "-o", str(whole)]) == 0
    assert main([*SYNTH, "--vocab-from", str(small_vocab), "-o", str(out), "--split-max-size", "3M"]) == 0
    return gguf.GGUFReader(whole), sorted(out.parent.iterdir())


def test_parts_have_llamacpps_names_keys_and_sizes(files):
    whole, parts = files
    count = len(parts)
    assert count >= 3
    assert [p.name for p in parts] == [f"q-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    readers = [gguf.GGUFReader(p) for p in parts]
    whole_keys = {key for key in whole.fields if not key.startswith("GGUF.")}
    for index, reader in enumerate(readers):
        split_keys = {
            key: (reader.fields[key].types, reader.fields[key].contents())
            for key in ("split.no", "split.count", "split.tensors.count")
        }
        assert split_keys == {
            "split.no": ([GGUFValueType.UINT16], index),
            "split.count": ([GGUFValueType.UINT16], count),
            "split.tensors.count": ([GGUFValueType.INT32], len(whole.tensors)),
        }
        model_keys = {key for key in reader.fields if not key.startswith(("GGUF.", "split."))}
        assert model_keys == (whole_keys if index == 0 else set())  # the metadata in the first part only
        sizes = [int(t.n_bytes) for t in reader.tensors]
        assert sizes and (sum(sizes) <= MAX_BYTES or len(sizes) == 1)
        if index + 1 < count:  # a part ends only where the next tensor would pass the size
            assert sum(sizes) + int(readers[index + 1].tensors[0].n_bytes) > MAX_BYTES
    split_tensors = [t for reader in readers for t in reader.tensors]
    assert [(t.name, t.tensor_type, t.shape.tolist()) for t in split_tensors] == [
        (t.name, t.tensor_type, t.shape.tolist()) for t in whole.tensors
    ]
    for mine, theirs in zip(split_tensors, whole.tensors, strict=True):
        assert np.array_equal(mine.data, theirs.data), mine.name


def test_gufo_opens_the_parts(files, capsys):
    whole, parts = files
    mf = open_model_file(parts[-1])
    assert [p.path for p in mf.parts] == parts and len(mf.tensors) == len(whole.tensors)
    code, out, _ = gufo(capsys, "info", "--json", str(parts[1]))
    assert code == 0 and [p["file"] for p in json.loads(out)["parts"]] == [p.name for p in parts]


def test_an_existing_part_needs_force(files, small_vocab, capsys):
    _, parts = files
    before = [p.stat().st_mtime_ns for p in parts]
    out = parts[0].with_name("q.gguf")
    code, _, err = gufo(
        capsys, *SYNTH, "--vocab-from", str(small_vocab), "-o", str(out), "--split-max-size", "3M"
    )
    assert code == 2
    assert err.splitlines() == [
        f"gufo: error: -o {out}: {parts[0].name} already exists (use --force to overwrite it)"
    ]
    assert sorted(out.parent.iterdir()) == parts and [p.stat().st_mtime_ns for p in parts] == before


@pytest.mark.parametrize("size", ["0M", "500", "2T", "1.5G", "M"])
def test_bad_size_is_a_usage_error(tmp_path, capsys, size):
    with pytest.raises(SystemExit) as exit_info:
        gufo(capsys, *SYNTH, "-o", str(tmp_path / "x.gguf"), "--split-max-size", size)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"--split-max-size: expected a size like 500M or 2G (units K, M, G), got {size!r}" in err
    assert list(tmp_path.iterdir()) == []
