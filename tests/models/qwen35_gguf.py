"""A tiny random transformers Qwen3.5 (qwen35), Qwen3-Next (qwen3next) or Qwen3.5-MoE (qwen35moe) written to
GGUF with llama.cpp's converter layout.

The weight transforms follow convert_hf_to_gguf.py (Qwen3NextModel, _LinearAttentionVReorderBase,
Qwen3_5TextModel): A_log -> -exp(A_log), dt_bias -> ssm_dt.bias, conv1d squeezed to [channels, kernel],
+1 on every RMSNorm weight except the gated norm. qwen35 value heads are reordered from grouped-by-key-
head to tiled; qwen3next keeps them grouped, splits in_proj_qkvz per key head into attn_qkv + attn_gate,
and writes the experts as 3-D [n_expert, rows, cols] gate/up/down tensors; qwen35moe has qwen35's mixers
and those experts. Tensor names come from the gguf package's own name map.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import torch

VOCAB = 128
CONTEXT = 512


ARCHITECTURES = {
    "qwen35": "Qwen3_5ForCausalLM",
    "qwen3next": "Qwen3NextForCausalLM",
    "qwen35moe": "Qwen3_5MoeForCausalLM",
}
EXPERTS = dict(  # the mixture-of-experts hybrids' experts: 2 of 8 routed, one shared
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
)


def tiny_config(interval: int = 4, layers: int = 4, arch: str = "qwen35", vocab: int = VOCAB):
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-6,
        full_attention_interval=interval,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False,
    )
    if arch == "qwen3next":
        return transformers.Qwen3NextConfig(**common, **EXPERTS, norm_topk_prob=True)
    if arch == "qwen35moe":
        return transformers.Qwen3_5MoeTextConfig(**common, **EXPERTS)
    return transformers.Qwen3_5TextConfig(**common)


def gguf_arch(model) -> str:
    return next(arch for arch, name in ARCHITECTURES.items() if type(model).__name__ == name)


def tiny_hf_model(
    interval: int = 4, layers: int = 4, seed: int = 0, arch: str = "qwen35", vocab: int = VOCAB
):
    """Random float32 model of `arch`; weights scaled so that every block matters to the logits."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, ARCHITECTURES[arch])(tiny_config(interval, layers, arch, vocab)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # plain weight
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif "norm" in name:  # zero-centred: the model uses 1 + w
                param.copy_(0.2 * torch.randn_like(param))
            elif name.endswith("A_log"):
                param.copy_(torch.empty_like(param).uniform_(0.5, 8.0).log())
            elif name.endswith("dt_bias"):
                param.copy_(0.5 * torch.randn_like(param))
            elif "conv1d" in name:
                param.copy_(0.4 * torch.randn_like(param))
            elif name.endswith("mlp.gate.weight"):  # router: decisive top-k choices
                param.copy_(torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) * (0.6 if "embed" in name else 0.15))
    return model


def _tiled(t: torch.Tensor, dim: int, key_heads: int, per_key: int, head_dim: int) -> torch.Tensor:
    """Value heads along `dim` from grouped by key head [k0v0, k0v1, k1v0, ...] to tiled [k0v0, k1v0, ...]."""
    shape = list(t.shape)
    dim %= len(shape)
    t = t.reshape(*shape[:dim], key_heads, per_key, head_dim, *shape[dim + 1 :])
    return t.transpose(dim, dim + 1).reshape(shape)


def _split_next(name: str, t: torch.Tensor, cfg) -> dict[str, torch.Tensor] | None:
    """Tensors the converter splits: qwen3next's fused qkvz per key head, the 3-D fused expert gate/up."""
    if name.endswith("in_proj_qkvz.weight"):
        kh, kd = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        per_key_v = cfg.linear_num_value_heads // kh * cfg.linear_value_head_dim
        q, k, v, z = t.reshape(kh, -1, t.shape[-1]).split([kd, kd, per_key_v, per_key_v], dim=1)
        flat = [p.reshape(-1, t.shape[-1]) for p in (q, k, v, z)]
        return {"attn_qkv": torch.cat(flat[:3]), "attn_gate": flat[3]}
    if name.endswith("experts.gate_up_proj"):
        gate, up = t.chunk(2, dim=1)
        return {"ffn_gate_exps": gate, "ffn_up_exps": up}
    if name.endswith("experts.down_proj"):
        return {"ffn_down_exps": t}
    return None


