"""Pre-tokenizer settings of GPT-2-style BPE vocabularies, selected by ``tokenizer.ggml.pre``.

Each entry gives the regular expressions that split text into words before the BPE merges,
applied one after the other (every piece that a regex matches and every piece between matches
becomes a word, the next regex splits those again), as llama.cpp's ``llama-vocab.cpp`` does
for the same name, together with the flags that name sets there: whether the detokenizer
cleans spaces before punctuation, whether a whole word found in the vocabulary skips the merges
(``ignore_merges``) and whether BOS is added by default. The regexes are written for
Oniguruma (the engine of HF ``tokenizers``); ``\\z`` stands where llama.cpp's ECMAScript regex
says ``$`` (end of input).
"""

from __future__ import annotations

from dataclasses import dataclass

# Contractions spelled out case by case (llama.cpp's form of "(?i:'s|'t|...)").
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The letters of the DeepSeek LLM pre-tokenizer: Latin, Greek, Cyrillic, Armenian, Georgian,
# Cherokee and a few more blocks, as ranges of code points.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_CJK = "\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff"
_ASCII_PUNCT = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"""


@dataclass(frozen=True)
class PreTokenizer:
    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False  # the default BOS id is "none" (chatglm)


_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
_STARCODER = (r"\p{N}", GPT2)
_BLOOM = (r" ?[^(\s|.,!?…。，、।۔،)]+",)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)

# name -> (regexes, flags); several names share one pre-tokenizer as in llama.cpp.
_TABLE: dict[str, tuple[tuple[str, ...], dict]] = {}


def _add(names: str, regexes: tuple[str, ...], **flags) -> None:
    for name in names.split():
        _TABLE[name] = (regexes, flags)


_add("default", _DEFAULT)
_add(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
    (LLAMA3,),
    ignore_merges=True,
    add_bos=True,
)
_add("dbrx smaug-bpe", (LLAMA3,))
_add(
    "deepseek-llm",
    (
        "[\r\n]",
        r"\s?[" + _DEEPSEEK_LETTERS + "]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+\z",
        "[" + _CJK + "]+",
        r"\p{N}+",
    ),
    clean_spaces=False,
)
_add(
    "deepseek-coder",
    ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[" + _CJK + "]+", r"\p{N}"),
    clean_spaces=False,
)
_add(
    "deepseek-v3 hunyuan-dense joyai-llm hy_v4",
    (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        _ASCII_PUNCT
        + r"[A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    clean_spaces=False,
)
_add("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"))
_add("starcoder refact codeshell exaone minerva-7b mellum2", _STARCODER)
_add("command-r smollm", _STARCODER, clean_spaces=False)
_add("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert", (GPT2,))
_add("exaone4 jina-v1-en jina-v2-code roberta-bpe mpt olmo jais", (GPT2,))
_add("trillion granite-docling", (GPT2,), clean_spaces=False)
_add("stablelm2 megrez", (QWEN2,))
_add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", (QWEN2,), clean_spaces=False)
_add("qwen35", (QWEN35,), clean_spaces=False)
_add("poro-chat", _BLOOM, clean_spaces=False)
_add("bloom gpt3-finnish", _BLOOM)
_add("viking", (*_BLOOM, r"\p{N}"), clean_spaces=False)
_add("chatglm-bpe", (LLAMA3,), no_bos=True)
_add("glm4 glm5", (LLAMA3,), no_bos=True, ignore_merges=True)
_add(
    "tekken",
    (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])"
        r"([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    clean_spaces=False,
    ignore_merges=True,
    add_bos=True,
)
_add("gpt-4o llama4 kanana2 talkie minimax-m2", _GPT4O, clean_spaces=False)
_add(
    "seed-coder",
    (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    clean_spaces=False,
)
_add(
    "bailingmoe bailingmoe2 llada-moe",
    (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    clean_spaces=False,
)

SUPPORTED = tuple(sorted(_TABLE))


def lookup(name: str) -> PreTokenizer | None:
    """The pre-tokenizer called ``name`` (an empty name means ``default``), or None if unknown."""
    entry = _TABLE.get(name or "default")
    if entry is None:
        return None
    regexes, flags = entry
    return PreTokenizer(name=name or "default", regexes=regexes, **flags)
