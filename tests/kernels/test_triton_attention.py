"""The decode-attention kernels against the torch reference (`gufo.kernels.attention`): in the Triton
interpreter on CPU (small odd shapes, a worker subprocess: see triton_interpreter.py) and on real
shapes on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.kernels import registry
from gufo.kernels.attention import ReferenceAttentionDecode, attend_entries
from gufo.kernels.catalog import register_all
from gufo.kernels.contracts import ATTENTION_DECODE
from gufo.kernels.kv_pages import KVPages

pytest.importorskip("triton")

from kv_paging import paged  # noqa: E402

from gufo.kernels.triton import attention as attention_kernels  # noqa: E402  (needs triton)
from gufo.kernels.triton import gemv_int8  # noqa: E402
from gufo.kernels.triton.attention import TritonAttentionDecode  # noqa: E402
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

LAUNCH = DependentLaunch(enabled=True)  # dependent launches where the device has them (never here)
DECODE = TritonAttentionDecode(LAUNCH)

# (query heads, KV heads, head dim, cache entries given, query positions, window): SmolLM2's, gemma3's
# (sliding window) and qwen3's head layouts; positions below the cache length (a captured graph's
# case); several tokens in one launch (speculative verification)
SHAPES = [
    (9, 3, 64, 40, (39,), None),
    (4, 1, 256, 70, (69,), 16),
    (32, 8, 128, 300, (150,), None),
    (16, 8, 128, 1, (0,), None),
    (4, 1, 256, 513, (400,), 512),
    (9, 3, 64, 600, (250, 255, 256, 257, 300), None),
    (4, 1, 256, 600, (254, 255, 256, 511, 512), 16),
]
PAGES = (16, 64)  # positions per page: shorter than a key tile (a tile spans pages), and the cache's
FLOAT32_TOL = {"rtol": 1e-5, "atol": 1e-5}
FEWER_PROGRAMS = 16  # per token: 2, 5 and 16 ranges per KV head on SHAPES 2, 5 and 6


def decode_inputs(shape: tuple, cache_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q [T, H, D], one slot's keys and values [Hkv, entries, D] and the positions of a SHAPES row."""
    heads, kv_heads, dim, entries, positions, window = shape
    gen = torch.Generator().manual_seed(entries * heads)
    q = torch.randn(len(positions), heads, dim, generator=gen)
    keys = torch.randn(kv_heads, entries, dim, generator=gen).to(cache_dtype)
    values = torch.randn(kv_heads, entries, dim, generator=gen).to(cache_dtype)
    if len(positions) == 1:
        keys[:, positions[0] + 1 :] = 3e4  # stale entries past the position must not count
        values[:, positions[0] + 1 :] = -3e4
    return q, keys, values, torch.tensor(positions)


def check_decode(
    shape: tuple, cache_dtype: torch.dtype, programs: int, device: str = "cpu", page_size: int = 64
) -> None:
    """Against the float64 reference over the slot's entries in order; each token of a several-token
    launch gives exactly what it gives alone, and the same bits whatever pages hold the entries."""
    heads, kv_heads, dim, entries, positions, window = shape
    q, keys, values, at = decode_inputs(shape, cache_dtype)
    want = attend_entries(q.double(), keys.double(), values.double(), at, dim**-0.5, window)
    q, at = q.to(device), at.to(device)
    pages = paged(keys[None].to(device), values[None].to(device), page_size, seed=entries)
    got = DECODE.apply(q, pages, at, 0, dim**-0.5, window, programs=programs)
    assert got.shape == (len(positions), heads * dim) and got.dtype == torch.float32
    torch.testing.assert_close(got.double().cpu(), want, **FLOAT32_TOL)
    elsewhere = paged(keys[None].to(device), values[None].to(device), page_size, seed=entries + 1)
    assert torch.equal(DECODE.apply(q, elsewhere, at, 0, dim**-0.5, window, programs=programs), got)
    for i in range(len(positions)):
        alone = DECODE.apply(q[i : i + 1], pages, at[i : i + 1], 0, dim**-0.5, window, programs=programs)
        assert torch.equal(alone[0], got[i]), (shape, i)


def check_int8_output(shape: tuple, device: str = "cpu", programs: int = FEWER_PROGRAMS) -> None:
    """With `int8` (the output projection's input, quantized as the combine kernel writes it): bit for
    bit the float output through the separate quantizer, itself bit for bit the torch oracle."""
    q, keys, values, at = (t.to(device) for t in decode_inputs(shape, torch.float16))
    args = (q, paged(keys[None], values[None], 64, seed=1), at, 0, shape[2] ** -0.5, shape[5])
    plain = DECODE.apply(*args, programs=programs)
    fused = DECODE.apply(*args, True, programs=programs)
    for mine, oracle in zip(fused, gemv_int8.quantize_rows(plain, LAUNCH), strict=True):
        assert torch.equal(mine, oracle)


