"""Host milliseconds per scheduler step of `gufo serve`, without the model's device work: the real server
stack (uvicorn, the routes, the scheduler, sampling, SSE) in this process around a stand-in engine whose
`prefill` and `decode_batch` hand back precomputed logits at once (vocabulary 151936, Qwen's). A client
process streams C concurrent greedy completions of `--max-tokens` tokens through the `openai` client.

    python scripts/server_host_overhead.py -c 16,64                  # ms per step, JSON on stdout
    python scripts/server_host_overhead.py -c 64 --profile worker    # + cProfile of the scheduler thread
    python scripts/server_host_overhead.py -c 64 --profile loop      # + cProfile of the event loop thread
    python scripts/server_host_overhead.py -c 16,64 --device cuda    # the logits on a GPU (copies real)

The stand-in engine is a measuring device of this script only: its numbers are the host side of a
step (what the worker thread and the event loop spend per step), never the engine's. A step is the
time between two `decode_batch` calls while all C requests decode; the worker's and the event loop's
CPU time per step come from their thread clocks. On the CPU, `--device cpu`, the device's own work
on the logits (the greedy argmax) runs on the host too: `selection_cpu_ms_p50` says how much of the
worker's time per step it is (where the scheduler has `greedy_split`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import multiprocessing
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from gufo.gguf.model_file import open_model_file
from gufo.models.kv_cache import KVCache
from gufo.server import scheduler as scheduler_module
from gufo.server.run import listen, make_server
from gufo.server.settings import ServerSettings
from gufo.tokenizer import Tokenizer

VOCAB_FILE = Path(__file__).resolve().parents[2] / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
VOCAB = 151936
BANKS = 4  # distinct precomputed decode steps, cycled
TEXT = (
    "The river left the mountains in spring and carried the melted snow past the old mill, where the "
    "miller's daughter kept a notebook of every flood since her grandfather's time. She wrote down the "
    "height of the water on the stone wall, the colour of the sky, and the names of the boats that passed."
)


class StandInEngine:
    """What the scheduler and the routes read of an Engine, with logits ready before they are asked for:
    each row's maximum is planted on a token of TEXT, so every stream decodes to ordinary words."""

    invariant_prefill = chunk_invariant_prefill = True
    rewindable = True
    tensor_parallel = 1

    def __init__(self, tokenizer: Tokenizer, n_slots: int, device: str):
        self.tokenizer = tokenizer
        self.context = 4096
        # the scheduler's page accounting on a real cache of one-number entries (no page is ever taken)
        self.cache = KVCache(1, n_slots, 1, self.context, 1, 1)
        self.device = device
        words = [t for t in tokenizer.encode(TEXT) if t not in tokenizer.eog_ids]
        gen = torch.Generator().manual_seed(0)
        banks = torch.randn(BANKS, n_slots, VOCAB, generator=gen)
        for b in range(BANKS):
            for r in range(n_slots):
                banks[b, r, words[(7 * b + 3 * r) % len(words)]] = 30.0
        self.banks = banks.to(device)
        self.prefill_row = banks[0, 0].clone()
        self.steps: list[tuple[float, int, float, float]] = []  # (wall, rows, worker cpu, loop cpu) per call
        self.selections: list[float] = []  # worker CPU seconds of each greedy_split
        self.loop_clock: int | None = None
        self._step = 0

    def prepare_rows(self, n_rows: int) -> None:
        pass

    def prepare_prefill(self, max_tokens: int, packed_tokens: int = 0) -> None:
        pass

    def packs_prefill(self, n_tokens: int) -> bool:
        return False

    def prefill_parts(self, parts) -> list[torch.Tensor]:
        return [self.prefill_row for _ in parts]

    def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
        pass  # the prompts share a prefix; the stand-in's logits do not depend on the cache

    def release_pages(self, slot: int, length: int) -> None:
        self.cache.release(slot, length)

    def check_fits(self, n_tokens: int) -> None:
        pass

    def prefill(self, tokens, slot: int = 0, start: int = 0, all_logits: bool = False) -> torch.Tensor:
        return self.prefill_row

    def timed(self, split):
        def greedy_split(logits, plain):
            started = time.thread_time()
            try:
                return split(logits, plain)
            finally:
                if len(plain) == self.cache.n_slots:
                    self.selections.append(time.thread_time() - started)

        return greedy_split

    def decode_batch(self, tokens, positions, slots) -> torch.Tensor:
        loop_cpu = time.clock_gettime(self.loop_clock) if self.loop_clock is not None else 0.0
        self.steps.append((time.perf_counter(), len(tokens), time.thread_time(), loop_cpu))
        self._step += 1
        return self.banks[self._step % BANKS, : len(tokens)]


