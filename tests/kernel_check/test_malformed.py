"""Bad input: one clear line naming the file, exit code 2, never a traceback."""

from __future__ import annotations

import json
import struct

import pytest
from kernres_oracles import CUDA, HIP, run_cli


def _elf_header(machine: int) -> bytes:
    """A bare ELF64 header with no sections (e_machine as given)."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0)


def _ccob(version: int, method: int, payload: bytes, raw_size: int) -> bytes:
    if version == 2:
        return b"CCOB" + struct.pack("<HHIIQ", 2, method, 24 + len(payload), raw_size, 0) + payload
    return b"CCOB" + struct.pack("<HHQQQ", version, method, 32 + len(payload), raw_size, 0) + payload


def _bundle_with_empty_device_entry() -> bytes:
    ids = [b"host-x86_64-unknown-linux--", b"hipv4-amdgcn-amd-amdhsa--gfx1151"]
    head = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids))
    offset = len(head) + sum(24 + len(i) for i in ids)
    return head + b"".join(struct.pack("<QQQ", offset, 0, len(i)) + i for i in ids)


def _ccob3_with_method(method: int) -> bytes:
    data = bytearray((HIP / "ccob3.clang22.hipfb").read_bytes())
    struct.pack_into("<H", data, 6, method)
    return bytes(data)


CASES = {
    "not_a_binary": (b"just some text\n", "not an ELF, PE, offload bundle"),
    "empty_file": (b"", "empty file"),
    "truncated_bundle": ((HIP / "bundle.clang19.hipfb").read_bytes()[:6000], "truncated offload bundle"),
    "truncated_bundle_header": (b"__CLANG_OFFLOAD_BUNDLE__\x02", "truncated offload bundle header"),
    "bad_ccob_version": (_ccob(9, 1, b"x" * 64, 64), "bad CCOB header: unknown version 9"),
    "bad_ccob_size": (_ccob(3, 1, b"x" * 64, 64)[:40], "bad CCOB header: total size"),
    "truncated_ccob_header": (b"CCOB\x03\x00\x01\x00\x10", "truncated CCOB header"),
    "unknown_compression": (_ccob3_with_method(7), "unknown CCOB compression method 7"),
    "corrupt_ccob_payload": (_ccob(2, 1, b"\x28\xb5\x2f\xfd" + b"\xff" * 40, 4096), "corrupt CCOB payload"),
    "zero_length_ccob_payload": (_ccob(3, 1, b"", 0), "zero-length payload"),
    "zero_length_bundle_entry": (_bundle_with_empty_device_entry(), "zero-length payload"),
    "no_kernels_amdgpu": (_elf_header(224), "no kernels found"),
    "no_gpu_code_host_elf": (_elf_header(62), "holds no GPU code"),
    "truncated_cubin": ((CUDA / "kernels.sm_90.cubin").read_bytes()[:3000], "kernels.sm_90"),
    "truncated_fatbin": ((CUDA / "kernels.fatbin").read_bytes()[:9000], "truncated fatbin"),
    "pe_without_signature": (b"MZ" + bytes(100), "not a PE image"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, case):
    data, message = CASES[case]
    path = tmp_path / f"{case}.bin"
    path.write_bytes(data)
    if case == "truncated_cubin":
        message = path.name
    code, out, err = run_cli(capsys, "kernels", "report", str(path))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"gufo: error: {path}: ")
    assert message in lines[0]


def test_missing_file_and_empty_directory(capsys, tmp_path):
    code, _, err = run_cli(capsys, "kernels", "report", str(tmp_path / "nope.hsaco"))
    assert code == 2 and "cannot read" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "kernels", "report", str(tmp_path))
    assert code == 2 and "no .hsaco or .cubin files" in err


SCHEMA = "gufo.kernels.allowance"


@pytest.mark.parametrize(
    "doc,message",
    [
        ("{", "not JSON"),
        (json.dumps({"schema": "other"}), "not an allowance file"),
        (json.dumps({"schema": SCHEMA, "version": 7}), "unsupported"),
        (
            json.dumps({"schema": SCHEMA, "version": 1, "kernels": {"k": {"scratch_bytes": -1}}}),
            "non-negative",
        ),
    ],
)
def test_bad_allowance_file(capsys, tmp_path, doc, message):
    allow = tmp_path / "allow.json"
    allow.write_text(doc)
    code, _, err = run_cli(
        capsys, "kernels", "check", str(HIP / "kernels.clang22.gfx1151.hsaco"), "--baseline", str(allow)
    )
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_bad_block_size(capsys):
    code, _, err = run_cli(
        capsys, "kernels", "report", str(CUDA / "kernels.sm_90.cubin"), "--block-size", "0"
    )
    assert code == 2 and "--block-size" in err