def check_slots(device: str = "cpu", programs: int = FEWER_PROGRAMS, page_size: int = 16) -> None:
    """One launch over the pages of four slots, token t reading slot slots[t] (a step of several
    sequences): each token bit for bit what it gives alone, and close to the float64 reference over its
    own slot's entries in order; plain and as int8 rows."""
    heads, kv_heads, dim, entries = 9, 3, 64, 300
    gen = torch.Generator().manual_seed(5)
    cache = [torch.randn(4, kv_heads, entries, dim, generator=gen).half().to(device) for _ in range(2)]
    pages = paged(*cache, page_size, seed=3)
    slots, positions = torch.tensor([2, 0, 3]), torch.tensor([299, 10, 150])
    q = torch.randn(3, heads, dim, generator=gen).to(device)
    at, rows = positions.to(device), slots.to(device)
    got = DECODE.apply(q, pages, at, rows, dim**-0.5, None, programs=programs)
    for t, slot in enumerate(slots.tolist()):
        own = (c[slot].double().cpu() for c in cache)
        want = attend_entries(q[t : t + 1].double().cpu(), *own, positions[t : t + 1], dim**-0.5, None)
        torch.testing.assert_close(got[t : t + 1].double().cpu(), want, **FLOAT32_TOL)
    quantized = DECODE.apply(q, pages, at, rows, dim**-0.5, None, True, programs=programs)
    for t, slot in enumerate(slots.tolist()):
        one = (q[t : t + 1], pages, at[t : t + 1], slot, dim**-0.5, None)
        assert torch.equal(DECODE.apply(*one, programs=programs)[0], got[t]), t
        alone = DECODE.apply(*one, True, programs=programs)
        for mine, oracle in zip(quantized, alone, strict=True):
            assert torch.equal(mine[t], oracle[0]), t


def test_reference_reads_each_slot_through_its_pages():
    """The torch reference (the CPU's decode attention) over shuffled pages of two slots equals the
    float64 attention over each slot's entries in order."""
    gen = torch.Generator().manual_seed(2)
    cache = [torch.randn(2, 2, 50, 16, generator=gen).double() for _ in range(2)]
    pages = paged(*cache, 16, seed=4)
    q, positions = torch.randn(2, 4, 16, generator=gen).double(), torch.tensor([49, 17])
    got = ReferenceAttentionDecode.apply(q, pages, positions, torch.tensor([1, 0]), 0.25, None)
    for t, slot in enumerate((1, 0)):
        want = attend_entries(q[t : t + 1], cache[0][slot], cache[1][slot], positions[t : t + 1], 0.25, None)
        torch.testing.assert_close(got[t : t + 1], want)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {"slots": check_slots}
    for shape in SHAPES:
        for programs, page_size in ((1, 64), (64, 16)):  # one range per KV head, and several (combined)
            name = f"{shape}-float16-p{programs}-page{page_size}".replace(" ", "")
            cases[name] = lambda s=shape, p=programs, g=page_size: check_decode(s, torch.float16, p, "cpu", g)
    # on the layouts that differ most (several tokens across a span boundary, a sliding window, GQA 4:1):
    # more ranges than the combine kernel holds at once (it loops over them), the elementwise products
    # AMD runs instead of tl.dot, and the int8 output; with fewer programs than the cases above (each
    # still splits every KV head's span into ranges and combines them), as the interpreter's time grows
    # with the programs
    for shape in (SHAPES[2], SHAPES[5], SHAPES[6]):
        cases[f"{shape}-combine-loop".replace(" ", "")] = lambda s=shape: combine_in_steps(s)
        cases[f"{shape}-elementwise".replace(" ", "")] = lambda s=shape: elementwise_products(s)
        cases[f"{shape}-int8".replace(" ", "")] = lambda s=shape: check_int8_output(s)
    return cases


def elementwise_products(shape: tuple) -> None:
    chosen = attention_kernels.use_dot
    attention_kernels.use_dot = lambda: False
    try:
        check_decode(shape, torch.float16, FEWER_PROGRAMS)
    finally:
        attention_kernels.use_dot = chosen


