"""Process bodies for the tensor-parallel tests: each rank (or the single process) runs a prefill then
greedy decode steps through the model directly, on a chosen kernel backend, and rank 0 saves its logits."""

from __future__ import annotations

import os
import socket
from contextlib import nullcontext
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def in_float64(obj: object, seen: set[int] | None = None) -> object:
    """`obj` (a built model) with every float32 tensor it holds, down its gufo objects, lists, tuples
    and dicts, made float64: the oracle run of a float32 computation's rounding error."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return obj
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.double() if obj.dtype == torch.float32 else obj
    if isinstance(obj, list):
        obj[:] = [in_float64(value, seen) for value in obj]
    elif isinstance(obj, tuple):
        return tuple(in_float64(value, seen) for value in obj)
    elif isinstance(obj, dict):
        obj.update({key: in_float64(value, seen) for key, value in obj.items()})
    elif type(obj).__module__.startswith("gufo.") and hasattr(obj, "__dict__"):
        for key, value in list(vars(obj).items()):
            if (converted := in_float64(value, seen)) is not value:
                object.__setattr__(obj, key, converted)  # frozen dataclasses too
    return obj


def greedy_logits(
    path: Path,
    backend: str,
    prompt: list[int],
    steps: int,
    tp=None,
    float64_following: list[int] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """Prefill logits of every prompt token, then `steps` greedy decode steps: (prefill, decode, ids).
    float64_following: the same single-process model run in float64 (weights as dequantized, activations,
    cache), decoding these ids instead of its own argmax (the float32 run's greedy ids)."""
    from unittest import mock

    from gufo.gguf.model_file import open_model_file
    from gufo.kernels import backends
    from gufo.kernels.catalog import register_all
    from gufo.models.registry import build_model
    from gufo.parallel.model import build_sharded

    register_all(backend)  # "torch" (the reference kernels alone) or "cpu"
    shard = None if tp is None else lambda arch, mf, on: build_sharded(arch, mf, on, tp)
    model = build_model(open_model_file(path), backend, shard)
    float64 = float64_following is not None
    if float64:
        in_float64(model)
        embed = model.embed
        model.embed = lambda tokens: embed(tokens).double()
    with mock.patch.object(backends, "cache_dtype", lambda _: torch.float64) if float64 else nullcontext():
        cache = model.new_cache(1, len(prompt) + steps + 1)
    with torch.inference_mode():
        prefill = model.forward(torch.tensor(prompt), cache, 0, 0, all_logits=True)
        logits, decoded, ids = prefill[-1], [], []
        for step in range(steps):
            ids.append(float64_following[step] if float64 else int(logits.argmax()))
            logits = model.forward(torch.tensor(ids[-1:]), cache, 0, len(prompt) + step)[-1]
            decoded.append(logits)
    assert {prefill.dtype} | {row.dtype for row in decoded} == {torch.float64 if float64 else torch.float32}
    return prefill, decoded, ids


def rank_main(rank: int, world: int, port: int, path: str, backend: str, prompt, steps, out: str) -> None:
    """torch.multiprocessing.start_processes target: join a gloo group of `world` ranks, rank 0 saves
    the result."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)  # 2 shared cores: one thread per rank
    from gufo.parallel.process_group import start

    tp = start(world, "cpu")
    try:
        result = greedy_logits(Path(path), backend, prompt, steps, tp)
        if rank == 0:
            torch.save(result, out)
    finally:
        tp.close()


# What the ranks' fork server imports once: each rank is a new process forked from it, a process that never
# ran a torch thread pool (so safe to fork), without paying torch's and gufo's import per rank as spawn did
RANK_IMPORTS = ["tests.parallel.tp_workers", "gufo.parallel.process_group", "gufo.models.registry"]


def run_ranks(world: int, path: Path, backend: str, prompt: list[int], steps: int, out: Path):
    """`greedy_logits` on `world` gloo ranks, processes of their own; rank 0's result. Fails when they
    hang."""
    import time

    import torch.multiprocessing as mp

    from tests.conftest import HANG_GUARD_S  # a hung collective fails the test instead of blocking CI

    args = (world, free_port(), str(path), backend, prompt, steps, str(out))
    mp.set_forkserver_preload(RANK_IMPORTS)
    context = mp.start_processes(rank_main, args=args, nprocs=world, join=False, start_method="forkserver")
    deadline = time.monotonic() + HANG_GUARD_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{world} tensor-parallel ranks hung: not finished after {HANG_GUARD_S} s")
    return torch.load(out)
