"""Split GGUF files, llama.cpp's gguf-split layout: `NAME-00001-of-00003.gguf`, ...

Every part is a GGUF file of its own with its tensor infos and data and the keys `split.no` (u16, 0-based),
`split.count` (u16) and `split.tensors.count` (i32, the tensors of all parts); the first part holds the
model's metadata. The names follow the `gguf` package's SHARD_NAME_FORMAT, which is llama.cpp's
`llama_split_path` (part numbers from 1, five digits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gguf import SHARD_NAME_FORMAT, Keys

SPLIT_NO = Keys.Split.LLM_KV_SPLIT_NO
SPLIT_COUNT = Keys.Split.LLM_KV_SPLIT_COUNT
SPLIT_TENSORS_COUNT = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT

_PART_NAME = re.compile(r"(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")


def part_name(stem: str, index: int, count: int) -> str:
    """The file name of part `index` (0-based, as `split.no`) of `count`."""
    return SHARD_NAME_FORMAT.format(stem, index + 1, count)


@dataclass(frozen=True)
class PartName:
    """What a part's file name says: its stem, its part number (1-based) and the number of parts."""

    stem: str
    number: int
    count: int


def parse_part_name(name: str) -> PartName | None:
    """`NAME-00002-of-00003.gguf` -> PartName("NAME", 2, 3); None for a name without the suffix."""
    match = _PART_NAME.fullmatch(name)
    if match is None:
        return None
    return PartName(match["stem"], int(match["number"]), int(match["count"]))


def part_paths(path: Path, index: int, count: int) -> list[Path]:
    """All parts' paths, found from the name of `path`, which `split.no` says is part `index` of `count`.
    Raises ValueError saying how the name disagrees with the keys."""
    said = f"its split.no {index} and split.count {count} say part {index + 1} of {count}"
    named = parse_part_name(path.name)
    if named is None:
        expected = part_name("NAME", index, count)
        raise ValueError(f"{said}, but the name does not end in {expected[4:]}, so the parts cannot be found")
    if (named.number, named.count) != (index + 1, count):
        raise ValueError(f"named part {named.number} of {named.count}, but {said}")
    return [path.with_name(part_name(named.stem, i, count)) for i in range(count)]
