"""The per-kernel record every reader produces, and the error readers raise on malformed input."""

from __future__ import annotations

from dataclasses import dataclass, field

AMD_FIELDS = (
    "vgpr",
    "agpr",
    "sgpr",
    "scratch_bytes",
    "vgpr_spill",
    "sgpr_spill",
    "lds_bytes",
    "wavefront_size",
    "max_flat_workgroup_size",
    "occupancy_waves_per_simd",
)
NVIDIA_FIELDS = (
    "registers",
    "stack_frame_bytes",
    "shared_bytes_static",
    "local_bytes",
    "max_threads_per_block",
    "occupancy_warps_per_sm",
)
COMMON_FIELDS = ("file", "container", "vendor", "arch", "name", "display_name")


class FormatError(Exception):
    """Malformed or unsupported binary content; the loader prefixes the file name."""


@dataclass
class Kernel:
    """One kernel in one compiled image. `values` holds the vendor's fields (AMD_FIELDS or NVIDIA_FIELDS)."""

    vendor: str  # "amd" or "nvidia"
    arch: str  # "gfx1151", "sm_90"
    name: str  # mangled symbol name
    values: dict[str, int | None]
    container: str = ""  # how the image was found inside the file, outermost first
    file: str = ""
    display_name: str = ""
    occupancy_limited_by: str = ""
    block_size: int | None = None  # NVIDIA: the block size the occupancy is computed for
    target_id: str = ""  # AMD: full target ID with features; "" when it equals arch
    compiler: str = ""  # from the image's .comment, e.g. "clang 19.1.7"
    compiler_major: int = 0  # picks LLVM's occupancy model (19 or 22); 0 unknown
    notes: list[str] = field(default_factory=list)  # cross-check findings, fallbacks

    @property
    def scratch(self) -> int:
        """Per-thread scratch the allowance file limits: AMD scratch, NVIDIA stack frame."""
        key = "scratch_bytes" if self.vendor == "amd" else "stack_frame_bytes"
        return int(self.values.get(key) or 0)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in COMMON_FIELDS}
        out.update(self.values)
        out["occupancy_limited_by"] = self.occupancy_limited_by
        if self.vendor == "nvidia":
            out["block_size"] = self.block_size
        return out
