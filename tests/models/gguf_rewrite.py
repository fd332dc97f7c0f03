"""Copy a GGUF with one metadata key or tensor dropped, or with keys and tensors added, to make the
broken or unusual files the loader must refuse by name. gufo's header parser reads it (the gguf
package's reader takes 5 CPU s over a GPT-2 vocabulary's 50k tokens and merges), the gguf package
writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from gufo.gguf.header import parse_header
from gufo.gguf.model_file import ModelFile, open_model_file


def rewrite(
    src: Path,
    dst: Path,
    drop_key: str | None = None,
    drop_tensor: str | None = None,
    keys: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
) -> ModelFile:
    header = parse_header(Path(src).read_bytes())
    writer = gguf.GGUFWriter(str(dst), header.metadata["general.architecture"])
    for name, value in header.metadata.items():
        if name not in ("general.architecture", drop_key):
            writer.add_key_value(name, value, header.value_types[name], sub_type=header.item_types.get(name))
    for name, (value, kind) in (keys or {}).items():
        writer.add_key_value(name, value, kind)
    for tensor in open_model_file(src).tensors.values():
        if tensor.name != drop_tensor:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.qtype)
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return open_model_file(dst)
