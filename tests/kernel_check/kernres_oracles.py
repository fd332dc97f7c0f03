"""Parsers for the compilers' own numbers stored beside the fixtures (the tests' expected values).

Nothing here uses gufo: these read clang's -Rpass-analysis remarks, llvm-readobj's notes, ptxas -v,
cuobjdump and NVIDIA's occupancy calculator output, as written by build_fixtures.sh.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gufo.cli import main as cli_main

FIXTURES = Path(__file__).parent / "fixtures"
HIP, CUDA = FIXTURES / "hip", FIXTURES / "cuda"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The real `gufo` entry point (it imports only the command it runs)."""
    code = cli_main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def report_json(capsys, *argv: str) -> list[dict]:
    code, out, err = run_cli(capsys, "kernels", "report", "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def remarks(path: Path) -> dict[str, dict[str, int]]:
    """clang remarks -> {kernel: {label: value}}; labels as printed (SGPRs/TotalSGPRs, VGPRs, ...)."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("Function Name: "):
            current = out.setdefault(line.split(": ", 1)[1].strip(), {})
        elif current is not None and ": " in line:
            label, value = line.rsplit(": ", 1)
            value = {"True": 1, "False": 0}.get(value.strip(), value.strip())
            current[label.strip()] = int(value)
    return out


def notes(path: Path) -> dict[str, dict[str, int]]:
    """llvm-readobj --notes (filtered: "-" opens a kernel map) -> {kernel: {.field: value}}."""
    maps: list[dict[str, str]] = []
    for line in path.read_text().splitlines():
        if line == "-":
            maps.append({})
        else:
            key, value = (s.strip() for s in line.split(":", 1))
            maps[-1][key] = value
    return {m[".name"]: {k: int(v) for k, v in m.items() if k != ".name"} for m in maps}


def expected_amd(hsaco: Path) -> dict[str, dict[str, int]]:
    """The report fields the compilers printed for each kernel of kernels.TAG.TARGET.hsaco."""
    stem = hsaco.name.removesuffix(".hsaco")
    rem, note = remarks(hsaco.with_name(stem + ".remarks.txt")), notes(hsaco.with_name(stem + ".notes.txt"))
    out = {}
    for name, r in rem.items():
        n = note[name]
        out[name] = {
            "vgpr": r["VGPRs"],
            "agpr": r.get("AGPRs", n.get(".agpr_count", 0)),
            "sgpr": r.get("SGPRs", r.get("TotalSGPRs")),
            "scratch_bytes": r["ScratchSize [bytes/lane]"],
            "vgpr_spill": r["VGPRs Spill"],
            "sgpr_spill": r["SGPRs Spill"],
            "lds_bytes": r["LDS Size [bytes/block]"],
            "wavefront_size": n[".wavefront_size"],
            "max_flat_workgroup_size": n[".max_flat_workgroup_size"],
            "occupancy_waves_per_simd": r["Occupancy [waves/SIMD]"],
        }
    return out


def ptxas(path: Path) -> dict[str, dict[str, int]]:
    """ptxas -v -> {kernel: {registers, stack_frame_bytes, shared_bytes_static, spill_stores}}."""
    out = {}
    text = path.read_text()
    pattern = (
        r"Compiling entry function '([^']+)'.*?\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores.*?\n"
        r"Used (\d+) registers([^\n]*)\n"
    )
    for m in re.finditer(pattern, text, flags=re.S):
        out[m[1]] = {
            "registers": int(m[4]),
            "stack_frame_bytes": int(m[2]),
            "spill_stores": int(m[3]),
            "shared_bytes_static": int(smem[1]) if (smem := re.search(r"(\d+) bytes smem", m[5])) else 0,
        }
    return out


def cuobjdump(path: Path) -> dict[str, dict[str, int]]:
    """cuobjdump --dump-resource-usage and -elf .nv.info sections -> {kernel: {REG, STACK, SHARED, LOCAL,
    MAX_THREADS}}."""
    text = path.read_text()
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"Function ([^:\s]+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text):
        out[m[1]] = {"REG": int(m[2]), "STACK": int(m[3]), "SHARED": int(m[4]), "LOCAL": int(m[5])}
    for section in re.split(r"^\.nv\.info\.", text, flags=re.M)[1:]:
        name = section.split()[0]
        m = re.search(r"EIATTR_MAX_THREADS\s+Format:\s+\S+\s+Value:\s+(\S+) (\S+) (\S+)", section)
        if m and name in out:
            out[name]["MAX_THREADS"] = int(m[1], 16) * int(m[2], 16) * int(m[3], 16)
    return out


def occupancy(path: Path) -> dict[tuple[str, int], int]:
    """cuda_occupancy.h output -> {(kernel, block size): active warps per SM}."""
    out = {}
    for line in path.read_text().splitlines():
        name, block, _blocks, warps = line.split()
        out[(name, int(block))] = int(warps)
    return out


def containers() -> list[tuple[str, str, list[str]]]:
    """containers.txt: (file, compiler tag, targets it holds; '+name' = an extra kernel)."""
    rows = []
    for line in (HIP / "containers.txt").read_text().splitlines():
        file, tag, *targets = line.split()
        rows.append((file, tag, targets))
    return rows
