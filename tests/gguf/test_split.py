"""Split GGUF files (llama.cpp's gguf-split layout), written by the `gguf` package's writer: any part opens
all of them with the whole file's tensors and metadata; a bad part is one line naming it, exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from gufo.gguf.model_file import open_model_file
from tests.conftest import gufo
from tests.gguf.test_model_file import write_tiny

N_TENSORS = 11  # write_tiny's tensors
PARTS = [f"tiny-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]  # llama.cpp's llama_split_path, by hand


@pytest.fixture
def split(tmp_path) -> Path:
    """tiny-0000N-of-00003.gguf: 4, 4 and 3 tensors; the folder holding them."""
    write_tiny(tmp_path / "tiny.gguf", split_max_tensors=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == PARTS
    return tmp_path


def test_any_part_opens_the_whole_file(split, tmp_path):
    (tmp_path / "whole").mkdir()
    whole = gguf.GGUFReader(write_tiny(tmp_path / "whole" / "tiny.gguf"))
    readers = [gguf.GGUFReader(split / name) for name in PARTS]
    assert [int(r.fields["split.no"].contents()) for r in readers] == [0, 1, 2]
    for name in PARTS:
        mf = open_model_file(split / name)
        assert mf.path.name == PARTS[0]
        assert [(p.path.name, p.size, p.n_tensors) for p in mf.parts] == [
            (n, (split / n).stat().st_size, len(r.tensors)) for n, r in zip(PARTS, readers, strict=True)
        ]
        assert sorted(mf.tensors) == sorted(t.name for t in whole.tensors)
        for t in whole.tensors:
            mine = mf.tensors[t.name]
            assert mine.shape == tuple(reversed(t.shape.tolist()))
            assert np.array_equal(mine.data.reshape(-1), t.data.reshape(-1).view(np.uint8))
        assert mf.metadata["llama.block_count"] == whole.fields["llama.block_count"].contents()
        assert mf.metadata["split.tensors.count"] == N_TENSORS


def test_a_first_part_of_metadata_only(tmp_path):
    """llama.cpp's `gguf-split --no-tensor-first-split`: the first part holds no tensors."""
    write_tiny(tmp_path / "tiny.gguf", split_max_tensors=4, small_first_shard=True)
    names = [f"tiny-{i:05d}-of-00004.gguf" for i in (1, 2, 3, 4)]
    counts = [len(gguf.GGUFReader(tmp_path / name).tensors) for name in names]
    assert counts[0] == 0 and sum(counts) == N_TENSORS
    mf = open_model_file(tmp_path / names[-1])
    assert [p.n_tensors for p in mf.parts] == counts and len(mf.tensors) == N_TENSORS
    assert mf.path.name == names[0] and mf.metadata["llama.block_count"] == 1


def test_info_lists_the_parts(split, capsys):
    code, out, _ = gufo(capsys, "info", "--json", str(split / PARTS[1]))
    assert code == 0
    info = json.loads(out)
    sizes = [(split / name).stat().st_size for name in PARTS]
    counts = [len(gguf.GGUFReader(split / name).tensors) for name in PARTS]
    assert info["parts"] == [
        {"file": name, "size_bytes": size, "tensor_count": count}
        for name, size, count in zip(PARTS, sizes, counts, strict=True)
    ]
    assert (info["file"], info["file_size_bytes"], info["tensor_count"]) == (PARTS[0], sum(sizes), N_TENSORS)
    code, out, _ = gufo(capsys, "info", str(split / PARTS[2]))
    assert code == 0
    assert f"  {PARTS[1]}  {sizes[1]:,} " in out and f", {counts[1]} tensors" in out


def expect_bad_part(capsys, path: Path, expected: str) -> None:
    code, out, err = gufo(capsys, "info", str(path))
    assert code == 2 and out == ""
    assert err.splitlines() == [f"gufo: error: {expected}"]


def test_missing_part(split, capsys):
    (split / PARTS[1]).unlink()
    expect_bad_part(capsys, split / PARTS[2], f"{PARTS[1]}: missing, part 2 of 3 of the split {PARTS[2]}")


@pytest.fixture
def others(tmp_path) -> Path:
    """Parts of other files, in a folder: the same model split into 4 parts (3, 3, 3, 2 tensors:
    other-0000N-of-00004.gguf) and into 3 differently (5, 5, 1: other-0000N-of-00003.gguf), and a model of
    3 tensors split into 3 (three-0000N-of-00003.gguf)."""
    folder = tmp_path / "others"
    folder.mkdir()
    write_tiny(folder / "other.gguf", split_max_tensors=3)
    write_tiny(folder / "other.gguf", split_max_tensors=5)
    writer = gguf.GGUFWriter(folder / "three.gguf", "llama", split_max_tensors=1)
    for i in range(3):
        writer.add_tensor(f"t{i}", np.zeros(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder


@pytest.mark.parametrize(
    "source,replaced,expected",
    [
        (
            "other-00002-of-00004.gguf",
            1,
            f"{PARTS[1]}: split.count is 4, but its name and {PARTS[0]} say 3 (parts of different files?)",
        ),
        (
            "other-00003-of-00003.gguf",
            2,
            f"{PARTS[0]}: split.tensors.count is 11, but the 3 parts hold 9 tensors (4, 4, 1; parts of "
            "different files?)",
        ),
        (  # write_tiny's 5th tensor ends the 5-tensor part 1 and starts the 4-tensor part 2
            "other-00001-of-00003.gguf",
            0,
            f"{PARTS[1]}: tensor blk.0.attn_q.weight is also in {PARTS[0]} (parts of different files?)",
        ),
        (
            "three-00003-of-00003.gguf",
            2,
            f"{PARTS[2]}: split.tensors.count is 3, but {PARTS[0]} says 11 (parts of different files?)",
        ),
    ],
)
def test_part_of_another_file(split, others, capsys, source, replaced, expected):
    shutil.copy(others / source, split / PARTS[replaced])
    expect_bad_part(capsys, split / PARTS[0], expected)


def test_truncated_part(split, capsys):
    part = split / PARTS[1]
    reader = gguf.GGUFReader(part)
    last = max(reader.tensors, key=lambda t: t.data_offset)
    end = last.data_offset + last.n_bytes
    part.write_bytes(part.read_bytes()[: end - 4])
    expect_bad_part(
        capsys, split / PARTS[0], f"{PARTS[1]}: tensor {last.name} ends at byte {end}, file has {end - 4}"
    )


def test_part_not_named_as_a_part(split, capsys):
    (split / PARTS[0]).rename(split / "tiny.gguf")
    expect_bad_part(
        capsys,
        split / "tiny.gguf",
        "tiny.gguf: its split.no 0 and split.count 3 say part 1 of 3, but the name does not end in "
        "-00001-of-00003.gguf, so the parts cannot be found",
    )
