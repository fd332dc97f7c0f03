"""Chat templates: the real models' and ../shared/vocab/templates, rendered for a short conversation
and compared with strings written by hand from each template's documented turn format."""

from __future__ import annotations

import pytest
from tokenizer_oracles import TEMPLATES_DIR, metadata_of, model_file, model_tokenizer, vocab_tokenizer

from gufo.errors import BadInputError
from gufo.tokenizer.chat import BUILTIN_TEMPLATES, render

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]


def template(name: str) -> str:
    return (TEMPLATES_DIR / name).read_text()


def test_smollm2_own_template() -> None:
    tok = model_tokenizer("smollm2-135m")
    assert tok.chat_template is not None
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    tokens = metadata_of(model_file("smollm2-135m"))["tokenizer.ggml.tokens"]
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    assert ids[0] == start and ids.count(start) == 3 and ids.count(end) == 2
    no_prompt = tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=False)
    assert no_prompt == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_gemma3_builtin_template() -> None:
    # the gemma3 GGUF carries no template: gemma's turn format is built in; the leading <bos> is
    # left to encode(add_special=True), as llama.cpp does
    tok = model_tokenizer("gemma3-270m")
    assert tok.chat_template is None
    prompt = tok.apply_chat_template(CONVERSATION)
    assert prompt == (
        "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]  # OpenAI-style content parts
    assert tok.apply_chat_template(parts) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    tokens = metadata_of(model_file("gemma3-270m"))["tokenizer.ggml.tokens"]
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    assert ids[:2] == [tok.bos_id, tokens.index("<start_of_turn>")]
    assert ids.count(tok.bos_id) == 1
    assert ids.count(tokens.index("<end_of_turn>")) == 3


def test_phi3_template_from_vocab_drops_bos_text() -> None:
    tok = vocab_tokenizer("phi-3")
    assert (
        tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == "<|user|>\nHi<|end|>\n<|assistant|>\n"
    )


def test_gemma2_template() -> None:
    messages = CONVERSATION[1:]
    out = render(template("google-gemma-2-2b-it.jinja"), messages, True, bos_token="<bos>", eos_token="<eos>")
    assert out == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    with pytest.raises(BadInputError, match="System role not supported"):
        render(template("google-gemma-2-2b-it.jinja"), CONVERSATION, True, bos_token="<bos>")


CHATML_CONVERSATION = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\n2+2?<|im_end|>\n"
)


def test_qwen3_template() -> None:
    src = template("Qwen-Qwen3-0.6B.jinja")
    assert render(src, CONVERSATION, True) == CHATML_CONVERSATION + "<|im_start|>assistant\n"
    no_think = render(src, CONVERSATION, True, enable_thinking=False)
    assert no_think == CHATML_CONVERSATION + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # an earlier assistant turn loses its reasoning, the last one keeps it
    reply = {"role": "assistant", "content": "<think>\nsum\n</think>\n\n4"}
    out = render(src, [CONVERSATION[1], reply], False)
    assert (
        out
        == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nsum\n</think>\n\n4<|im_end|>\n"
    )


def test_qwen3_template_tools_use_tojson_without_ascii_escapes() -> None:
    tools = [{"type": "function", "function": {"name": "clock", "description": "Zeit für dich"}}]
    out = render(template("Qwen-Qwen3-0.6B.jinja"), CONVERSATION[1:2], True, tools=tools)
    assert out.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    tool_json = '{"type": "function", "function": {"name": "clock", "description": "Zeit für dich"}}'
    assert f"<tools>\n{tool_json}\n</tools>" in out
    assert out.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_coder_template() -> None:
    out = render(template("Qwen3-Coder.jinja"), CONVERSATION, True)
    assert out == CHATML_CONVERSATION + "<|im_start|>assistant\n"


def test_qwen35_template() -> None:
    src = template("Qwen3.5-4B.jinja")
    assert render(src, CONVERSATION, True) == CHATML_CONVERSATION + "<|im_start|>assistant\n<think>\n"
    no_think = render(src, CONVERSATION, True, enable_thinking=False)
    assert no_think == CHATML_CONVERSATION + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    with pytest.raises(BadInputError, match="No messages provided"):
        render(src, [], True)


def test_smollm3_template() -> None:
    messages = [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}]
    out = render(template("HuggingFaceTB-SmolLM3-3B.jinja"), messages, True)
    assert out == (
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /no_think\n\n"
        "## Custom Instructions\n\nBe brief.\n\n<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n"
    )


def test_strftime_now_and_bad_template() -> None:
    assert render("{{ strftime_now('%Y') | length }}", [], False) == "4"
    with pytest.raises(BadInputError, match="chat template"):
        render("{% for %}", [], False)


def test_builtin_llama3_template() -> None:
    # Meta's Llama 3 header format, written out by hand from the model card
    out = render(BUILTIN_TEMPLATES["llama3"], CONVERSATION, True, bos_token="<|begin_of_text|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render(BUILTIN_TEMPLATES["chatml"], CONVERSATION, False) == CHATML_CONVERSATION