def converted_tensors(model) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, as the converter writes them."""
    cfg, arch = model.config, gguf_arch(model)
    next_ = arch == "qwen3next"
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    kh, vh = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    kd, vd, per_key = cfg.linear_key_head_dim, cfg.linear_value_head_dim, vh // kh
    out = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach().float().clone()
        if arch != "qwen35" and (split := _split_next(name, t, cfg)) is not None:
            block = f"blk.{name.split('.')[2]}"
            out.update({f"{block}.{n}.weight": part.numpy() for n, part in split.items()})
            continue
        if "linear_attn." in name and kh != vh and not next_:
            if ".in_proj_qkv." in name:
                t = torch.cat([t[: 2 * kh * kd], _tiled(t[2 * kh * kd :], 0, kh, per_key, vd)])
            elif ".in_proj_z." in name:
                t = _tiled(t, 0, kh, per_key, vd)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                t = _tiled(t, 0, kh, per_key, 1)
            elif name.endswith((".A_log", ".dt_bias")):
                t = _tiled(t[:, None], 0, kh, per_key, 1)[:, 0]
            elif ".conv1d" in name:
                t = t.squeeze()
                t = torch.cat([t[: 2 * kh * kd], _tiled(t[2 * kh * kd :], 0, kh, per_key, vd)])
            elif ".out_proj." in name:
                t = _tiled(t, 1, kh, per_key, vd)
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        out[gguf_name] = t.numpy()
    return out


def write_gguf(
    model, path: Path, matrix_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
) -> Path:
    """Write `model` as a qwen35 / qwen3next / qwen35moe GGUF with a toy SentencePiece-style vocabulary.
    With F16 matrices the model's matrices are first rounded to float16 in place, so both sides run the
    same weights; Q8_0 matrices (the gguf package's quantizer) run on the CPU's int8 kernel."""
    cfg = model.config
    if matrix_type == gguf.GGMLQuantizationType.F16:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.dim() >= 2 and "conv1d" not in name:
                    param.copy_(param.half().float())
    arch = gguf_arch(model)
    writer = gguf.GGUFWriter(str(path), arch)
    experts = {}
    if arch != "qwen35":
        experts = {
            "expert_count": cfg.num_experts,
            "expert_used_count": cfg.num_experts_per_tok,
            "expert_feed_forward_length": cfg.moe_intermediate_size,
            "expert_shared_feed_forward_length": cfg.shared_expert_intermediate_size,
        }
    for key, value in {
        "block_count": cfg.num_hidden_layers,
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.head_dim,
        "ssm.conv_kernel": cfg.linear_conv_kernel_dim,
        "ssm.state_size": cfg.linear_key_head_dim,
        "ssm.group_count": cfg.linear_num_key_heads,
        "ssm.time_step_rank": cfg.linear_num_value_heads,
        "ssm.inner_size": cfg.linear_value_head_dim * cfg.linear_num_value_heads,
        "full_attention_interval": cfg.layer_types.index("full_attention") + 1,
        "rope.dimension_count": int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]),
        "vocab_size": cfg.vocab_size,
        **experts,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    if arch != "qwen3next":
        writer.add_rope_dimension_sections([2, 1, 1, 0])
    writer.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>", *[f"t{i}" for i in range(cfg.vocab_size - 3)]]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * cfg.vocab_size)
    writer.add_token_types([2, 3, 3, *[1] * (cfg.vocab_size - 3)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    for name, data in converted_tensors(model).items():
        if data.ndim < 2 or "ssm_conv1d" in name:  # the converter keeps the conv kernel float32
            writer.add_tensor(name, data)
        elif matrix_type == gguf.GGMLQuantizationType.Q8_0:
            writer.add_tensor(name, gguf.quants.quantize(data, matrix_type), raw_dtype=matrix_type)
        else:
            writer.add_tensor(
                name, data.astype(np.float16 if matrix_type == gguf.GGMLQuantizationType.F16 else np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class MultiTokenPrediction(torch.nn.Module):
    """The multi-token-prediction block as Qwen3.5 checkpoints hold it (`mtp.*`, which transformers does
    not load): fc over [pre_fc_norm_embedding(embedding), pre_fc_norm_hidden(hidden)], one full-attention
    decoder layer of the model's own class, norm; the model's lm_head gives its logits."""

    def __init__(self, model):
        super().__init__()
        modeling = sys.modules[type(model).__module__]
        family = type(model).__name__.removesuffix("ForCausalLM")  # Qwen3_5, Qwen3_5Moe, Qwen3Next
        norm, layer = getattr(modeling, f"{family}RMSNorm"), getattr(modeling, f"{family}DecoderLayer")
        cfg = model.config
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.norm = (norm(hidden, eps) for _ in range(3))
        self.layers = torch.nn.ModuleList([layer(cfg, cfg.layer_types.index("full_attention"))])


def with_mtp(model, seed: int = 7):
    """`model` with a random multi-token-prediction block (`model.mtp`, saved as `mtp.*`), scaled as
    tiny_hf_model scales the trunk; config.json then needs mtp_num_hidden_layers = 1."""
    model.mtp = MultiTokenPrediction(model).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.mtp.named_parameters():
            if "norm" in name:
                param.copy_(0.2 * torch.randn_like(param))
            elif name.endswith("mlp.gate.weight"):
                param.copy_(torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return model


def mtp_forward(model, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's logits [T, vocab] and output-normed hidden states [T, hidden] at positions 0..T - 1,
    token i read with hidden[i] (the output-normed hidden state of position i - 1): fc, the decoder layer
    under a causal mask, norm, lm_head."""
    mtp, n = model.mtp, tokens.shape[0]
    with torch.no_grad():
        embedded = model.model.embed_tokens(tokens[None])
        x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(embedded), mtp.pre_fc_norm_hidden(hidden[None])], -1))
        rotary = model.model.rotary_emb(x, torch.arange(n)[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        x = mtp.layers[0](x, position_embeddings=rotary, attention_mask=mask)
        normed = mtp.norm(x)[0]
        return model.lm_head(normed).float(), normed.float()


def trunk_hidden(model, tokens: torch.Tensor) -> torch.Tensor:
    """The trunk's output-normed hidden states [T, hidden] (transformers' last_hidden_state)."""
    with torch.no_grad():
        return model.model(tokens[None]).last_hidden_state[0].float()
