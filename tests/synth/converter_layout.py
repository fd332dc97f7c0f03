"""The converter's names and shapes of a transformers Qwen3.5 / Qwen3.5-MoE model, for the synth tests:
gguf-py's tensor lists and name maps with convert_hf_to_gguf.py's changes."""

from __future__ import annotations

import gguf
import torch


def converter_names(arch: gguf.MODEL_ARCH, n_layers: int) -> set[str]:
    """Every tensor name gguf-py declares for `arch`, in each block."""
    formats = [gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]]
    names = {f.format(bid=i) for f in formats for i in range(n_layers)}
    return {n + suffix for n in names for suffix in (".weight", ".bias", "")}


def kind_and_layer(name: str) -> tuple[str, int]:
    parts = name.split(".")
    return (parts[2], int(parts[1])) if parts[0] == "blk" else (parts[0], -1)


def gguf_dims(model: torch.nn.Module, arch: gguf.MODEL_ARCH, n_layers: int) -> dict[str, tuple[int, ...]]:
    """GGUF name -> dims (ne0 first) of `model`'s parameters (a tied lm_head is not listed again) named
    by gguf-py's map for `arch`, with the converter's changes: dt_bias -> ssm_dt.bias, conv1d squeezed,
    each expert's fused gate_up_proj split into ffn_gate_exps and ffn_up_exps."""
    names = gguf.get_tensor_name_map(arch, n_layers)
    dims = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        if name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        if "conv1d" in name:
            shape = (shape[0], shape[-1])  # [channels, 1, kernel] squeezed
        if name.endswith("experts.gate_up_proj"):
            block = f"blk.{name.split('.')[2]}"
            half = (shape[0], shape[1] // 2, shape[2])
            dims |= {f"{block}.ffn_{part}_exps.weight": tuple(reversed(half)) for part in ("gate", "up")}
            continue
        if name.endswith("experts.down_proj"):
            name += ".weight"  # as the converter names it
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        dims[gguf_name] = tuple(reversed(shape))
    return dims
