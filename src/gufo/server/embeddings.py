"""POST /v1/embeddings (llama-server's and OpenAI's shapes), POST /tokenize and POST /detokenize
(llama-server's): request bodies and answers.

An embedding is the output norm's values pooled over the input's tokens (`--pooling`: their mean, or
the last token's), scaled to unit length as llama-server's /v1/embeddings and OpenAI's are. It runs on
the generation worker between two steps, in a scratch cache, so no session's KV changes (the running
streams wait for it as for one prefill of the input).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Literal

import torch
from pydantic import BaseModel, Field

from gufo.errors import BadInputError
from gufo.server.responses import ApiError
from gufo.server.scheduler import Scheduler, WorkerDeadError
from gufo.server.schemas import STRICT
from gufo.tokenizer import Tokenizer


class EmbeddingRequest(BaseModel):
    model_config = STRICT

    # one text, several, one token id list, or several (OpenAI's four shapes)
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    def token_lists(self, tokenizer: Tokenizer, context: int) -> list[list[int]]:
        """Each input as token ids, checked: not empty, ids in the vocabulary, within the context."""
        given = self.input
        if isinstance(given, str) or (given and isinstance(given[0], int)):
            given = [given]
        if not given:
            raise ApiError(400, "input: empty list", param="input", code="invalid_value")
        lists = [
            tokenizer.encode(item, add_special=True, parse_special=True) if isinstance(item, str) else item
            for item in given
        ]
        for index, ids in enumerate(lists):
            param = "input" if len(lists) == 1 else f"input.{index}"
            if not ids:
                raise ApiError(400, f"{param}: empty input", param=param, code="invalid_value")
            check_token_ids(ids, tokenizer, param)
            if len(ids) > context:
                message = f"{param}: {len(ids)} tokens are more than the context of {context} tokens"
                raise ApiError(400, message, param=param, code="context_length_exceeded")
        return lists


def check_token_ids(ids: list[int], tokenizer: Tokenizer, param: str) -> None:
    if not all(0 <= t < tokenizer.vocab_size for t in ids):
        message = f"{param}: token ids must be in [0, {tokenizer.vocab_size})"
        raise ApiError(400, message, param=param, code="invalid_value")


def encode_vector(vector: torch.Tensor, encoding_format: str) -> list[float] | str:
    """float: a JSON list; base64: little-endian float32 bytes, as the OpenAI SDKs decode them."""
    if encoding_format == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def embeddings(
    body: EmbeddingRequest,
    scheduler: Scheduler,
    tokenizer: Tokenizer,
    context: int,
    pooling: str,
    model_id: str,
) -> dict:
    lists = body.token_lists(tokenizer, context)
    engine = scheduler.engine
    n_embd = engine.config.n_embd
    if body.dimensions is not None and body.dimensions != n_embd:
        message = f"dimensions: this model's embeddings have {n_embd} (no truncation)"
        raise ApiError(400, message, param="dimensions", code="invalid_value")

    def work() -> list[torch.Tensor]:
        return [torch.nn.functional.normalize(engine.embed(ids, pooling), dim=0) for ids in lists]

    try:
        vectors = await asyncio.wrap_future(scheduler.call(work))
    except WorkerDeadError as err:
        raise ApiError(503, str(err), "unavailable_error", code="worker_stopped") from None
    except BadInputError as err:  # an engine that cannot embed (tensor parallelism)
        raise ApiError(400, str(err), code="unsupported") from None
    data = [
        {"object": "embedding", "index": index, "embedding": encode_vector(vector, body.encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    n_tokens = sum(len(ids) for ids in lists)
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return {"object": "list", "data": data, "model": model_id, "usage": usage}


class TokenizeRequest(BaseModel):
    model_config = STRICT

    content: str
    add_special: bool = False  # llama-server's defaults
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    tokens: list[int]


def tokenize(body: TokenizeRequest, tokenizer: Tokenizer) -> dict:
    """{"tokens": ids}, or with pieces [{"id", "piece"}]: the piece as text, or as a list of its bytes
    when they are not UTF-8 on their own (as llama-server does)."""
    ids = tokenizer.encode(body.content, add_special=body.add_special, parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": ids}
    pieces = []
    for token in ids:
        data = tokenizer.piece(token)
        try:
            piece: str | list[int] = data.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(data)
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


def detokenize(body: DetokenizeRequest, tokenizer: Tokenizer) -> dict:
    check_token_ids(body.tokens, tokenizer, "tokens")
    return {"content": tokenizer.decode(body.tokens)}
