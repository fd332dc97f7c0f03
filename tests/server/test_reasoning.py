"""A thinking, tool-aware chat template (tiny, Qwen3-like) given to the server: `chat_template_kwargs`
reach it, `<think>` text comes back as reasoning_content (whole and streamed), and a tool-result round
trip renders as the prompt written here by hand. The oracle is gufo's Engine run on that hand-written
prompt, apart from the server."""

from __future__ import annotations

import pytest

from gufo.engine.sampling import SamplingParams
from gufo.server.settings import ServerSettings
from tests.server.conftest import MODEL, live_server, load_engine

# Tools listed by name in a system turn, calls written as hermes <tool_call> JSON, and Qwen3's switch:
# enable_thinking false closes an empty thought in the generation prompt, otherwise it opens one.
TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools:' }}{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
ASKED = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=16, chat_template=TEMPLATE)
    with live_server(settings, lambda: load_engine(1)) as live:
        yield live


def greedy_text(engine, prompt: str) -> str:
    tok = engine.tokenizer
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    out = engine.generate(ids, MAX_TOKENS, SamplingParams(temperature=0)).generated_ids
    return tok.decode([t for t in out if t not in tok.eog_ids])


def test_thought_is_reasoning_content_whole_and_streamed(server, reference_engine):
    text = greedy_text(reference_engine, ASKED + "<think>\n")
    assert text and "</think>" not in text  # the model never closes the thought within MAX_TOKENS
    client = server.client()
    common = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": MAX_TOKENS}
    message = client.chat.completions.create(**common).choices[0].message
    assert message.model_extra["reasoning_content"] == text and message.content == ""
    deltas = [c.choices[0].delta for c in client.chat.completions.create(stream=True, **common) if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == text
    assert not any(d.content for d in deltas)


def test_enable_thinking_false_reaches_the_template(server, reference_engine):
    text = greedy_text(reference_engine, ASKED + "<think>\n\n</think>\n\n")
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content == text and text
    assert "reasoning_content" not in reply.choices[0].message.model_extra


def test_tool_result_round_trip_renders(server, reference_engine):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    prompt = (
        "<|im_start|>system\nTools: get_weather<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n18 C, sunny<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    text = greedy_text(reference_engine, prompt)
    assert "<tool_call>" not in text  # the oracle's reply is plain content, no call to parse
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[tool],
        temperature=0,
        max_tokens=MAX_TOKENS,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    tok = reference_engine.tokenizer
    assert reply.usage.prompt_tokens == len(tok.encode(prompt, add_special=True, parse_special=True))
    assert reply.choices[0].message.content == text and not reply.choices[0].message.tool_calls
