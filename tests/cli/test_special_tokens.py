"""`gufo run` prints control tokens as nothing unless --special (-sp), as llama.cpp does; the token's
type is read from the file with the `gguf` package. SmolLM2's vocabulary: gguf reads gemma3-270m's 262k
tokens in 25 s of CPU, SmolLM2's 49k in 4. (gemma3's <start_of_image> is USER_DEFINED in its file, a
type llama.cpp and gufo print whatever --special says, like that vocabulary's `</div>` and tab runs.)"""

from __future__ import annotations

import gguf
import pytest

from gufo.cli import run as run_command
from gufo.engine.engine import GenerationResult
from gufo.gguf.model_file import open_model_file
from gufo.tokenizer import Tokenizer
from tests.conftest import gguf_reader, gufo

MODEL = "smollm2-135m"
TOKEN = "<|im_start|>"  # a chat marker a base-model prompt may well generate


@pytest.fixture(scope="module")
def control_token(model_path) -> int:
    """The token's id; gguf reads its type as CONTROL."""
    reader = gguf_reader(model_path(MODEL))
    tokens, types = reader.fields["tokenizer.ggml.tokens"], reader.fields["tokenizer.ggml.token_type"]
    token_id = next(i for i, part in enumerate(tokens.data) if bytes(tokens.parts[part]).decode() == TOKEN)
    assert int(types.parts[types.data[token_id]][0]) == gguf.TokenType.CONTROL
    return token_id


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return Tokenizer.from_gguf(open_model_file(model_path(MODEL)).metadata)


class ScriptedEngine:
    """The model's real tokenizer, and a generation that yields the given ids (no weights load)."""

    context = 4096

    def __init__(self, tokenizer: Tokenizer, ids: list[int]):
        self.tokenizer, self.ids = tokenizer, ids

    def check_fits(self, n_tokens: int) -> None:
        pass

    def generate(self, prompt_ids, max_tokens, params, stop_at_eog, on_token):
        result = GenerationResult(list(prompt_ids))
        for token in self.ids:
            result.generated_ids.append(token)
            on_token(token)
        return result


@pytest.mark.parametrize("flags,printed", [([], ""), (["--special"], TOKEN), (["-sp"], TOKEN)])
def test_control_token_prints_only_with_special(
    capsys, monkeypatch, tokenizer, control_token, flags, printed
):
    monkeypatch.setattr(run_command, "make_engine", lambda args: ScriptedEngine(tokenizer, [control_token]))
    code, out, _ = gufo(capsys, "run", "-m", MODEL, "-p", "Hello", "-n", "1", *flags)
    assert code == 0
    assert out == printed + "\n"
