"""Request bodies of the OpenAI-compatible endpoints (pydantic).

Every field is strict (no coercion: `"max_tokens": true` or `"stream": "yes"` is a 400) and bounded to
the range the sampler serves finitely; an unknown field is a 400 naming it, so nothing a client asks
for is silently ignored. Fields accepted only at their no-op values (`n`, `best_of`, `suffix`,
`response_format`, `tools`, `tool_choice`) say so in their 400. Extensions: `cache_prompt` (llama.cpp's
name) turns prefix reuse off; `stop_token_ids` (vLLM's name) stops on token ids; `top_k`, `min_p` and
`repeat_penalty` are llama.cpp's sampling extensions; `chat_template_kwargs` (vLLM's name) are variables
for the chat template; `grammar` (llama-server's name) or `structured_outputs: {"grammar": ...}`
(vLLM's) is a GBNF or Lark grammar the output follows.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gufo.engine.sampling import SamplingParams

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
# torch.Generator.manual_seed takes exactly this range (negative seeds wrap), as OpenAI's int64 seeds do.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# Beyond these the penalized logits leave float32's range (and no sensible request goes near them).
REPEAT_PENALTY_MIN, REPEAT_PENALTY_MAX = 0.01, 100.0
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for one bias


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`; of its constraints, only the grammar (its json, regex and choice
    are a 400 naming them)."""

    model_config = STRICT

    grammar: str | None = None  # optional to pydantic, so that {"regex": ...} is named as unsupported

    @model_validator(mode="after")
    def _has_grammar(self) -> StructuredOutputs:
        if self.grammar is None:
            raise ValueError("grammar is required")
        return self


class GenerationRequest(BaseModel):
    model_config = STRICT

    model: str | None = None  # optional, as llama-server has it: the served model
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, ge=REPEAT_PENALTY_MIN, le=REPEAT_PENALTY_MAX)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_prompt: bool = True
    user: str | None = None  # identifies the end user to OpenAI; nothing to do with the output
    grammar: str | None = None  # llama-server's: a GBNF (or Lark) grammar the output follows
    structured_outputs: StructuredOutputs | None = None  # vLLM's name for the same

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(
        cls, options: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if options is not None and info.data.get("stream") is not True:
            raise ValueError("only allowed with stream=true")
        return options

    @field_validator("structured_outputs")
    @classmethod
    def _one_grammar(cls, value: StructuredOutputs | None, info: ValidationInfo) -> StructuredOutputs | None:
        if value is not None and info.data.get("grammar") is not None:
            raise ValueError("not together with grammar")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdecimal():
                raise ValueError(f"keys are token ids, got {key!r}")
            if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
                raise ValueError(f"biases are in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {value}")
        return bias

    def grammar_field(self) -> tuple[str, str] | None:
        """The field that holds the grammar asked for, and the grammar."""
        if self.grammar is not None:
            return "grammar", self.grammar
        if self.structured_outputs is not None:
            return "structured_outputs.grammar", self.structured_outputs.grammar or ""
        return None

    def biased_token_ids(self) -> list[int]:
        return [int(key) for key in self.logit_bias or {}]

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self) -> SamplingParams:
        names = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed")
        given = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        return SamplingParams(
            **given,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias={int(key): value for key, value in (self.logit_bias or {}).items()},
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class FunctionName(BaseModel):
    model_config = STRICT

    name: str


class FunctionCall(FunctionName):
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = STRICT

    id: str
    type: Literal["function"]
    function: FunctionCall

    def as_template_input(self) -> dict[str, Any]:
        # HF chat templates expect the arguments as a mapping (many render them with `tojson`).
        try:
            arguments = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        if not isinstance(arguments, dict):
            arguments = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def as_template_input(self) -> dict[str, Any]:
        """The message as HF chat templates take it; `developer` is OpenAI's newer name for `system`."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content or "",
        }
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.as_template_input() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class JsonSchemaFormat(BaseModel):
    model_config = STRICT

    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the output always follows the schema, strict or not


class ResponseFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @field_validator("json_schema")
    @classmethod
    def _with_its_type(cls, value: JsonSchemaFormat | None, info: ValidationInfo) -> JsonSchemaFormat | None:
        if value is not None and info.data.get("type") != "json_schema":
            raise ValueError("only allowed with type 'json_schema'")
        return value


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: only the first call; a constrained one is always one
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's name: e.g. {"enable_thinking": false}

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, count: int | None, info: ValidationInfo) -> int | None:
        if count is not None and info.data.get("logprobs") is not True:
            raise ValueError("only allowed with logprobs=true")
        return count

    def tool_names(self) -> frozenset[str] | None:
        """The functions the model may call; None when it may call none."""
        if not self.tools or self.tool_choice == "none":
            return None
        return frozenset(tool.function.name for tool in self.tools)

    def token_limit(self) -> tuple[str, int | None]:
        """The field that limits the output and its value."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    # one prompt (text or token ids), or several: one choice each
    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, best_of: int | None) -> int | None:
        if best_of not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _no_infill(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("fill-in-the-middle (suffix) is not supported")
        return suffix

    def token_limit(self) -> tuple[str, int | None]:
        return "max_tokens", self.max_tokens

    @property
    def several_prompts(self) -> bool:
        """Whether `prompt` is a list of prompts (texts or token id lists), not one prompt."""
        return not isinstance(self.prompt, str) and not isinstance(self.prompt[0], int)

    def prompts(self) -> list[str | list[int]]:
        return list(self.prompt) if self.several_prompts else [self.prompt]

    def logprob_count(self) -> int | None:
        return self.logprobs
