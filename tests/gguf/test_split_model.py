"""A real model split 3 ways by the `gguf` package's writer (llama.cpp's gguf-split layout) runs as the whole
file does: the same tensors and metadata from any part, and llama.cpp's greedy token trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from gufo.gguf.model_file import open_model_file
from tests.cli.test_cli import trace_of
from tests.conftest import golden, gufo

ALIAS = "smollm2-135m"
N_TOKENS = 8


@pytest.fixture(scope="module")
def whole(model_path) -> gguf.GGUFReader:
    return gguf.GGUFReader(model_path(ALIAS))


@pytest.fixture(scope="module")
def metadata(whole) -> dict[str, tuple[gguf.GGUFValueType, gguf.GGUFValueType | None, Any]]:
    """Every key of the whole file but the reader's own (GGUF.version, ...), as the gguf package reads it:
    key -> (value type, element type of an array, value)."""
    keys = {}
    for key, field in whole.fields.items():
        if not key.startswith("GGUF."):
            value_type = field.types[0]
            item_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            keys[key] = (value_type, item_type, field.contents())
    return keys


@pytest.fixture(scope="module")
def parts(tmp_path_factory, whole, metadata) -> dict[Path, int]:
    """The whole file's keys and tensors, copied as gguf-py's gguf_new_metadata.py copies them, into a
    writer that splits them into 3 parts (llama.cpp's names: smollm2-0000N-of-00003.gguf): each part's
    path -> the number of tensors the writer put in it."""
    folder = tmp_path_factory.mktemp("split")
    arch = metadata["general.architecture"][2]
    writer = gguf.GGUFWriter(folder / "smollm2.gguf", arch, split_max_tensors=-(-len(whole.tensors) // 3))
    for key, (value_type, item_type, value) in metadata.items():
        if key != "general.architecture":  # the writer adds it
            writer.add_key_value(key, value, value_type, sub_type=item_type)
    for tensor in whole.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    counts = [len(tensors) for tensors in writer.tensors]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in whole.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    names = [f"smollm2-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert sorted(p.name for p in folder.iterdir()) == names
    return {folder / name: count for name, count in zip(names, counts, strict=True)}


def test_every_part_opens_the_whole_files_tensors_and_metadata(parts, whole, metadata):
    counts = list(parts.values())
    assert len(counts) == 3 and min(counts) > 0 and sum(counts) == len(whole.tensors)
    for part in parts:
        mf = open_model_file(part)
        assert [p.n_tensors for p in mf.parts] == counts
        for tensor in whole.tensors:
            mine = mf.tensors[tensor.name].data.reshape(-1)
            assert np.array_equal(mine, tensor.data.reshape(-1).view(np.uint8)), tensor.name
        for key, (_, _, value) in metadata.items():
            assert mf.metadata[key] == value, key
        assert mf.metadata["split.count"] == 3 and mf.metadata["split.tensors.count"] == len(whole.tensors)


def test_split_file_gives_llamacpps_greedy_trace(parts, capsys):
    prompt = next(p for p in golden(ALIAS)["prompts"] if p["id"] == "list")
    margins = prompt["greedy_top1_minus_top2"][:N_TOKENS]
    assert min(margins) >= 0.5  # llama.cpp's greedy path is unambiguous over these tokens
    first = next(iter(parts))
    code, _, err = gufo(
        capsys, "run", "-m", str(first), "-p", prompt["prompt"], "-n", str(N_TOKENS), "--temp", "0",
        "--ignore-eos", "--verbose", "-c", "256",
    )  # fmt: skip
    assert code == 0
    expected = prompt["greedy_ids_ignore_eos"][:N_TOKENS]
    assert f"[TokenTrace]: count={N_TOKENS} sha256={trace_of(expected)}" in err
