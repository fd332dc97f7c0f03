"""The request body of POST /v1/responses (pydantic), strict as the chat completions' (schemas.py).

Input items and tools are checked one by one (`input_items`, `function_tools`), so an unsupported item
or tool type is a 400 naming it rather than a list of every union member's complaint. Fields that
change nothing here are accepted at the values that mean what gufo does: `include:
["reasoning.encrypted_content"]` (reasoning items carry their text, never encrypted), `truncation:
"disabled"`, `background: false`, `service_tier`, `prompt_cache_key`, `user`, `safety_identifier`,
`client_metadata` and `text.verbosity`. `seed` is an extension (the chat completions' field).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gufo.server.responses import ApiError, invalid_request
from gufo.server.schemas import SEED_MAX, SEED_MIN, STRICT, FunctionDefinition

ItemStatus = Literal["in_progress", "completed", "incomplete"]
T = TypeVar("T", bound=BaseModel)


class ContentPart(BaseModel):
    model_config = STRICT

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an output_text part replayed from an earlier response has them
    logprobs: list[Any] | None = None


def joined(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(BaseModel):
    model_config = STRICT

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(BaseModel):
    model_config = STRICT

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class ReasoningText(BaseModel):
    model_config = STRICT

    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(BaseModel):
    """An earlier turn's reasoning: left out of the prompt, as chat templates leave out earlier thoughts."""

    model_config = STRICT

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


class FunctionTool(FunctionDefinition):
    type: Literal["function"]


class FunctionChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the output always follows the schema, strict or not

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("type 'json_schema' needs a schema")
        if self.type != "json_schema" and (self.schema_ is not None or self.name is not None):
            raise ValueError("name and schema are only allowed with type 'json_schema'")
        return self


class TextConfig(BaseModel):
    model_config = STRICT

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(BaseModel):
    """`effort` "none" or "minimal" turns a thinking template's thought off (enable_thinking=false)."""

    model_config = STRICT

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of summary

    @property
    def thinks(self) -> bool:
        return self.effort not in ("none", "minimal")


class ResponsesStreamOptions(BaseModel):
    model_config = STRICT

    include_obfuscation: bool | None = None  # nothing is obfuscated: a local server pads no events


class ResponsesRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = None
    include: list[Literal["reasoning.encrypted_content"]] | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    service_tier: str | None = None
    client_metadata: dict[str, str] | None = None  # Codex CLI's
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    user: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(
        cls, options: ResponsesStreamOptions | None, info: ValidationInfo
    ) -> ResponsesStreamOptions | None:
        if options is not None and info.data.get("stream") is not True:
            raise ValueError("only allowed with stream=true")
        return options

    def input_items(self) -> list[InputItem]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return typed(self.input, "input", ITEM_TYPES, default="message")

    def function_tools(self) -> list[FunctionTool]:
        return typed(self.tools or [], "tools", {"function": FunctionTool})


def typed(
    values: list[dict[str, Any]], field: str, models: dict[str, type[T]], default: str | None = None
) -> list[T]:
    """Each object of a list field validated as the model its `type` names (`default` when it names
    none); a type without a model is a 400 naming it."""
    out = []
    for index, value in enumerate(values):
        kind = value.get("type", default)
        model = models.get(kind) if isinstance(kind, str) else None
        if model is None:
            param = f"{field}.{index}.type"
            message = f"{param}: {kind!r} is not supported (only {', '.join(models)})"
            raise ApiError(400, message, param=param, code="invalid_value")
        try:
            out.append(model.model_validate(value))
        except ValidationError as err:
            raise invalid_request(err, (field, index)) from None
    return out
