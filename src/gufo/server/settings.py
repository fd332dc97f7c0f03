"""Server settings, kept apart from the ASGI stack so the CLI can show defaults without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from gufo.engine.params import SpeculativeParams
from gufo.options import POOLINGS

DEFAULT_PREFILL_CHUNK = 512  # prompt tokens per prefill chunk (at absolute positions)
# prompt tokens per scheduler step, between decode steps, where the engine packs several prompts' chunks
# into one pass (GPUs: `Engine.packs_prefill`)
DEFAULT_PREFILL_BATCH = 2048


@dataclass
class ServerSettings:
    model_id: str
    max_tokens: int = 512  # default and upper limit of a request's max_tokens
    max_pending: int = 16
    max_request_bytes: int = 1 << 20
    request_timeout: float | None = None
    shutdown_timeout: float = 30.0  # seconds running requests may go on after SIGTERM
    header_timeout: float = 10.0  # seconds a connection has to send each request's headers
    body_timeout: float = 30.0  # seconds a request has to send its body
    api_key: str | None = None
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    prefill_batch: int | None = None  # prompt tokens per scheduler step; None: the Scheduler's default
    state_checkpoints: int | None = None  # recurrent models' saved states in all; None: one per session
    speculative: SpeculativeParams | None = None  # None: plain decoding
    draft_model: str | None = None  # with speculative mode "draft"
    pooling: str = POOLINGS[0]  # how /v1/embeddings pools the tokens' hidden states
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (CORS); none by default
    webui: bool = False  # serve the chat page at /
    chat_template: str | None = None  # jinja source for chat requests; None: the model's own
