"""GPT-2-style byte-level BPE as an HF ``tokenizers.Tokenizer`` built from GGUF metadata.

The HF tokenizer gets no added tokens: special tokens are split off before it is called
(see ``Tokenizer._partition``), so it only ever sees plain text fragments.
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from gufo.tokenizer.vocab import Vocab


def build_bpe(vocab: Vocab) -> HFTokenizer:
    assert vocab.pre is not None and vocab.merges is not None
    token_to_id = vocab.token_to_id
    ignore_merges = vocab.pre.ignore_merges
    # llama.cpp splits "first second" at the first space after the first character
    raw = vocab.merges if isinstance(vocab.merges, list) else list(vocab.merges)
    joined = "\0".join(raw)
    if joined.startswith(" ") or "\0 " in joined:
        pairs = [(m[: m.find(" ", 1)], m[m.find(" ", 1) + 1 :]) for m in raw if m.find(" ", 1) > 0]
    else:
        pairs = [tuple(m.split(" ", 1)) for m in raw]
    if len(set(raw)) != len(raw):
        pairs = list(dict.fromkeys(pairs))  # a repeated merge keeps its first rank, as in llama.cpp
    try:
        model = BPE(token_to_id, pairs, ignore_merges=ignore_merges)
    except Exception:
        # HF needs both halves and their concatenation in the vocabulary; llama.cpp would keep
        # such a merge and spell its result as bytes, which no real vocabulary relies on
        pairs = [
            (a, b)
            for a, b in (p for p in pairs if len(p) == 2)
            if a in token_to_id and b in token_to_id and a + b in token_to_id
        ]
        model = BPE(token_to_id, pairs, ignore_merges=ignore_merges)
    tok = HFTokenizer(model)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in vocab.pre.regexes]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tok
