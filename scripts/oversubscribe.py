"""Oversubscription of a running server (issue 23, acceptance 4, on a GPU): `--factor` x `--sessions`
greedy completions at once, through the official `openai` client. Every request must complete with the
text the same request got alone before, or get a 429; nothing else. Afterwards the same request alone
must still give that text, and the server process's resident memory (`--pid`, from /proc) and the GPU
memory in use (nvidia-smi) must be back at their idle level before the burst (within `--slack-mib`).
Prints one JSON object and exits 0 when every condition holds, else 1.

    gufo serve -m 8B.gguf --device cuda --sessions 64 --max-pending 64 --port 8090 &
    python scripts/oversubscribe.py --base-url http://127.0.0.1:8090 --sessions 64 --factor 8 --pid $!
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import openai

PROMPT = "Write three sentences about the sea, the wind and the harbour at night."


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024


def gpu_mib() -> float:
    """GPU memory in use (MiB); 0 on a machine without nvidia-smi (a CPU server)."""
    if shutil.which("nvidia-smi") is None:
        return 0.0
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--sessions", type=int, required=True, help="the server's --sessions")
    parser.add_argument("--factor", type=int, default=8, help="requests at once per session (default 8)")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (its RSS)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slack-mib", type=float, default=256.0, help="allowed growth over idle (MiB)")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to wait for memory to settle")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id

    def greedy() -> str:
        reply = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=args.max_tokens, temperature=0
        )
        return reply.choices[0].text

    reference = greedy()
    idle = {"rss_mib": rss_mib(args.pid), "gpu_mib": gpu_mib()}
    count = args.factor * args.sessions
    outcomes: list[tuple[int, str | None]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(count)

    def one() -> None:
        barrier.wait()
        try:
            text = greedy()
            outcome = (200, None if text == reference else "text differs")
        except openai.APIStatusError as err:
            outcome = (err.status_code, None)
        except openai.APIError as err:  # no response at all: a dropped connection or a timeout
            outcome = (0, type(err).__name__)
        with lock:
            outcomes.append(outcome)

    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    statuses = Counter(status for status, _ in outcomes)
    differing = sum(1 for status, problem in outcomes if status == 200 and problem is not None)
    after_text_ok = greedy() == reference
    deadline = time.perf_counter() + args.settle
    while True:
        after = {"rss_mib": rss_mib(args.pid), "gpu_mib": gpu_mib()}
        settled = all(after[key] <= idle[key] + args.slack_mib for key in idle)
        if settled or time.perf_counter() > deadline:
            break
        time.sleep(2)
    ok = set(statuses) <= {200, 429} and statuses[200] > 0 and not differing and after_text_ok and settled
    report = {
        "requests": count,
        "seconds": round(seconds, 2),
        "statuses": {str(status): n for status, n in sorted(statuses.items())},
        "completed_with_other_text": differing,
        "alone_afterwards_same_text": after_text_ok,
        "idle": idle,
        "after": after,
        "memory_back_to_idle": settled,
        "pass": ok,
    }
    print(json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
