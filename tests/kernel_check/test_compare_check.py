"""compare / check / baseline on builds of the same sources by clang-19 and clang-22 (and nvcc with and
without -maxrregcount); the expected verdicts come from the compilers' own numbers."""

from __future__ import annotations

import json

import pytest
from kernres_oracles import CUDA, HIP, expected_amd, occupancy, ptxas, run_cli

TARGETS = ["gfx1151", "gfx1100", "gfx1100.w64", "gfx942"]
WATCH = (("scratch_bytes", 1), ("vgpr_spill", 1), ("sgpr_spill", 1), ("occupancy_waves_per_simd", -1))


def _expected_verdicts(new: dict, base: dict) -> dict[str, tuple[str, bool]]:
    """kernel -> (verdict, scratch grew), from the compilers' numbers; names matched across namespaces."""
    base_by = {_strip_ns(n): v for n, v in base.items()}
    out = {}
    for name, b in new.items():
        a = base_by[_strip_ns(name)]
        worse = [f for f, d in WATCH if (b[f] - a[f]) * d > 0]
        better = [f for f, d in WATCH if (b[f] - a[f]) * d < 0]
        out[name] = (
            "worse" if worse else "better" if better else "same",
            b["scratch_bytes"] > a["scratch_bytes"],
        )
    return out


def _strip_ns(name: str) -> str:
    return name.replace("gufo_v1", "gufo_vN").replace("gufo_v2", "gufo_vN")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("new_tag,base_tag", [("clang19", "clang22"), ("clang22", "clang19")])
@pytest.mark.parametrize("strict", [False, True])
def test_compare_clang19_vs_clang22(capsys, target, new_tag, base_tag, strict):
    new, base = HIP / f"kernels.{new_tag}.{target}.hsaco", HIP / f"kernels.{base_tag}.{target}.hsaco"
    want = _expected_verdicts(expected_amd(new), expected_amd(base))
    argv = ["kernels", "compare", str(new), "--base", str(base), "--json"] + (["--strict"] if strict else [])
    code, out, err = run_cli(capsys, *argv)
    doc = json.loads(out)
    got = {p["key"].split("/", 1)[1]: (p["verdict"], p["scratch_grew"]) for p in doc["kernels"]}
    names = {p["key"].split("/", 1)[1]: p for p in doc["kernels"]}
    assert doc["only_new"] == [] and doc["only_base"] == []  # the gufo_v1/gufo_v2 kernel is matched too
    assert len(got) == len(want)
    for name, verdict in want.items():
        key = next(k for k in names if k == name or ("ns_versioned" in name and "ns_versioned" in k))
        assert got[key] == verdict, name
    fails = any(w == "worse" for w, _ in want.values()) if strict else any(g for _, g in want.values())
    assert code == (1 if fails else 0), err


def test_compare_shows_the_known_regressions(capsys):
    """clang-22 -> clang-19 on gfx942: the spilling kernel spills more (exit 1); the table says so."""
    new, base = HIP / "kernels.clang19.gfx942.hsaco", HIP / "kernels.clang22.gfx942.hsaco"
    n, b = expected_amd(new)["_Z16regs_n256_lb1024PfPKfi"], expected_amd(base)["_Z16regs_n256_lb1024PfPKfi"]
    code, out, _ = run_cli(capsys, "kernels", "compare", str(new), "--base", str(base))
    assert f"scratch_bytes {b['scratch_bytes']}->{n['scratch_bytes']}" in out
    assert code == (1 if n["scratch_bytes"] > b["scratch_bytes"] else 0)


def test_compare_cuda_maxrregcount(capsys):
    new, base = CUDA / "kernels.sm_90.maxrreg32.cubin", CUDA / "kernels.sm_90.cubin"
    pn, pb = ptxas(new.with_name(new.name + ".ptxas.txt")), ptxas(base.with_name(base.name + ".ptxas.txt"))
    occ_n, occ_b = (
        occupancy(new.with_name(new.name + ".occupancy.txt")),
        occupancy(base.with_name(base.name + ".occupancy.txt")),
    )
    for argv, flip in (([str(new), "--base", str(base)], False), ([str(base), "--base", str(new)], True)):
        code, out, _ = run_cli(capsys, "kernels", "compare", *argv, "--json", "--block-size", "256")
        doc = json.loads(out)
        grew = False
        for p in doc["kernels"]:
            name = p["key"].split("/", 1)[1]
            a, b = (pn, pb) if flip else (pb, pn)
            oa, ob = (occ_n, occ_b) if flip else (occ_b, occ_n)
            stack_up = b[name]["stack_frame_bytes"] > a[name]["stack_frame_bytes"]
            occ_down = ob[(name, 256)] < oa[(name, 256)]
            grew |= stack_up
            assert ("stack_frame_bytes" in p["worse"]) == stack_up, name
            assert ("occupancy_warps_per_sm" in p["worse"]) == occ_down, name
        assert code == (1 if grew else 0)


