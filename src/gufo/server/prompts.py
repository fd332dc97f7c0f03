"""Several prompts in one /v1/completions request: one choice per prompt, `index` its place in the list.

Each prompt is its own job (they run as concurrent requests do); the answer holds their choices in
order and their usage summed, and a stream interleaves their chunks as they come, each with its index.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator

from gufo.server.responses import Generation, Shape, collect, sse, stream_events

DONE = sse("[DONE]")


def indexed(shape: Shape, count: int) -> list[Shape]:
    """`count` copies of `shape` (one response id) with indices 0..count-1."""
    shapes = []
    for index in range(count):
        one = copy.copy(shape)
        one.index = index
        shapes.append(one)
    return shapes


def summed_usage(generations: list[Generation]) -> dict:
    usages = [g.usage() for g in generations]
    total = {
        key: sum(u[key] for u in usages) for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    return {**total, "prompt_tokens_details": {"cached_tokens": cached}}


async def collect_all(generations: list[Generation], shape: Shape) -> dict:
    shapes = indexed(shape, len(generations))
    answers = await asyncio.gather(*(collect(g, s) for g, s in zip(generations, shapes, strict=True)))
    choices = [answer["choices"][0] for answer in answers]
    return {**shape.envelope(shape.object_name, choices), "usage": summed_usage(generations)}


async def stream_all(generations: list[Generation], shape: Shape, include_usage: bool) -> AsyncIterator[str]:
    """Every prompt's chunks as they come (an error event of one prompt passes through), then the
    summed usage when asked for, then one [DONE]."""
    events: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump(generation: Generation, one: Shape) -> None:
        try:
            async for event in stream_events(generation, one, False):
                if event != DONE:
                    await events.put(event)
        finally:
            events.put_nowait(None)

    pairs = zip(generations, indexed(shape, len(generations)), strict=True)
    tasks = [asyncio.ensure_future(pump(g, s)) for g, s in pairs]
    try:
        running = len(tasks)
        while running:
            event = await events.get()
            if event is None:
                running -= 1
            else:
                yield event
        if include_usage:
            yield sse({**shape.envelope(shape.chunk_name, []), "usage": summed_usage(generations)})
        yield DONE
    finally:  # the client left: each cancelled pump ends its job
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
