"""Display names for mangled kernels, and comparison keys that survive version-stamped namespaces."""

from __future__ import annotations

import re
import shutil
import subprocess

_TOOLS = ("llvm-cxxfilt", "c++filt")
_LENGTH = re.compile(r"[1-9]\d{0,5}")
_NESTED = re.compile(r"_ZN[rVKRO]*")
_VERSIONED = [  # inline or version-stamped namespaces, in mangled form
    (re.compile(r"\d+(CUB|THRUST|CCCL)_\d+(_\d+)*_NS"), r"\1_#_NS"),
    (re.compile(r"St3__\d"), "St3__#"),
]


def demangle_all(names: list[str]) -> dict[str, str]:
    """Mangled -> readable, with the system's c++filt when there is one; else a name-only fallback."""
    mangled = sorted({n for n in names if n.startswith("_Z")})
    out = {n: n for n in names}
    if not mangled:
        return out
    tool = next((t for t in _TOOLS if shutil.which(t)), None)
    if tool:
        try:
            res = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True,
                                 timeout=20, check=True)  # fmt: skip
            lines = res.stdout.splitlines()
            if len(lines) == len(mangled):
                out.update(zip(mangled, lines, strict=True))
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    out.update({n: qualified_name(n) + "(...)" for n in mangled})
    return out


def qualified_name(mangled: str) -> str:
    """_ZN4gufo2v17kernelsEv -> gufo::v1::kernels; _Z5saxpyPfi -> saxpy; anything else unchanged."""
    if not mangled.startswith("_Z"):
        return mangled
    m = _NESTED.match(mangled)
    parts, _ = _source_names(mangled, m.end() if m else 2, m is not None)
    return "::".join(parts) if parts else mangled


def compare_key(mangled: str) -> str:
    """A name for matching kernels across builds: digits in namespace components become '#'."""
    prefix = _nested_prefix(mangled)
    parts = qualified_name(mangled).split("::") if prefix else []
    head, rest = "", mangled
    if len(parts) > 1:
        head = "::".join([re.sub(r"\d+", "#", p) for p in parts[:-1]] + parts[-1:]) + "|"
        rest = mangled[len(prefix) :]
    for pattern, repl in _VERSIONED:
        rest = pattern.sub(repl, rest)
    return head + rest


def _source_names(mangled: str, pos: int, nested: bool) -> tuple[list[str], int]:
    """Consecutive `<length><identifier>` names from `pos` (one unless nested)."""
    parts = []
    while (m := _LENGTH.match(mangled, pos)) is not None:
        end = m.end() + int(m[0])
        if end > len(mangled):
            break
        parts.append(mangled[m.end() : end])
        pos = end
        if not nested:
            break
    return parts, pos


def _nested_prefix(mangled: str) -> str:
    """The `_ZN<len><id>...` run of source names (before template args or the closing E)."""
    m = _NESTED.match(mangled)
    if not m:
        return ""
    _, end = _source_names(mangled, m.end(), True)
    return mangled[:end]