def client(base_url: str, concurrency: int, rounds: int, max_tokens: int, prompt: list[int], out) -> None:
    """Run in a process of its own (its CPU is not the server's): `rounds` waves of `concurrency`
    streaming greedy completions; puts the streamed texts on `out`."""
    import openai

    async def one(api: openai.AsyncOpenAI, index: int) -> str:
        stream = await api.completions.create(
            model="stand-in",
            prompt=prompt + [index],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def run() -> list[list[str]]:
        api = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=600)
        waves = []
        for _ in range(rounds):
            waves.append(await asyncio.gather(*(one(api, i) for i in range(concurrency))))
        return waves

    out.put(asyncio.run(run()))


def serve_and_drive(args: argparse.Namespace, tokenizer: Tokenizer, concurrency: int) -> dict:
    engine = StandInEngine(tokenizer, concurrency, args.device)
    split = getattr(scheduler_module, "greedy_split", None)  # absent before the device-side greedy
    if split is not None:
        scheduler_module.greedy_split = engine.timed(split)
    settings = ServerSettings("stand-in", max_tokens=args.max_tokens, max_pending=concurrency)
    sock = listen("127.0.0.1", 0)
    server = make_server(settings, lambda: engine, log_level="warning")
    loop = asyncio.new_event_loop()

    def run_server() -> None:
        engine.loop_clock = time.pthread_getcpuclockid(threading.get_ident())
        loop.run_until_complete(server.serve(sockets=[sock]))

    thread = threading.Thread(target=run_server, daemon=True)
    thread.start()
    while not server.started or server.state.runtime is None:
        time.sleep(0.05)
    scheduler = server.state.runtime.scheduler
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    prompt = tokenizer.encode(TEXT)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    profile = cProfile.Profile()

    def in_thread(work) -> None:
        """Run `work` on the profiled thread (cProfile hooks the thread that enables it)."""
        if args.profile == "worker":
            scheduler.call(work).result()
        elif args.profile == "loop":

            async def call() -> None:
                work()

            asyncio.run_coroutine_threadsafe(call(), loop).result()

    # a warm-up wave (imports, first connections), then the measured waves
    for rounds, measured in ((1, False), (args.rounds, True)):
        if measured:
            engine.steps.clear()
            engine.selections.clear()
            in_thread(profile.enable)
        proc = ctx.Process(target=client, args=(base_url, concurrency, rounds, args.max_tokens, prompt, out))
        proc.start()
        waves = out.get()
        proc.join()
    in_thread(profile.disable)
    server.should_exit = True
    thread.join(60)
    if split is not None:
        scheduler_module.greedy_split = split
    texts = {text for wave in waves for text in wave}
    full = [s for s in engine.steps if s[1] == concurrency]
    pairs = list(zip(full, full[1:], strict=False))
    result = {
        "concurrency": concurrency,
        "device": args.device,
        "max_tokens": args.max_tokens,
        "full_steps": len(pairs),
        "step_ms_p50": statistics.median(b[0] - a[0] for a, b in pairs) * 1e3,
        "step_ms_mean": statistics.fmean(b[0] - a[0] for a, b in pairs) * 1e3,
        "worker_cpu_ms_p50": statistics.median(b[2] - a[2] for a, b in pairs) * 1e3,
        "loop_cpu_ms_p50": statistics.median(b[3] - a[3] for a, b in pairs) * 1e3,
        "selection_cpu_ms_p50": statistics.median(engine.selections) * 1e3 if engine.selections else None,
        "distinct_texts": len(texts),
        "chars_per_text": statistics.fmean(len(t) for t in texts),
    }
    if args.profile is not None:
        result["profile"] = _top(profile, args.top)
    return result


def _top(profile: cProfile.Profile, count: int) -> str:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(count)
    return text.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--concurrency", default="16,64", help="comma-separated C values")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("-r", "--rounds", type=int, default=2, help="measured waves of C requests")
    parser.add_argument("--device", default="cpu", help="where the stand-in's logits live (cpu, cuda)")
    parser.add_argument("--vocab", default=str(VOCAB_FILE), help="a GGUF with Qwen's tokenizer")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--profile", choices=("worker", "loop"), help="cProfile one thread (slows it)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_gguf(open_model_file(args.vocab).metadata)
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        result = serve_and_drive(args, tokenizer, concurrency)
        profile = result.pop("profile", None)
        print(json.dumps(result), flush=True)
        if profile is not None:
            print(f"--- {args.profile} thread, C={concurrency} ---\n{profile}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
