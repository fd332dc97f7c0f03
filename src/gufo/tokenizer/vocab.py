"""GGUF tokenizer metadata -> the vocabulary facts llama.cpp derives from it.

Token attributes, special ids and their defaults, the BOS/EOS/space-prefix flags and the
end-of-generation set follow llama.cpp's ``llama_vocab::load`` rules, so that gufo tokenizes,
detokenizes and stops where llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gufo.errors import BadInputError
from gufo.tokenizer import pretok

# tokenizer.ggml.token_type values
TYPE_UNDEFINED = 0
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_USER_DEFINED = 4
TYPE_UNUSED = 5
TYPE_BYTE = 6

# attribute bits (llama_token_attr)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# token type -> attribute, indexed by type (types outside 0..6 are undefined)
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int64,
)

KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_TYPES = "tokenizer.ggml.token_type"
KEY_SCORES = "tokenizer.ggml.scores"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# texts that llama.cpp recognises as special roles when the metadata does not name them
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = (
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
)
_FIM_SUF_TEXTS = (
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
)
_FIM_MID_TEXTS = (
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    )
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# metadata key suffix -> role name (llama.cpp's LLM_KV_TOKENIZER_*_ID), in llama.cpp's order
_SPECIAL_KEYS = (
    ("bos_token_id", "bos"),
    ("eos_token_id", "eos"),
    ("eot_token_id", "eot"),
    ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"),
    ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"),
    ("mask_token_id", "mask"),
    ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"),
    ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)

MODELS = ("gpt2", "llama")


@dataclass
class Vocab:
    """Everything about a GGUF vocabulary that tokenization needs (token ids are list indices)."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    pre: pretok.PreTokenizer | None  # BPE only
    tokens: list[str]
    attrs: list[int]
    scores: Sequence[float] | None
    merges: Sequence[str] | None
    token_to_id: dict[str, int]
    special: dict[str, int | None]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    eog_ids: frozenset[int]
    chat_template: str | None
    architecture: str | None
    special_cache: list[int] = field(default_factory=list)  # partitioned tokens, longest text first

    @property
    def size(self) -> int:
        return len(self.tokens)


