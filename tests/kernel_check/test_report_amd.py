"""`gufo kernels report --json` on AMD fixtures equals clang's own numbers (remarks + llvm-readobj notes)."""

from __future__ import annotations

import pytest
from kernres_oracles import HIP, containers, expected_amd, report_json

HSACOS = sorted(HIP.glob("kernels.*.hsaco"))
FIELDS = (
    "vgpr", "agpr", "sgpr", "scratch_bytes", "vgpr_spill", "sgpr_spill", "lds_bytes", "wavefront_size",
    "max_flat_workgroup_size", "occupancy_waves_per_simd",
)  # fmt: skip


def _check_against(kernels: list[dict], expected: dict[str, dict[str, int]], clang19: bool) -> None:
    assert {k["name"] for k in kernels} == set(expected)
    for k in kernels:
        want = dict(expected[k["name"]])
        if clang19 and want["agpr"]:
            # clang-19 records only alignTo(VGPRs, 4) + AGPRs; the arch VGPR count is rounded up to 4
            want["vgpr"] = (want["vgpr"] + 3) // 4 * 4
        got = {f: k[f] for f in FIELDS}
        assert got == want, k["name"]


def test_fixture_set_covers_the_acceptance_targets():
    names = {p.name for p in HSACOS}
    for tag in ("clang19", "clang22"):
        for target in ("gfx1151", "gfx1100", "gfx1100.w64", "gfx942"):
            assert f"kernels.{tag}.{target}.hsaco" in names
    for target in ("gfx90a", "gfx1030", "gfx1101", "gfx1102", "gfx1150", "gfx1200", "gfx1201"):
        assert f"kernels.clang22.{target}.hsaco" in names


@pytest.mark.parametrize("hsaco", HSACOS, ids=lambda p: p.name)
def test_code_object_matches_compiler(capsys, hsaco):
    kernels = report_json(capsys, str(hsaco))
    assert {k["vendor"] for k in kernels} == {"amd"}
    assert {k["container"] for k in kernels} == {"code object"}
    assert {k["arch"] for k in kernels} == {hsaco.name.split(".")[2]}
    _check_against(kernels, expected_amd(hsaco), "clang19" in hsaco.name)


def test_json_fields_are_the_documented_ones(capsys):
    kernel = report_json(capsys, str(HSACOS[0]))[0]
    common = {"file", "container", "vendor", "arch", "name", "display_name", "occupancy_limited_by"}
    assert set(kernel) == common | set(FIELDS)


def test_spilling_kernel_spills_and_limits_name_a_resource(capsys):
    kernels = {k["name"]: k for k in report_json(capsys, str(HIP / "kernels.clang22.gfx1151.hsaco"))}
    spill = kernels["_Z16regs_n256_lb1024PfPKfi"]
    rem = expected_amd(HIP / "kernels.clang22.gfx1151.hsaco")["_Z16regs_n256_lb1024PfPKfi"]
    assert spill["scratch_bytes"] == rem["scratch_bytes"] > 0 and rem["vgpr_spill"] > 0
    assert kernels["_Z11lds_big_40kPfPKf"]["occupancy_limited_by"] == "lds"
    assert kernels["_Z15regs_n160_lb256PfPKfi"]["occupancy_limited_by"] == "vgpr"
    assert spill["display_name"].startswith("regs_n256_lb1024(")


@pytest.mark.parametrize("row", containers(), ids=lambda r: r[0])
def test_containers_match_their_single_target_builds(capsys, row):
    file, tag, targets = row
    kernels = report_json(capsys, str(HIP / file))
    arches = [t for t in targets if not t.startswith("+")]
    extra = {t[1:] for t in targets if t.startswith("+")}
    assert {k["arch"] for k in kernels} == set(arches)
    for arch in arches:
        group = [k for k in kernels if k["arch"] == arch and k["name"] not in extra]
        assert all(f"--{arch}" in k["container"] for k in group)
        _check_against(group, expected_amd(HIP / f"kernels.{tag}.{arch}.hsaco"), tag == "clang19")
    assert extra <= {k["name"] for k in kernels}


def test_container_labels_name_each_layer(capsys):
    kernels = report_json(capsys, str(HIP / "host.clang22.so"))
    labels = {k["container"] for k in kernels}
    # two translation units: two compressed bundles back to back in .hip_fatbin
    assert labels == {
        ".hip_fatbin[0] / ccob-v3-zstd / hipv4-amdgcn-amd-amdhsa--gfx942",
        ".hip_fatbin[1] / ccob-v3-zstd / hipv4-amdgcn-amd-amdhsa--gfx942",
    }
    dll = report_json(capsys, str(HIP / "host.clang19.dll"))
    assert {k["container"] for k in dll} == {".hip_fat[0] / hipv4-amdgcn-amd-amdhsa--gfx1151"}
    ccob2 = report_json(capsys, str(HIP / "ccob2.clang19.hipfb"))
    assert {k["container"].split(" / ")[0] for k in ccob2} == {"ccob-v2-zstd"}


def test_filter_and_table(capsys):
    from kernres_oracles import run_cli

    kernels = report_json(capsys, str(HIP / "kernels.clang22.gfx942.hsaco"), "--filter", "mfma")
    assert [k["name"] for k in kernels] == ["_Z13mfma_agpr_accPDv16_fPKDv4_DF16_S3_i"]
    code, out, _ = run_cli(capsys, "kernels", "report", str(HIP / "kernels.clang22.gfx942.hsaco"))
    assert code == 0 and "mfma_agpr_acc" in out and "waves/SIMD" in out


def test_code_object_versions(capsys):
    """v4 (ABI version 2), v5 (3) and v6 (4) code objects all read the same way."""
    versions = {}
    for name in (
        "kernels.clang19.gfx1151.cov4.hsaco",
        "kernels.clang19.gfx1151.hsaco",
        "kernels.clang22.gfx1151.hsaco",
    ):
        versions[(HIP / name).read_bytes()[8]] = name  # e_ident[EI_ABIVERSION]
    assert sorted(versions) == [2, 3, 4]


def test_without_metadata_note_the_descriptor_gives_upper_bounds(capsys):
    """llvm-objcopy removed the note: scratch, LDS and wave size stay exact, VGPRs become the allocation."""
    kernels = report_json(capsys, str(HIP / "nonote.clang22.gfx1151.hsaco"))
    want = expected_amd(HIP / "kernels.clang22.gfx1151.hsaco")
    assert {k["name"] for k in kernels} == set(want)
    for k in kernels:
        w = want[k["name"]]
        assert (k["scratch_bytes"], k["lds_bytes"], k["wavefront_size"]) == (
            w["scratch_bytes"],
            w["lds_bytes"],
            w["wavefront_size"],
        )
        assert k["vgpr"] >= w["vgpr"] and k["vgpr"] % 8 == 0  # wave32 encoding granule
        assert k["vgpr_spill"] is None and k["occupancy_waves_per_simd"] is None