def test_baseline_then_check(capsys, tmp_path):
    old, new = HIP / "kernels.clang22.gfx1151.hsaco", HIP / "kernels.clang19.gfx1151.hsaco"
    allow = tmp_path / "allow.json"
    code, out, err = run_cli(
        capsys, "kernels", "baseline", str(old), "--write", str(allow), "--note", "clang 22"
    )
    assert code == 0, err
    doc = json.loads(allow.read_text())
    assert doc["schema"] == "gufo.kernels.allowance" and doc["version"] == 1
    assert doc["note"] == "clang 22" and doc["default_scratch_bytes"] == 0
    old_scratch = {n: v["scratch_bytes"] for n, v in expected_amd(old).items()}
    assert sorted(v["scratch_bytes"] for v in doc["kernels"].values()) == sorted(old_scratch.values())
    # the same build passes its own baseline
    assert run_cli(capsys, "kernels", "check", str(old), "--baseline", str(allow))[0] == 0
    # clang-19's build fails where its scratch exceeds clang-22's
    new_scratch = {_strip_ns(n): v["scratch_bytes"] for n, v in expected_amd(new).items()}
    over = {n for n, s in new_scratch.items() if s > old_scratch.get(n.replace("gufo_vN", "gufo_v2"), 0)}
    code, out, _ = run_cli(capsys, "kernels", "check", str(new), "--baseline", str(allow), "--json")
    result = json.loads(out)
    assert {_strip_ns(o["key"].split("/", 1)[1]) for o in result["offenders"]} == over
    assert code == (1 if over else 0)


def test_check_default_allowance_and_vanished(capsys, tmp_path):
    build = HIP / "kernels.clang22.gfx942.hsaco"
    allow = tmp_path / "allow.json"
    doc = {"schema": "gufo.kernels.allowance", "version": 1, "note": "t", "default_scratch_bytes": 0,
           "kernels": {"gfx942/gone_kernel": {"scratch_bytes": 0}}}  # fmt: skip
    allow.write_text(json.dumps(doc))
    code, out, _ = run_cli(capsys, "kernels", "check", str(build), "--baseline", str(allow))
    with_scratch = {n for n, v in expected_amd(build).items() if v["scratch_bytes"] > 0}
    assert with_scratch and code == 1
    for name in with_scratch:
        assert f"gfx942/{name}" in out
    assert "gfx942/gone_kernel" in out and "no kernel in this build" in out
    doc["default_scratch_bytes"] = max(v["scratch_bytes"] for v in expected_amd(build).values())
    allow.write_text(json.dumps(doc))
    assert run_cli(capsys, "kernels", "check", str(build), "--baseline", str(allow))[0] == 0


@pytest.mark.parametrize("target", ["gfx1151", "gfx1100"])
def test_occupancy_model_change_is_named(capsys, target):
    """Where the remarks show equal resources but different occupancy, compare says the model changed."""
    new, base = HIP / f"kernels.clang19.{target}.hsaco", HIP / f"kernels.clang22.{target}.hsaco"
    en, eb = expected_amd(new), expected_amd(base)
    inputs = ("vgpr", "agpr", "sgpr", "lds_bytes", "wavefront_size", "max_flat_workgroup_size")
    model_only = {
        n for n in en
        if n in eb and all(en[n][f] == eb[n][f] for f in inputs)
        and en[n]["occupancy_waves_per_simd"] != eb[n]["occupancy_waves_per_simd"]
    }  # fmt: skip
    assert model_only  # the 768-thread kernel
    code, out, _ = run_cli(capsys, "kernels", "compare", str(new), "--base", str(base), "--json")
    for p in json.loads(out)["kernels"]:
        name = p["key"].split("/", 1)[1]
        assert any("occupancy model differs" in n for n in p["notes"]) == (name in model_only), name
