"""Triton cache directories: kernels compiled by Triton for gfx1151 and sm_90, checked against
llvm-readobj (AMD metadata), cuobjdump and NVIDIA's occupancy calculator at Triton's launch shape."""

from __future__ import annotations

import json

from kernres_oracles import FIXTURES, notes, occupancy, report_json

TRITON = FIXTURES / "triton"


def _files(suffix: str):
    return sorted(TRITON.glob(f"*/*{suffix}"))


def test_cache_dir_reports_every_kernel(capsys):
    kernels = report_json(capsys, str(TRITON))
    want = {(p.stem, "amd") for p in _files(".hsaco")} | {(p.stem, "nvidia") for p in _files(".cubin")}
    assert {(k["name"], k["vendor"]) for k in kernels} == want and len(kernels) == len(want) >= 4
    assert all(k["container"].startswith("triton:") for k in kernels)


def test_amd_values_match_readobj(capsys):
    kernels = {k["name"]: k for k in report_json(capsys, str(TRITON)) if k["vendor"] == "amd"}
    for hsaco in _files(".hsaco"):
        meta = json.loads(hsaco.with_suffix(".json").read_text())
        n = notes(hsaco.with_name(hsaco.name + ".notes.txt"))[hsaco.stem]
        k = kernels[hsaco.stem]
        assert k["arch"] == meta["target"]["arch"]
        assert (k["vgpr"] + k["agpr"], k["sgpr"]) == (n[".vgpr_count"], n[".sgpr_count"])
        assert (k["scratch_bytes"], k["lds_bytes"]) == (
            n[".private_segment_fixed_size"],
            n[".group_segment_fixed_size"],
        )
        assert (k["vgpr_spill"], k["sgpr_spill"]) == (n[".vgpr_spill_count"], n[".sgpr_spill_count"])
        assert (k["wavefront_size"], k["max_flat_workgroup_size"]) == (
            n[".wavefront_size"],
            n[".max_flat_workgroup_size"],
        )


def test_nvidia_values_and_occupancy_at_triton_launch(capsys):
    kernels = {k["name"]: k for k in report_json(capsys, str(TRITON)) if k["vendor"] == "nvidia"}
    for cubin in _files(".cubin"):
        meta = json.loads(cubin.with_suffix(".json").read_text())
        text = cubin.with_name(cubin.name + ".cuobjdump.txt").read_text()
        regs = int(text.split("REG:")[1].split()[0])
        stack = int(text.split("STACK:")[1].split()[0])
        k = kernels[cubin.stem]
        block = meta["num_warps"] * meta["warp_size"]
        occ = occupancy(cubin.with_name(cubin.name + ".occupancy.txt"))
        assert (k["registers"], k["stack_frame_bytes"], k["block_size"]) == (regs, stack, block)
        assert k["occupancy_warps_per_sm"] == occ[(cubin.stem, block)]
