"""`gufo kernels own`: gufo's Triton kernels compiled on the CPU for gfx1151 and sm_90, checked against the
committed allowance, against the kernels the launch code declares, and against the compilers' own output
kept beside each binary (the AMD assembly's metadata, NVIDIA's cuobjdump, Triton's metadata JSON)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernres_oracles import run_cli

from tests.conftest import HANG_GUARD_S

triton = pytest.importorskip("triton")

from triton.runtime.jit import JITFunction  # noqa: E402

from gufo.cli import main as cli_main  # noqa: E402
from gufo.kernels.triton import (  # noqa: E402
    attention,
    attention_prefill,
    codebook_dequant,
    elementwise,
    experts_prefill,
    gemv_int8,
    gemv_kernels,
    offline,
    prefill_tiles,
    recurrent,
    routing,
    rows_int8,
)

ALLOWANCE = Path(gemv_kernels.__file__).with_name("allowance.json")
TARGETS = ("gfx1151", "sm_90")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
# Once each, in their first launch configuration: the codebook formats' kernels (IQ*), the legacy
# formats' (Q4_0, Q4_1, Q5_0) and the float weights' (F32, F16, BF16); every configuration of the K-quant
# and Q8_0 kernels, attention and the elementwise kernels. All of them (`gufo kernels own` without the
# flag) add the bandwidth sweep's candidates (labels sweep_*: decode_candidates), the grouped expert
# products (labels experts_*) and every configuration of the other formats (docs/decisions.md, "The
# CI's own check").
FIRST_ONLY = tuple(
    arg for glob in ("*_iq*", "*_q4_0*", "*_q4_1*", "*_q5_0*", "*_float*") for arg in ("--first-only", glob)
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Both targets in one process, two compile workers; the cache is kept for the --baseline run."""
    keep = tmp_path_factory.mktemp("own")
    argv = ["kernels", "own", "--json", "--keep", str(keep), "--jobs", "2", *FIRST_ONLY]
    code, out, err = _cli(*argv, *(a for t in TARGETS for a in ("--target", t)))
    assert code == 0, err
    return keep, json.loads(out)


