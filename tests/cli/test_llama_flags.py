"""llama.cpp's habits on gufo's command line: the flags that mean something here do it (`-ngl`, `-f`,
`-n -1`, `-r`, `-fa`, `-ctk`/`-ctv`, `--no-mmap`, `--mlock`), the rest is refused by name in one line
(exit 2), and so is every bad input the issue found. Expected ids and texts are llama.cpp's goldens."""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import subprocess
import sys

import pytest

from gufo.cli.compat import device
from gufo.cli.main import build_parser
from tests.cli.test_startup import TESTS, without_torch
from tests.conftest import HANG_GUARD_S, golden, gufo

MODEL = "smollm2-135m"


def run_args(*flags: str):
    return build_parser("run").parse_args(["run", "-p", "x", *flags])


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["-ngl", "99"], "cuda"),
        (["-ngl", "all"], "cuda"),
        (["-ngl", "0"], "cpu"),
        ([], "cpu"),
        (["--device", "cuda:1", "--n-gpu-layers", "1"], "cuda:1"),
    ],
)
def test_gpu_layers_pick_the_device(flags, expected):
    assert device(run_args(*flags)) == expected


@pytest.mark.parametrize(
    "flags,line",
    [
        (["--device", "cpu", "-ngl", "99"], "gufo: error: -ngl 99 contradicts --device cpu"),
        (["-fa", "off"], "gufo: error: -fa off: gufo's attention is always fused; it has no other path"),
        (
            ["-ctk", "q8_0"],
            "gufo: error: -ctk q8_0: gufo has no quantized KV cache "
            "(its cache is f32 on the CPU, f16 on GPUs)",
        ),
        (["-f", "missing.txt"], "gufo: error: --file missing.txt: cannot read: No such file or directory"),
        (["-r", ""], "gufo: error: --reverse-prompt: empty text"),
    ],
)
def test_what_gufo_cannot_do_is_one_line_before_loading(capsys, tmp_path, monkeypatch, flags, line):
    monkeypatch.chdir(tmp_path)
    source = [] if "-f" in flags else ["-p", "hi"]
    code, out, err = gufo(capsys, "run", "-m", "no-such-model", *source, *flags)  # nothing loads
    assert (code, out, err.splitlines()) == (2, "", [line])


def test_accepted_flags_parse_whole():
    args = run_args("-fa", "-ctk", "f16", "-ctv", "f32", "--no-mmap", "--mlock", "-ngl", "0")
    assert (args.flash_attn, args.cache_type_k, args.cache_type_v, args.no_mmap, args.mlock) == (
        "on", "f16", "f32", True, True,
    )  # fmt: skip
    assert build_parser("run").parse_args(["run", "-p", "x", "-fa", "auto"]).flash_attn == "auto"


def short_prompt() -> dict:
    return next(p for p in golden(MODEL)["prompts"] if p["id"] == "short_en")


@pytest.mark.parametrize("n_predict", ["-1", "100000000"])
def test_n_predict_fills_the_context_and_no_more(capsys, tmp_path, n_predict):
    """-n -1 generates until the context is full; a larger -n does the same, with a warning (it said
    that a prompt of 100000001 tokens did not fit). The prompt comes from a file (-f)."""
    prompt = short_prompt()
    context, prompt_length = 16, len(prompt["prompt_ids"])
    room = context - prompt_length + 1  # the last token is sampled from logits, never decoded
    (tmp_path / "prompt.txt").write_text(prompt["prompt"], encoding="utf-8")
    code, out, err = gufo(capsys, "run", "-m", MODEL, "-f", str(tmp_path / "prompt.txt"), "-n", n_predict,
                          "-c", str(context), "--temp", "0", "--ignore-eos", "-t", "1")  # fmt: skip
    assert code == 0 and out
    warning = (
        f"gufo: warning: -n {n_predict} does not fit the context: {prompt_length} of its {context} tokens "
        f"are the prompt, so at most {room} are generated (-c sets the context)"
    )
    lines = err.splitlines()
    assert lines[:-1] == ([] if n_predict == "-1" else [warning])
    assert lines[-1].startswith(f"prompt: {prompt_length} tokens, ")
    assert f"| generation: {room} tokens, " in lines[-1]


