"""Write a random-weight GGUF of a real model shape, tensor by tensor, with a real vocabulary.

Only one tensor's bytes are in memory at a time (a 32B Q4_K_M file is ~19 GB), and the file (or the
parts of a split file) is written in a temporary folder beside the target and renamed at the end, so an
interrupted run never leaves a partial file under a final name.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

from gufo.errors import BadInputError, GufoError
from gufo.formats.random_blocks import random_blocks
from gufo.gguf.model_file import ModelFile
from gufo.tools.synth.presets import ModelShape, Qwen3Shape
from gufo.tools.synth.type_mix import QuantMix, tensor_type
from gufo.tools.synth.values import float_values

ARCH = "qwen3"
# Per-block tensors of a qwen3 layer in llama.cpp's naming (blk.N.<kind>.weight).
LAYER_KINDS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    kind: str
    layer: int  # -1 outside the blocks
    shape: tuple[int, ...]  # PyTorch order: (rows, cols) or (n,)
    qtype: GGMLQuantizationType

    @property
    def row_bytes(self) -> int:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.qtype]
        return self.shape[-1] // block_elems * block_bytes

    @property
    def n_bytes(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) * self.row_bytes


@dataclass(frozen=True)
class SynthPlan:
    preset: str
    shape: ModelShape
    mix: QuantMix
    vocab: ModelFile
    tensors: list[PlannedTensor]
    arch: str  # general.architecture
    family: str  # the model family's name, for general.name
    hparams: dict[str, Any]  # "<arch>.<key>" metadata: int -> uint32, float -> float32, tuple -> int array

    @property
    def data_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_parameters(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors)


def matrix_shape(kind: str, shape: ModelShape, vocab_size: int) -> tuple[int, ...]:
    """PyTorch shape of a tensor a qwen3 layer has; qwen35 has most of them too."""
    hidden, q_width = shape.hidden_size, shape.num_attention_heads * shape.head_dim
    kv_width = shape.num_key_value_heads * shape.head_dim
    return {
        "token_embd": (vocab_size, hidden),
        "output": (vocab_size, hidden),
        "output_norm": (hidden,),
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
        "attn_q_norm": (shape.head_dim,),
        "attn_k_norm": (shape.head_dim,),
        "attn_q": (q_width, hidden),
        "attn_k": (kv_width, hidden),
        "attn_v": (kv_width, hidden),
        "attn_output": (hidden, q_width),
        "ffn_gate": (shape.intermediate_size, hidden),
        "ffn_up": (shape.intermediate_size, hidden),
        "ffn_down": (hidden, shape.intermediate_size),
    }[kind]


# Name suffixes other than ".weight" (llama.cpp's names: blk.N.ssm_dt.bias, blk.N.ssm_a).
_SUFFIX = {"ssm_dt": ".bias", "ssm_a": ""}

TensorShape = Callable[[str, int], tuple[int, ...]]  # (kind, vocabulary size) -> PyTorch shape


def plan_tensors(
    entries: Iterable[tuple[str, int]], dims: TensorShape, shape: ModelShape, mix: QuantMix, vocab: ModelFile
) -> list[PlannedTensor]:
    """The (kind, layer) entries as tensors with their names, shapes and llama-quantize's types."""
    tokens = vocab.get("tokenizer.ggml.tokens")
    if not tokens:
        raise BadInputError(f"--vocab-from {vocab.label}: has no vocabulary (tokenizer.ggml.tokens)")
    tensors = []
    for kind, layer in entries:
        name = kind + _SUFFIX.get(kind, ".weight")
        tensors.append(
            PlannedTensor(
                name=name if layer < 0 else f"blk.{layer}.{name}",
                kind=kind,
                layer=layer,
                shape=dims(kind, len(tokens)),
                qtype=tensor_type(mix, kind, layer, shape),
            )
        )
    return tensors


def transformer_hparams(shape: ModelShape) -> dict[str, Any]:
    """The metadata keys every dense Qwen model has."""
    return {
        "block_count": shape.num_hidden_layers,
        "context_length": shape.max_position_embeddings,
        "embedding_length": shape.hidden_size,
        "feed_forward_length": shape.intermediate_size,
        "attention.head_count": shape.num_attention_heads,
        "attention.head_count_kv": shape.num_key_value_heads,
        "attention.key_length": shape.head_dim,
        "attention.value_length": shape.head_dim,
        "rope.freq_base": float(shape.rope_theta),
        "attention.layer_norm_rms_epsilon": float(shape.rms_norm_eps),
    }


