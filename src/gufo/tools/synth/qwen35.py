"""The qwen35 (dense Qwen3.5) and qwen35moe (Qwen3.5 MoE) file layouts of `gufo synth`, as llama.cpp's
converter writes them.

Layer i is Gated DeltaNet when (i + 1) % full_attention_interval != 0, else gated full attention whose
`attn_q` rows hold query and gate. Without `mtp`, the converter's `--no-mtp` layout; with it, the
multi-token-prediction block the converter writes from Qwen3.5's `mtp.*` (mtp_num_hidden_layers 1): block
`blk.<layers>` after the trunk, a gated-attention block with the trunk's FFN plus `nextn.eh_proj`,
`nextn.enorm`, `nextn.hnorm` and `nextn.shared_head_norm` (the embedding and output are the trunk's),
counted in block_count, with `nextn_predict_layers` 1.
qwen35moe's FFN is the router `ffn_gate_inp`, the 3-D routed experts (gate, up and down apart, as the
converter writes them without --fuse-gate-up-exps) and the shared expert with its 1-D gate.
"""

from __future__ import annotations

from gufo.gguf.model_file import ModelFile
from gufo.tools.synth.presets import Qwen35MoeShape, Qwen35Shape
from gufo.tools.synth.type_mix import QuantMix
from gufo.tools.synth.writer import SynthPlan, matrix_shape, plan_tensors, transformer_hparams

ARCH = "qwen35"
MOE_ARCH = "qwen35moe"
ATTENTION_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm")
DELTANET_KINDS = (
    "attn_qkv",
    "attn_gate",
    "ssm_beta",
    "ssm_alpha",
    "ssm_conv1d",
    "ssm_dt",
    "ssm_a",
    "ssm_norm",
    "ssm_out",
)
FFN_KINDS = ("post_attention_norm", "ffn_gate", "ffn_up", "ffn_down")
NEXTN_KINDS = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")
MOE_FFN_KINDS = (
    "post_attention_norm",
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_inp_shexp",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
)


def tensor_shape(kind: str, shape: Qwen35Shape, vocab_size: int) -> tuple[int, ...]:
    """PyTorch shape (rows, cols) or (n,) of tensor `kind` in the converter's layout."""
    s, hidden = shape, shape.hidden_size
    key_width = s.linear_num_key_heads * s.linear_key_head_dim
    value_width = s.linear_num_value_heads * s.linear_value_head_dim
    own = {
        "attn_q": (2 * s.num_attention_heads * s.head_dim, hidden),  # query and output gate
        "post_attention_norm": (hidden,),
        "attn_qkv": (2 * key_width + value_width, hidden),
        "attn_gate": (value_width, hidden),
        "ssm_beta": (s.linear_num_value_heads, hidden),
        "ssm_alpha": (s.linear_num_value_heads, hidden),
        "ssm_conv1d": (2 * key_width + value_width, s.linear_conv_kernel_dim),
        "ssm_dt": (s.linear_num_value_heads,),
        "ssm_a": (s.linear_num_value_heads,),
        "ssm_norm": (s.linear_value_head_dim,),
        "ssm_out": (hidden, value_width),
        "nextn.eh_proj": (hidden, 2 * hidden),  # [embedding, hidden state] -> hidden
        **{kind: (hidden,) for kind in NEXTN_KINDS[1:]},
    }
    if isinstance(s, Qwen35MoeShape):
        experts, ff, shared = s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
        own |= {
            "ffn_gate_inp": (experts, hidden),
            "ffn_gate_exps": (experts, ff, hidden),
            "ffn_up_exps": (experts, ff, hidden),
            "ffn_down_exps": (experts, hidden, ff),
            "ffn_gate_inp_shexp": (1, hidden),  # as the converter writes it (llama.cpp reads it as 1-D)
            "ffn_gate_shexp": (shared, hidden),
            "ffn_up_shexp": (shared, hidden),
            "ffn_down_shexp": (hidden, shared),
        }
    return own[kind] if kind in own else matrix_shape(kind, shape, vocab_size)


def plan_qwen35(
    preset: str, shape: Qwen35Shape, mix: QuantMix, vocab: ModelFile, mtp: bool = False
) -> SynthPlan:
    """Every tensor of the file: name, shape and llama-quantize's type for `mix`; `mtp`: with the
    multi-token-prediction block."""
    if isinstance(shape, Qwen35MoeShape):
        return _plan(preset, shape, mix, vocab, MOE_FFN_KINDS, MOE_ARCH, "Qwen3.5-MoE", mtp)
    return _plan(preset, shape, mix, vocab, FFN_KINDS, ARCH, "Qwen3.5", mtp)


def _plan(
    preset: str,
    shape: Qwen35Shape,
    mix: QuantMix,
    vocab: ModelFile,
    ffn_kinds: tuple[str, ...],
    arch: str,
    family: str,
    mtp: bool,
) -> SynthPlan:
    entries = [("token_embd", -1), ("output_norm", -1)]
    if not shape.tie_word_embeddings:
        entries.append(("output", -1))
    for layer in range(shape.num_hidden_layers):
        mixer = DELTANET_KINDS if shape.is_recurrent(layer) else ATTENTION_KINDS
        entries += [(kind, layer) for kind in ("attn_norm", *mixer, *ffn_kinds)]
    # llama-quantize counts the MTP block's layer with the trunk's (n_layer_all) in its per-layer rules
    blocks = shape.with_layers(shape.num_hidden_layers + 1) if mtp else shape
    if mtp:
        entries += [(kind, shape.num_hidden_layers) for kind in ("attn_norm", *ATTENTION_KINDS, *ffn_kinds)]
        entries += [(kind, shape.num_hidden_layers) for kind in NEXTN_KINDS]
    tensors = plan_tensors(entries, lambda kind, n: tensor_shape(kind, shape, n), blocks, mix, vocab)
    s = shape
    hparams = transformer_hparams(blocks) | {
        "ssm.conv_kernel": s.linear_conv_kernel_dim,
        "ssm.state_size": s.linear_key_head_dim,
        "ssm.group_count": s.linear_num_key_heads,
        "ssm.time_step_rank": s.linear_num_value_heads,
        "ssm.inner_size": s.linear_value_head_dim * s.linear_num_value_heads,
        "full_attention_interval": s.full_attention_interval,
        "rope.dimension_count": int(s.head_dim * s.partial_rotary_factor),
        # Text positions rotate every M-RoPE section alike; llama.cpp requires the key (4 entries).
        "rope.dimension_sections": (*s.mrope_section, 0),
    }
    if mtp:
        hparams["nextn_predict_layers"] = 1
    if isinstance(s, Qwen35MoeShape):
        del hparams["feed_forward_length"]  # the config has no intermediate_size: the converter writes none
        hparams |= {
            "expert_count": s.num_experts,
            "expert_used_count": s.num_experts_per_tok,
            "expert_feed_forward_length": s.moe_intermediate_size,
            "expert_shared_feed_forward_length": s.shared_expert_intermediate_size,
        }
    return SynthPlan(preset, shape, mix, vocab, tensors, arch, family, hparams)
