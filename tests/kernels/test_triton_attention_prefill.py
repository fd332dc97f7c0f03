"""The prefill attention on fixed tiles (attention_prefill.py): against a float64 oracle within the float16
operands' rounding, and every query row bit for bit the same whatever chunk of its prompt it comes in
(where the chunk starts, how long it is, which tile holds the row). In the Triton interpreter on the CPU
(a worker subprocess: triton_interpreter.py), and on real shapes on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.kernels import registry
from gufo.kernels.attention import FusedAttentionPrefill
from gufo.kernels.catalog import register_all
from gufo.kernels.contracts import ATTENTION_PREFILL
from gufo.options import KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton import attention_prefill  # noqa: E402  (needs triton)
from gufo.kernels.triton.attention_prefill import TritonAttentionPrefill  # noqa: E402

SMALL_TILES = (16, 16, 4, 1)  # the interpreter's: several row tiles and key blocks on small prompts
# (query heads, KV heads, head width, prompt length, window): GQA with a head width below its power of two,
# and a sliding window shorter than a chunk
SHAPES = [(4, 2, 24, 45, None), (6, 3, 32, 53, 10)]
# chunkings of a prompt: where its chunks start after the first (each chunk's rows in tiles of their own)
CUTS = [(7, 20), (1, 2, 33), (16, 17, 40)]


def prompt(shape: tuple, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt's queries [L, H, D] (float32) and its cache entries, keys and values [Hkv, L, D]
    (float16)."""
    heads, kv_heads, dim, length, _ = shape
    gen = torch.Generator().manual_seed(length * heads + dim)
    q = torch.randn(length, heads, dim, generator=gen) * 2
    keys = torch.randn(kv_heads, length, dim, generator=gen).half()
    values = torch.randn(kv_heads, length, dim, generator=gen).half()
    return q.to(device), keys.to(device), values.to(device)


def chunk_call(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, begin: int, end: int, window: int | None,
    kernel: Callable, **options: object,
) -> torch.Tensor:  # fmt: skip
    """The attention of the prompt's rows begin..end - 1 as a prefill chunk gets it (`attend_cached`:
    the entries from the first its rows see up to its end)."""
    first = 0 if window is None else max(0, begin - window + 1)
    return kernel(
        q[begin:end], keys[:, first:end], values[:, first:end], first, q.shape[-1] ** -0.5, window, **options
    )


def oracle(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None) -> torch.Tensor:
    """float64 causal (windowed) GQA attention of every row, queries rounded to float16 as the tiles take
    them: [L, H * D]."""
    length, heads, dim = q.shape
    group = heads // keys.shape[0]
    k = keys.double().repeat_interleave(group, 0)  # [H, L, D]
    v = values.double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hsd->hts", q.half().double(), k) * dim**-0.5
    pos = torch.arange(length)
    seen = pos[None, :] <= pos[:, None]
    if window is not None:
        seen &= pos[None, :] > pos[:, None] - window
    probs = torch.softmax(scores.masked_fill(~seen.to(q.device), float("-inf")), dim=-1)
    return torch.einsum("hts,hsd->thd", probs, v).reshape(length, -1)


def check_chunk_invariant(shape: tuple, tiles: tuple | None = SMALL_TILES, device: str = "cpu") -> None:
    """The whole prompt in one call, then in the chunkings of CUTS: every row bit for bit the one call's;
    and within the float16 rounding of the float64 oracle (probabilities rounded to float16 before the
    values' product: a few units of 2^-11 of the largest value)."""
    *_, length, window = shape
    q, keys, values = prompt(shape, device)
    whole = chunk_call(q, keys, values, 0, length, window, TritonAttentionPrefill.apply, tiles=tiles)
    assert whole.shape == (length, q.shape[1] * values.shape[-1]) and whole.dtype == torch.float32
    for cuts in CUTS:
        edges = [0, *cuts, length]
        pieces = [
            chunk_call(q, keys, values, a, b, window, TritonAttentionPrefill.apply, tiles=tiles)
            for a, b in zip(edges, edges[1:], strict=False)
        ]
        chunked = torch.cat(pieces)
        differ = (chunked != whole).any(-1).nonzero().flatten().tolist()
        assert not differ, f"chunks from {cuts}: rows {differ} differ from the whole prompt's"
    error = (whole.double() - oracle(q, keys, values, window)).abs().max().item()
    assert error <= 4 * 2**-11 * values.abs().max().item(), error


def check_refuses_operands() -> None:
    q, keys, values = prompt(SHAPES[0])
    with pytest.raises(TypeError, match="keys"):
        TritonAttentionPrefill.apply(q, keys.float(), values, 0, 0.1, None)
    with pytest.raises(ValueError, match="share"):
        TritonAttentionPrefill.apply(q[:, :3], keys, values, 0, 0.1, None)
    with pytest.raises(ValueError, match="46 queries over 45 entries"):
        TritonAttentionPrefill.apply(torch.cat([q, q[:1]]), keys, values, 0, 0.1, None)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for shape in SHAPES:
        cases[f"chunk_invariant-{shape}"] = lambda shape=shape: check_chunk_invariant(shape)
    cases["refuses_operands"] = check_refuses_operands
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_registered_with_the_tile_products_only():
    """The tiles attend where the products are the fixed tiles (`--prefill-products tiles`: what packs and
    caches prompts at any boundary); else torch's flash kernel, also after the tiles were registered."""
    for options, kind, invariant in (
        (KernelOptions(prefill_products="tiles"), TritonAttentionPrefill, True),
        (KernelOptions(), FusedAttentionPrefill, False),
    ):
        register_all("cuda", options)
        route, kernel = registry.lookup("cuda", ATTENTION_PREFILL)
        assert route == "cuda" and isinstance(kernel, kind) and kernel.chunk_invariant == invariant


def test_tiles_by_head_width():
    assert attention_prefill.tiles_for(64)[1] == 64 and attention_prefill.tiles_for(256)[1] == 32
    with pytest.raises(ValueError, match="up to 256 wide, got 512"):
        attention_prefill.tiles_for(512)


# --------------------------------------------------------------------------------------------------
# the compiled kernel on a GPU, on real models' heads (skipped without one)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape", [(32, 8, 128, 1500, None), (4, 1, 256, 1300, 512), (9, 3, 64, 700, None)], ids=str
)
def test_gpu_chunk_invariant_real_heads(shape):
    """Qwen3-8B's, gemma3's sliding-window and SmolLM2's heads on their own launch tiles; and close to
    torch's flash kernel (what `--prefill-products cublas` attends with) on the whole prompt."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    check_chunk_invariant(shape, None, "cuda")
    *_, length, window = shape
    q, keys, values = prompt(shape, "cuda")
    got = chunk_call(q, keys, values, 0, length, window, TritonAttentionPrefill.apply)
    flash = chunk_call(q, keys, values, 0, length, window, FusedAttentionPrefill.apply)
    torch.testing.assert_close(got, flash, rtol=2e-3, atol=2e-3)