def plan_qwen3(preset: str, shape: Qwen3Shape, mix: QuantMix, vocab: ModelFile) -> SynthPlan:
    """Every tensor of the file: name, shape and llama-quantize's type for `mix`."""
    entries = [("token_embd", -1), ("output_norm", -1)]
    if not shape.tie_word_embeddings:
        entries.append(("output", -1))
    entries += [(kind, layer) for layer in range(shape.num_hidden_layers) for kind in LAYER_KINDS]
    tensors = plan_tensors(entries, lambda kind, n: matrix_shape(kind, shape, n), shape, mix, vocab)
    return SynthPlan(preset, shape, mix, vocab, tensors, ARCH, "Qwen3", transformer_hparams(shape))


def _tensor_bytes(tensor: PlannedTensor, rng: np.random.Generator) -> np.ndarray:
    values = float_values(tensor.kind, tensor.shape, rng)
    if values is not None:
        assert tensor.qtype == GGMLQuantizationType.F32, tensor.name  # the type mix keeps these float
        return values.view(np.uint8)
    block_elems, _ = GGML_QUANT_SIZES[tensor.qtype]
    n_blocks = int(np.prod(tensor.shape)) // block_elems
    return random_blocks(tensor.qtype, n_blocks, rng).reshape(*tensor.shape[:-1], tensor.row_bytes)


def _add_metadata(writer: GGUFWriter, plan: SynthPlan) -> None:
    vocab = plan.vocab
    writer.add_name(f"{plan.family} {plan.preset.upper()} shape, synthetic random weights, {plan.mix.name}")
    writer.add_description(
        "Random weights of a real model shape written by `gufo synth` for benchmarking; "
        f"vocabulary copied from {vocab.label}. It generates noise, not text."
    )
    writer.add_file_type(plan.mix.file_type)
    writer.add_quantization_version(GGML_QUANT_VERSION)
    for key, value in plan.hparams.items():
        full_key = f"{plan.arch}.{key}"
        if isinstance(value, float):
            writer.add_float32(full_key, value)
        elif isinstance(value, int):
            writer.add_uint32(full_key, value)
        else:
            writer.add_array(full_key, list(value))
    for key, value in vocab.metadata.items():
        if key.startswith("tokenizer."):
            writer.add_key_value(key, value, vocab.value_types[key], vocab.item_types.get(key))


def _temp_dir(out: Path) -> Path:
    """Check where `out` goes and create a temporary folder beside it, where the file or parts are written."""
    if out.is_dir():
        raise BadInputError(f"-o {out}: is a directory, expected a file name")
    if not out.parent.is_dir():
        raise BadInputError(f"-o {out}: folder {out.parent} does not exist")
    temp = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}.partial"
    try:
        temp.mkdir()
    except OSError as err:
        raise BadInputError(f"-o {out}: cannot write in {out.parent}: {err.strerror}") from None
    return temp


def write_synth(
    plan: SynthPlan,
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    seed: int = 0,
    progress: Callable[[int], object] | None = None,
    split_max_size: int = 0,
) -> list[Path]:
    """Write the file of `plan` to `out`; the paths written. With `split_max_size` (bytes of tensor data a
    part; a larger tensor gets a part of its own) the parts are `OUT-00001-of-0000N.gguf`, ... beside
    `out`, split by gguf-py's writer as `convert_hf_to_gguf.py --split-max-size` splits: llama.cpp's
    gguf-split names and keys, the metadata in the first part (one plain `out` when it all fits in one).
    `progress(n_bytes)` is called after each tensor."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(None, plan.arch, split_max_size=split_max_size)
    _add_metadata(writer, plan)
    for tensor in plan.tensors:
        writer.add_tensor_info(
            tensor.name,
            (*tensor.shape[:-1], tensor.row_bytes),
            np.dtype(np.uint8),
            tensor.n_bytes,
            tensor.qtype,
        )
    targets = writer.format_shard_names(out)
    for target in targets:
        if target.exists() and not target.is_dir() and not force:
            raise BadInputError(f"-o {out}: {target.name} already exists (use --force to overwrite it)")
    temp = _temp_dir(out)
    try:
        writer.write_header_to_file(temp / out.name)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in plan.tensors:
            writer.write_tensor_data(_tensor_bytes(tensor, rng))
            if progress is not None:
                progress(tensor.n_bytes)
        writer.close()  # flushed before the renames; the close in `finally` is for failures
        for written, target in zip(writer.format_shard_names(temp / out.name), targets, strict=True):
            os.replace(written, target)
    except OSError as err:
        raise GufoError(f"-o {out}: writing failed: {err.strerror or err}") from None
    finally:
        writer.close()
        shutil.rmtree(temp, ignore_errors=True)
    return targets
