"""sm_90 kernels against the CUDA driver itself (cuFuncGetAttribute and
cuOccupancyMaxActiveBlocksPerMultiprocessor on an H200), recorded by src/driver_occupancy.py."""

from __future__ import annotations

import pytest
from kernres_oracles import FIXTURES, report_json

DRIVER = FIXTURES / "driver"
RECORDS = sorted(DRIVER.rglob("*.driver.txt"))
BLOCKS = [32, 64, 128, 256, 384, 512, 1024]


def _driver(path) -> dict[tuple[str, int], list[int]]:
    out = {}
    for line in path.read_text().splitlines():
        name, block, *rest = line.split()
        out[(name, int(block))] = [int(x) for x in rest]
    return out


def test_records_exist():
    assert len(RECORDS) >= 4


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.relative_to(DRIVER).as_posix())
@pytest.mark.parametrize("block", BLOCKS)
def test_matches_the_driver(capsys, record, block):
    binary = FIXTURES / record.relative_to(DRIVER).as_posix().removesuffix(".driver.txt")
    assert binary.exists(), f"{binary} was rebuilt: rerun src/driver_occupancy.py on a GPU"
    target = binary.parent if binary.parent.parent.name == "triton" else binary  # Triton: its cache dir
    driver = _driver(record)
    kernels = [
        k for k in report_json(capsys, str(target), "--block-size", str(block)) if k["vendor"] == "nvidia"
    ]
    kernels = [k for k in kernels if (k["name"], block) in driver]
    assert kernels
    for k in kernels:
        _blocks, warps, regs, local, shared, max_threads = driver[(k["name"], block)]
        assert (k["registers"], k["stack_frame_bytes"], k["shared_bytes_static"]) == (regs, local, shared)
        # over the driver's MAX_THREADS_PER_BLOCK a launch fails: no resident warps
        assert k["occupancy_warps_per_sm"] == (warps if block <= max_threads else 0), k["name"]
