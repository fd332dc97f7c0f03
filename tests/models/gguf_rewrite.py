"""Copy a GGUF with one metadata key or tensor dropped, or with keys and tensors added (the gguf
package reads and writes it), to make the broken or unusual files the loader must refuse by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from gufo.gguf.model_file import ModelFile, open_model_file


def rewrite(
    src: Path,
    dst: Path,
    drop_key: str | None = None,
    drop_tensor: str | None = None,
    keys: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
) -> ModelFile:
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", drop_key):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for name, (value, kind) in (keys or {}).items():
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        if tensor.name != drop_tensor:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return open_model_file(dst)
