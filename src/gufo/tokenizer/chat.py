"""Chat templates rendered with jinja2 the way HF ``transformers`` renders them.

Sandboxed environment, ``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception``,
``strftime_now`` and a ``tojson`` that keeps non-ASCII text; ``bos_token``/``eos_token`` are the
vocabulary's texts. When the GGUF has no template, gemma-family models get the Gemma turn format
and all others ChatML (llama.cpp's fallback). BUILTIN_TEMPLATES are the formats a user may name
instead of the GGUF's template (`gufo chat --chat-template NAME`).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gufo.errors import BadInputError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Gemma's turn format: "<start_of_turn>user\n...<end_of_turn>\n", the assistant is "model", a system
# message is put in front of the first user turn; content may be a string or a list of text parts.
GEMMA_TEMPLATE = (
    "{% macro text(content) %}"
    "{% if content is string %}{{ content | trim }}"
    "{% else %}{% for part in content if part['type'] == 'text' %}{{ part['text'] | trim }}{% endfor %}"
    "{% endif %}"
    "{% endmacro %}"
    "{{ bos_token }}"
    "{% set first = 0 %}{% set system = '' %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = text(messages[0]['content']) + '\n\n' %}{% set first = 1 %}"
    "{% endif %}"
    "{% for message in messages[first:] %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (system if loop.first else '') + text(message['content'])"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Llama 3's header format (Meta's model card; llama.cpp's built-in "llama3"): every turn's content trimmed.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] | trim)"
    " + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE, "llama3": LLAMA3_TEMPLATE}


class TemplateError(Exception):
    """Raised by a template's ``raise_exception``."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def fallback_template(architecture: str | None) -> str:
    if architecture and architecture.startswith("gemma"):
        return GEMMA_TEMPLATE
    return CHATML_TEMPLATE


def render(source: str, messages: list[dict], add_generation_prompt: bool, **variables: Any) -> str:
    try:
        template = _compile(source)
    except jinja2.TemplateError as e:
        raise BadInputError(f"chat template: cannot compile: {e}") from None
    try:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except TemplateError as e:
        raise BadInputError(f"chat template: {e}") from None
    except jinja2.TemplateError as e:
        raise BadInputError(f"chat template: rendering failed: {e}") from None