def _cli(*argv: str) -> tuple[int, str, str]:
    """The real entry point (it imports only the `kernels` command); capsys is per test, this fixture is
    per module."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _key(k: dict) -> str:
    return f"{k['arch']}/{k['name']}"


def _binary(k: dict) -> Path:
    return Path(k["file"]) / k["container"].removeprefix("triton:")


def test_committed_allowance_passes(compiled):
    keep, _ = compiled
    targets = [a for t in TARGETS for a in ("--target", t)]
    code, out, err = _cli(
        "kernels", "own", "--keep", str(keep), "--baseline", str(ALLOWANCE), *FIRST_ONLY, *targets
    )
    assert code == 0, out + err
    assert out.rstrip().splitlines()[-1].startswith("OK: ")


def test_no_kernel_spills_or_uses_scratch(compiled):
    _, kernels = compiled
    spilling = {_key(k) for k in kernels if k.get("scratch_bytes", k.get("stack_frame_bytes"))}
    spilling |= {
        _key(k) for k in kernels if k.get("vgpr_spill") or k.get("sgpr_spill") or k.get("local_bytes")
    }
    assert spilling == set()


def test_compiled_set_is_what_the_launch_code_declares(compiled):
    _, kernels = compiled
    public = {
        name
        for module in (
            gemv_kernels,
            codebook_dequant,
            experts_prefill,
            gemv_int8,
            rows_int8,
            attention,
            attention_prefill,
            elementwise,
            recurrent,
            routing,
            prefill_tiles,
        )
        for name, obj in vars(module).items()
        if isinstance(obj, JITFunction) and not name.startswith("_") and obj.fn.__module__ == module.__name__
    }
    engine = {f.kernel.__name__ for f in gemv_kernels.FORMATS.values()} | {
        f.dequant_kernel.__name__ for f in gemv_kernels.FORMATS.values()
    }
    dot = {f.dot_kernel.__name__ for f in gemv_kernels.FORMATS.values()}
    engine |= {"attention_decode_split", "attention_decode_combine"}
    engine |= {"rms_norm_rows", "add_rms_norm_rows", "rope_rows", "rms_norm_rope_rows", "gated_act_rows"}
    engine.add("gated_rms_norm_rows")
    engine.add("attention_heads_to_cache")
    engine |= {"causal_conv_step", "gated_delta_rule_step"}
    engine |= {"moe_route_rows", "moe_combine_rows"}
    # NVIDIA multiplies float32 activations of these formats on int8 (dp4a) for large weights, and
    # rounds their prefill activations to the same int8 values; smaller weights keep the vector kernels
    # (KernelOptions.int8_min_weights, own_fixtures.SMALL_SHAPES)
    int8 = {k.__name__ for k in gemv_int8.KERNELS.values()} | {"quantize_rows_q8", "round_rows_q8"}
    # and on int8 tensor cores with KernelOptions.row_products = "tensor" (own_fixtures compiles them
    # whatever the options)
    int8 |= {k.__name__ for k in rows_int8.KERNELS.values()}
    # the grouped expert products of a prefill, on the tensor cores
    dot |= {k.__name__ for k in experts_prefill.KERNELS.values()}
    # KernelOptions.prefill_products = "tiles" (NVIDIA): the products, their split sums, their attention
    dot |= {prefill_tiles.dense_tiles.__name__, prefill_tiles.tile_split_sums.__name__}
    dot.add(attention_prefill.attention_prefill_tiles.__name__)
    assert public == engine | dot | int8
    # no tensor-core or dp4a path on ROCm
    for target, want in (("gfx1151", public - dot - int8), ("sm_90", public)):
        symbols = {_binary(k).stem for k in kernels if k["arch"] == target}
        assert symbols == want
        names = [k["name"] for k in kernels if k["arch"] == target]
        assert len(names) == len(set(names)) and all(n.split("[")[0] in want for n in names)


def test_amd_fields_match_the_compilers_assembly_and_triton_metadata(compiled):
    _, kernels = compiled
    amd = [k for k in kernels if k["vendor"] == "amd"]
    assert amd
    for k in amd:
        binary = _binary(k)
        text = binary.with_suffix(".amdgcn").read_text()
        notes = dict(re.findall(r"^\s+\.(\w+):\s+(\d+)$", text.split(".amdgpu_metadata")[1], re.M))
        meta = json.loads(binary.with_suffix(".json").read_text())
        assert k["vgpr"] + k["agpr"] == int(notes["vgpr_count"]), k["name"]
        assert k["sgpr"] == int(notes["sgpr_count"]), k["name"]
        assert k["scratch_bytes"] == int(notes["private_segment_fixed_size"]), k["name"]
        assert k["vgpr_spill"] == int(notes["vgpr_spill_count"]), k["name"]
        assert k["max_flat_workgroup_size"] == meta["num_warps"] * meta["warp_size"], k["name"]
        assert k["wavefront_size"] == meta["warp_size"] == 32


def test_nvidia_fields_match_cuobjdump_and_triton_metadata(compiled):
    _, kernels = compiled
    nvidia = [k for k in kernels if k["vendor"] == "nvidia"]
    assert nvidia
    for k in nvidia:
        binary = _binary(k)
        usage = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(binary)], capture_output=True, text=True, check=True
        ).stdout
        regs, stack = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+)", usage).groups())
        meta = json.loads(binary.with_suffix(".json").read_text())
        assert (k["registers"], k["stack_frame_bytes"]) == (regs, stack), k["name"]
        assert k["block_size"] == meta["num_warps"] * 32, k["name"]


def test_unknown_target_is_bad_input(capsys):
    code, _, err = run_cli(capsys, "kernels", "own", "--target", "gfx9999")
    assert code == 2 and "gfx9999" in err and len(err.strip().splitlines()) == 1


def test_register_cap_only_on_the_one_row_8x2048_int8_tiles(compiled):
    """ptxas (cuobjdump's count) keeps the capped int8 tiles within gemv_int8.MAX_REGISTERS, without
    spilling (test_no_kernel_spills_or_uses_scratch), and only those tiles carry the cap."""
    _, kernels = compiled
    m, n, step = gemv_int8.CAPPED_TILE
    tile = f"BLOCK_M={m},BLOCK_N={n},STEP={step},"
    capped = [k for k in kernels if k["arch"] == "sm_90" and "maxnreg=" in k["name"]]
    assert capped
    for k in capped:
        has_cap = f"maxnreg={gemv_int8.MAX_REGISTERS}" in k["name"]
        assert has_cap == (tile in k["name"]), k["name"]
        if has_cap:
            assert k["registers"] <= gemv_int8.MAX_REGISTERS, k["name"]


# launched once per prefill product, not dependently
PREFILL_KERNELS = (
    "dequant_",
    "round_rows_",
    "grouped_",
    "dense_tiles",
    "tile_split_sums",
    "attention_prefill_tiles",
)


def test_dependent_launches_wait_before_reading(compiled):
    """sm_90 launches the decode kernels with programmatic dependent launch (dependent_launch): each such
    kernel must wait for the kernel before it (griddepcontrol.wait) before any global load, and only
    then let the next one launch; the prefill kernels (dequantizers, activation rounding, grouped expert
    products, the fixed-tile products and attention) launch plainly."""
    _, kernels = compiled
    nvidia = [k for k in kernels if k["arch"] == "sm_90"]
    for k in nvidia:
        binary = _binary(k)
        meta = json.loads(binary.with_suffix(".json").read_text())
        ptx = binary.with_suffix(".ptx").read_text()
        assert meta["launch_pdl"] == (not k["name"].startswith(PREFILL_KERNELS)), k["name"]
        if not meta["launch_pdl"]:
            assert "griddepcontrol" not in ptx, k["name"]
            continue
        wait = ptx.index("griddepcontrol.wait")
        assert "ld.global" not in ptx[:wait], k["name"]
        assert ptx.index("griddepcontrol.launch_dependents") > wait, k["name"]


@pytest.mark.parametrize("target", ["sm_80", "gfx1151"])
def test_dependent_launches_only_where_the_target_has_them(target):
    """Programmatic dependent launch needs sm_90: the launch code asks for it nowhere else."""
    recorded = offline.variants(target)
    assert recorded and not any(v.kwargs.get("launch_pdl") or v.kwargs.get("PDL") for v in recorded)
    assert all(v.kwargs["PDL"] is False for v in recorded if not v.name.startswith(PREFILL_KERNELS))


NO_CUDA_BACKEND = """
import importlib.abc, sys, tempfile
from pathlib import Path
import triton.language.extra as extra
for name in [m for m in sys.modules if m.startswith("triton.language.extra.cuda")]:
    del sys.modules[name]
if hasattr(extra, "cuda"):
    delattr(extra, "cuda")
class NoCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("triton.language.extra.cuda"):
            raise ImportError(name)
sys.meta_path.insert(0, NoCuda())
from gufo.kernels.triton import dependent_launch, offline
assert dependent_launch.gdc_wait.fn.__module__ == dependent_launch.__name__
variant = next(v for v in offline.variants("gfx1151") if v.name.startswith("add_rms_norm_rows"))
print(offline.compile_variant(variant, "gfx1151", Path(tempfile.mkdtemp())).name)
"""


def test_kernels_compile_for_amd_with_a_triton_without_its_cuda_backend():
    """A ROCm-only Triton build has no triton.language.extra.cuda: the kernels then take
    dependent_launch's no-op stand-ins (never called: PDL is False off NVIDIA) and still compile."""
    command = [sys.executable, "-c", NO_CUDA_BACKEND]
    done = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