def combine_in_steps(shape: tuple) -> None:
    held = attention_kernels.COMBINE_SPLITS
    attention_kernels.COMBINE_SPLITS = 2
    try:  # four ranges per KV head: the combine kernel takes them in two steps
        check_decode(shape, torch.float16, 4 * shape[1])
    finally:
        attention_kernels.COMBINE_SPLITS = held


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_decode_checks_its_operands():
    """Shapes, dtypes and devices are checked before any launch: each mismatch is an error naming it."""
    q, pool = torch.zeros(1, 4, 64), torch.zeros(2, 3, 16, 64, dtype=torch.float16)
    table, index = torch.ones(1, 2, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)

    def pages(keys: torch.Tensor = pool, values: torch.Tensor = pool, rows: torch.Tensor = table) -> KVPages:
        return KVPages(keys, values, rows)

    with pytest.raises(ValueError, match="q: 3 dimensions expected"):
        DECODE.apply(q[0], pages(), index, 0, 0.125, None)
    with pytest.raises(TypeError, match="keys: dtype float32"):  # the cache is float16 on GPUs
        DECODE.apply(q, pages(pool.float()), index, 0, 0.125, None)
    with pytest.raises(TypeError, match="index: dtype int32"):
        DECODE.apply(q, pages(), index.int(), 0, 0.125, None)
    with pytest.raises(TypeError, match="table: dtype int32"):
        DECODE.apply(q, pages(rows=table.int()), index, 0, 0.125, None)
    with pytest.raises(ValueError, match="index entries \\(one per token\\): 2, expected 1"):
        DECODE.apply(q, pages(), torch.zeros(2, dtype=torch.int64), 0, 0.125, None)
    with pytest.raises(ValueError, match="keys' head width: 32, expected 64"):
        DECODE.apply(q, pages(pool[..., :32]), index, 0, 0.125, None)
    with pytest.raises(ValueError, match="4 query heads do not share 3 KV heads evenly"):
        kv3 = torch.zeros(3, 3, 16, 64, dtype=torch.float16)
        DECODE.apply(q, pages(kv3, kv3), index, 0, 0.125, None)
    with pytest.raises(ValueError, match="values is on meta, expected cpu"):
        DECODE.apply(q, pages(values=pool.to("meta")), index, 0, 0.125, None)
    with pytest.raises(ValueError, match="keys: 4 dimensions expected"):
        DECODE.apply(q, pages(pool[0]), index, 0, 0.125, None)
    with pytest.raises(ValueError, match="slots entries \\(one per token\\): 2, expected 1"):
        DECODE.apply(q, pages(), index, torch.zeros(2, dtype=torch.int64), 0.125, None)


def test_split_programs_spread_many_tokens_over_fewer_programs():
    """A token alone gets a program per range; tokens sharing a launch get fewer, each taking several of
    its ranges in turn (the interpreter cases above compare tokens alone with the same tokens launched
    together: 21 programs a KV head alone against 4 together on SHAPES[5] at 64 programs, 5 against 1 in
    `check_slots`), down to one per (KV head, token) for a 64-row decode step on Qwen3-8B's heads."""
    split_programs = attention_kernels.split_programs
    assert split_programs(21, 3, 1, 64) == 21 and split_programs(21, 3, 5, 64) == 4
    assert split_programs(5, 3, 1, 16) == 5 and split_programs(5, 3, 3, 16) == 1
    assert split_programs(33, 8, 1, 264) == 33 and split_programs(33, 8, 16, 264) == 2
    assert split_programs(33, 8, 64, 264) == 1


def test_registered_on_cuda_backend():
    register_all("cuda")
    route, kernel = registry.lookup("cuda", ATTENTION_DECODE)
    assert route == "cuda" and isinstance(kernel, TritonAttentionDecode)


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [1, 4096, 32768])
def test_gpu_real_shapes(depth):
    """Qwen3-8B heads (32 query, 8 KV, 128 wide) over a float16 cache up to depth, default split."""
    check_decode((32, 8, 128, depth + 256, (depth,), None), torch.float16, 0, "cuda")
    check_decode((4, 1, 256, depth + 256, (depth,), 512), torch.float16, 0, "cuda")  # gemma3 sliding window
    drafts = tuple(range(depth + 250, depth + 260))  # verification across a span boundary
    check_decode((32, 8, 128, depth + 512, drafts, None), torch.float16, 0, "cuda")
    check_int8_output((32, 8, 128, depth + 512, drafts, None), "cuda", programs=64)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("tokens,entries", [(7, 7), (5, 23), (64, 300)])
def test_prefill_causal_lower_right_equals_masked(device, tokens, entries):
    """The GPU prefill route (fused kernels, causal mask aligned to the last key) against the masked
    reference: queries are the last `tokens` of `entries` cache entries, 12 query heads on 4 KV heads."""
    from gufo.kernels.attention import FusedAttentionPrefill, ReferenceAttentionPrefill

    gen = torch.Generator().manual_seed(tokens)
    dtype = torch.float16 if device == "cuda" else torch.float32
    q = torch.randn(tokens, 12, 64, generator=gen).to(device)
    keys, values = (torch.randn(4, entries, 64, generator=gen).to(device, dtype) for _ in range(2))
    want = ReferenceAttentionPrefill.apply(q, keys, values, 0, 0.125, None)
    got = FusedAttentionPrefill.apply(q, keys, values, 0, 0.125, None)
    tol = {"rtol": 2e-3, "atol": 2e-3} if device == "cuda" else FLOAT32_TOL
    torch.testing.assert_close(got, want, **tol)
    if device == "cuda":  # the flash kernel takes the KV heads as they are (no materialised mask)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            torch.testing.assert_close(FusedAttentionPrefill.apply(q, keys, values, 0, 0.125, None), got)


@pytest.mark.gpu
def test_gpu_slots():
    check_slots("cuda", 0)  # the default split: several ranges per KV head
