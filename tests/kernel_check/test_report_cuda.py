"""`gufo kernels report --json` on CUDA fixtures equals ptxas -v, cuobjdump and cuda_occupancy.h."""

from __future__ import annotations

import pytest
from kernres_oracles import CUDA, cuobjdump, occupancy, ptxas, report_json

CUBINS = sorted(CUDA.glob("*.cubin"))
FIELDS = (
    "registers", "stack_frame_bytes", "shared_bytes_static", "local_bytes", "max_threads_per_block",
    "occupancy_warps_per_sm",
)  # fmt: skip


def expected(cubin) -> dict[str, dict]:
    px, cu = (
        ptxas(cubin.with_name(cubin.name + ".ptxas.txt")),
        cuobjdump(cubin.with_name(cubin.name + ".cuobjdump.txt")),
    )
    occ = occupancy(cubin.with_name(cubin.name + ".occupancy.txt"))
    out = {}
    for name, p in px.items():
        c = cu[name]
        assert p["registers"] == c["REG"] and p["stack_frame_bytes"] == c["STACK"]
        bound = c.get("MAX_THREADS")
        block = bound or 256
        out[name] = {
            "registers": p["registers"],
            "stack_frame_bytes": p["stack_frame_bytes"],
            "shared_bytes_static": p["shared_bytes_static"],
            "local_bytes": c["LOCAL"],
            "max_threads_per_block": bound,
            "occupancy_warps_per_sm": occ[(name, block)],
            "block_size": block,
        }
    return out


def test_fixture_set():
    names = {p.name for p in CUBINS}
    assert {"kernels.sm_80.cubin", "kernels.sm_90.cubin", "kernels.sm_90.maxrreg32.cubin"} <= names


@pytest.mark.parametrize("cubin", CUBINS, ids=lambda p: p.name)
def test_cubin_matches_compiler(capsys, cubin):
    kernels = report_json(capsys, str(cubin))
    want = expected(cubin)
    assert {k["name"] for k in kernels} == set(want)
    for k in kernels:
        assert k["vendor"] == "nvidia" and k["arch"] == cubin.name.split(".")[1]
        got = {f: k[f] for f in (*FIELDS, "block_size")}
        assert got == want[k["name"]], k["name"]


@pytest.mark.parametrize("cubin", CUBINS, ids=lambda p: p.name)
@pytest.mark.parametrize("block", [32, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024])
def test_occupancy_at_block_size(capsys, cubin, block):
    occ = occupancy(cubin.with_name(cubin.name + ".occupancy.txt"))
    bounds = {
        n: c.get("MAX_THREADS") for n, c in cuobjdump(cubin.with_name(cubin.name + ".cuobjdump.txt")).items()
    }
    for k in report_json(capsys, str(cubin), "--block-size", str(block)):
        bound = bounds[k["name"]]
        want = (
            occ[(k["name"], block)] if bound is None or block <= bound else 0
        )  # over the bound: cannot launch
        assert (k["block_size"], k["occupancy_warps_per_sm"]) == (block, want), k["name"]


def test_maxrregcount_build_trades_registers_for_stack(capsys):
    free = {k["name"]: k for k in report_json(capsys, str(CUDA / "kernels.sm_90.cubin"))}
    capped = {k["name"]: k for k in report_json(capsys, str(CUDA / "kernels.sm_90.maxrreg32.cubin"))}
    px = ptxas(CUDA / "kernels.sm_90.maxrreg32.cubin.ptxas.txt")["_Z16cu_regs_n96_freePfPKfi"]
    name = "_Z16cu_regs_n96_freePfPKfi"
    assert px["spill_stores"] > 0
    assert capped[name]["registers"] == px["registers"] < free[name]["registers"]
    assert capped[name]["stack_frame_bytes"] == px["stack_frame_bytes"] > free[name]["stack_frame_bytes"]


@pytest.mark.parametrize("file", ["kernels.fatbin", "host.cu.o"])
def test_fatbins_match_their_cubins(capsys, file):
    kernels = report_json(capsys, str(CUDA / file))
    listed = (CUDA / "host.cu.o.list.txt").read_text().split()
    assert sorted({k["arch"] for k in kernels}) == sorted(n.split(".")[-2] for n in listed)
    for arch in ("sm_80", "sm_90"):
        want = expected(CUDA / f"kernels.{arch}.cubin")
        group = [k for k in kernels if k["arch"] == arch]
        assert {k["name"] for k in group} == set(want)
        for k in group:
            assert {f: k[f] for f in (*FIELDS, "block_size")} == want[k["name"]]
            assert "fatbin[" in k["container"]