def trace_of(ids: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def test_reverse_prompt_stops_where_its_text_appears_and_no_mmap_reads_the_same(capsys):
    """Greedy decoding of the golden prompt, read into memory (--no-mmap), stops at the token whose text
    completes the reverse prompt: the golden ids up to it, and the golden text up to it."""
    prompt = next(p for p in golden(MODEL)["prompts"] if p["id"] == "list")
    margins = prompt["greedy_top1_minus_top2"]
    robust = next(i for i, m in enumerate(margins) if m < 0.5)  # llama.cpp's greedy path is unambiguous
    text = prompt["greedy_text"]
    reverse = "4."  # the list's fourth item, inside the robust prefix (checked below)
    end = text.index(reverse) + len(reverse)
    code, out, err = gufo(capsys, "run", "-m", MODEL, "-p", prompt["prompt"], "-n", "32", "--temp", "0",
                          "-r", reverse, "--no-mmap", "--verbose", "-t", "1")  # fmt: skip
    assert code == 0
    assert text.startswith(out[:-1]) and out[:-1].endswith(text[:end][-len(reverse) :])
    count = int(err.split("[TokenTrace]: count=")[1].split()[0])
    assert count <= robust
    assert f"[TokenTrace]: count={count} sha256={trace_of(prompt['greedy_ids'][:count])}" in err


def test_threads_beyond_the_cores_warn(capsys):
    cores = len(os.sched_getaffinity(0))
    code, _, err = gufo(capsys, "run", "-m", "no-such-model", "-p", "x", "-t", "999")
    assert code == 2
    assert err.splitlines()[0] == (
        f"gufo: warning: -t 999 exceeds the {cores} CPU cores this process may use: expect it to run slower"
    )


LOCK_UNDER_NO_LIMIT = """
import resource
resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
from gufo.cli.compat import lock_memory
lock_memory()
print(next(line for line in open("/proc/self/status") if line.startswith("VmLck:")).split()[1])
"""


def test_mlock_locks_the_memory_or_warns_that_it_could_not():
    """With no lockable memory allowed, mlockall fails (EPERM) and --mlock warns; a process that may lock
    regardless (root, CAP_IPC_LOCK) has its pages locked: the kernel's VmLck counts them."""
    done = subprocess.run([sys.executable, "-c", LOCK_UNDER_NO_LIMIT], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0, done.stderr
    refused = f"--mlock: the system refused to lock the model in RAM: {os.strerror(errno.EPERM)}"
    if int(done.stdout) == 0:
        assert refused in done.stderr
    else:
        assert done.stderr == ""


def test_not_a_reference_is_named_without_numpy_advice(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("some notes\n")
    code, _, err = gufo(capsys, "quality", "-m", "no-such-model", "--reference", "notes.txt")
    assert code == 2
    assert err.splitlines() == [
        "gufo: error: --reference notes.txt: not a gufo reference logits file "
        "(`gufo quality --save-logits` writes one)"
    ]


def test_compare_names_the_missing_run(capsys, tmp_path):
    present = TESTS / "bench/fixtures/llamabench_a.json"
    code, _, err = gufo(capsys, "compare", str(present), str(tmp_path / "missing.json"))
    assert code == 2
    assert err.splitlines() == [
        f"gufo: error: {tmp_path / 'missing.json'}: cannot read: No such file or directory"
    ]


def test_kernels_own_without_triton_says_what_to_install():
    done = without_torch("kernels", "own", "--target", "sm_80")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "gufo: error: kernels own compiles gufo's Triton kernels: install Triton (pip install triton)"
    ]
