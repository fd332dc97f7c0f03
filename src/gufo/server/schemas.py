"""Request bodies of the OpenAI-compatible endpoints (pydantic), and the error body.

Unknown fields are ignored, as OpenAI clients send many (user, presence_penalty, ...). `cache_prompt`
(llama.cpp's name) turns prefix reuse off; `stop_token_ids` (vLLM's name) stops on token ids;
`top_k`, `min_p` and `repeat_penalty` are llama.cpp's sampling extensions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gufo.runtime.sampling import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_prompt: bool = True

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self) -> SamplingParams:
        given = {
            name: getattr(self, name)
            for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed")
            if getattr(self, name) is not None
        }
        return SamplingParams(**given)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": self.role, "content": content or ""}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=5)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def logprob_count(self) -> int | None:
        return self.logprobs


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