def _get(meta: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    return default if value is None else value


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else list(value)


def _find_text(token_to_id: dict[str, int], texts: Sequence[str]) -> int | None:
    """The id of the first of ``texts`` present in the vocabulary (llama.cpp walks a hash map,
    so when several are present any of them may win; this takes them in the listed order)."""
    for text in texts:
        tid = token_to_id.get(text)
        if tid is not None:
            return tid
    return None


def load_vocab(meta: Mapping[str, Any]) -> Vocab:
    """Read and check the tokenizer part of GGUF metadata; errors name the offending key."""
    model = _get(meta, KEY_MODEL)
    if model is None:
        raise BadInputError(f"tokenizer metadata: missing key {KEY_MODEL}")
    model = str(model)
    if model not in MODELS:
        raise BadInputError(
            f"tokenizer metadata: unknown tokenizer model '{model}' ({KEY_MODEL}); "
            f"supported: {', '.join(MODELS)}"
        )
    pre_name = str(_get(meta, KEY_PRE, ""))

    tokens_raw = _get(meta, KEY_TOKENS)
    if tokens_raw is None or len(tokens_raw) == 0:
        raise BadInputError(f"tokenizer metadata: missing or empty key {KEY_TOKENS}")
    tokens = _as_list(tokens_raw)
    if "" in tokens:
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)

    types = _get(meta, KEY_TYPES)
    if types is not None:
        type_arr = np.asarray(types, dtype=np.int64)
        if type_arr.ndim != 1 or len(type_arr) < n:
            raise BadInputError(
                f"tokenizer metadata: {KEY_TYPES} has {len(type_arr)} entries, vocabulary has {n}"
            )
        type_arr = type_arr[:n]
        known = (type_arr >= 0) & (type_arr < len(_TYPE_TO_ATTR))
        attr_arr = np.where(known, _TYPE_TO_ATTR[np.where(known, type_arr, 0)], ATTR_UNDEFINED)
    else:
        attr_arr = np.full(n, ATTR_NORMAL, dtype=np.int64)
    attrs: list[int] = attr_arr.tolist()

    scores = _get(meta, KEY_SCORES)
    if scores is not None and len(scores) < n:
        raise BadInputError(f"tokenizer metadata: {KEY_SCORES} has {len(scores)} entries, vocabulary has {n}")

    token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(token_to_id) != n:
        raise BadInputError(f"tokenizer metadata: {KEY_TOKENS} holds the same token text more than once")

    special: dict[str, int | None] = dict.fromkeys(
        ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask")
        + ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
    )
    merges = None
    pre = None
    if model == "llama":
        special.update(bos=1, eos=2, unk=0)
        add_bos, add_eos, add_space_prefix, clean_spaces = True, False, True, False
        if scores is None:
            raise BadInputError(f"tokenizer metadata: SentencePiece vocabulary without {KEY_SCORES}")
    else:
        merges = _get(meta, KEY_MERGES)
        if merges is None:
            raise BadInputError(f"tokenizer metadata: BPE vocabulary without {KEY_MERGES}")
        pre = pretok.lookup(pre_name)
        if pre is None:
            raise BadInputError(
                f"tokenizer metadata: unknown pre-tokenizer '{pre_name}' ({KEY_PRE}); "
                f"supported: {', '.join(pretok.SUPPORTED)}"
            )
        special.update(bos=None if pre.no_bos else 11, eos=11)
        add_bos, add_eos, add_space_prefix, clean_spaces = pre.add_bos, False, False, pre.clean_spaces

    add_space_prefix = bool(_get(meta, "tokenizer.ggml.add_space_prefix", add_space_prefix))

    for role, tid in list(special.items()):
        if tid is not None and tid >= n:
            special[role] = None
    for suffix, role in _SPECIAL_KEYS:
        value = _get(meta, "tokenizer.ggml." + suffix)
        if value is not None and 0 <= int(value) < n:
            special[role] = int(value)

    add_bos = bool(_get(meta, "tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(_get(meta, "tokenizer.ggml.add_eos_token", add_eos))

    # roles recognised by their text when the metadata does not name them; such tokens become control
    def detect(role: str, texts: Sequence[str]) -> None:
        if special[role] is None:
            tid = _find_text(token_to_id, texts)
            if tid is not None:
                special[role] = tid
                attrs[tid] |= ATTR_CONTROL

    detect("eot", _EOT_TEXTS)
    detect("eom", _EOM_TEXTS)
    detect("fim_pre", _FIM_PRE_TEXTS)
    detect("fim_suf", _FIM_SUF_TEXTS)
    detect("fim_mid", _FIM_MID_TEXTS)
    detect("fim_pad", _FIM_PAD_TEXTS)
    detect("fim_rep", _FIM_REP_TEXTS)
    detect("fim_sep", _FIM_SEP_TEXTS)

    # control tokens named "unused" are unused
    for tid in np.flatnonzero(np.asarray(attrs, dtype=np.int64) & ATTR_CONTROL).tolist():
        if "unused" in tokens[tid]:
            attrs[tid] |= ATTR_UNUSED

    eog = {special[r] for r in ("fim_pad", "fim_rep", "fim_sep") if special[r] is not None}
    for text in _EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = ATTR_USER_DEFINED
    eog.update(special[r] for r in ("eos", "eot", "eom") if special[r] is not None)
    eog_texts = {tokens[t]: t for t in eog}
    if "<|end|>" in eog_texts and (
        ("<|return|>" in eog_texts and "<|call|>" in eog_texts)
        or ("<|calls|>" in eog_texts and "<|flush|>" in eog_texts)
    ):
        end_id = eog_texts["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = ATTR_USER_DEFINED
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        s_id = eog_texts["</s>"]
        eog.discard(s_id)
        attrs[s_id] = ATTR_NORMAL

    special_mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
    special_cache = np.flatnonzero(np.asarray(attrs, dtype=np.int64) & special_mask).tolist()
    special_cache.sort(key=lambda tid: -len(tokens[tid].encode("utf-8")))

    # per-model token attributes (llama.cpp sets these by name; GGUF does not carry them)
    name = str(_get(meta, "general.name", "")).lower()
    arch = _get(meta, "general.architecture")
    arch = None if arch is None else str(arch)

    def set_attr(text: str, bit: int, value: bool) -> None:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = attrs[tid] | bit if value else attrs[tid] & ~bit

    if any(s in pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in (arch or "") for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in special_cache:
            attrs[tid] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, ATTR_RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", ATTR_LSTRIP, True)

    template = _get(meta, KEY_CHAT_TEMPLATE)
    return Vocab(
        model=model,
        pre=pre,
        tokens=tokens,
        attrs=attrs,
        scores=scores,
        merges=merges,
        token_to_id=token_to_id,
        special=special,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        clean_spaces=clean_spaces,
        eog_ids=frozenset(eog),
        chat_template=None if template is None else str(template),
        architecture=arch,
        special_cache=special_cache,
    )
