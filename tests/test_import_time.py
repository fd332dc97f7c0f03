"""Importing gufo reads no GUFO_ environment variable: options are built by the CLI (gufo.options) and
handed down, never read into module globals at import. Nor does it import torch's compiler stack
(torch._dynamo) or xgrammar, which imports transformers: seconds of CPU each in every engine process, the
tests' CLI subprocesses and torchrun ranks among them; a grammar imports xgrammar when it is built."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import HANG_GUARD_S

# every module of the package imported with os.environ recording the GUFO_ keys anyone reads
IMPORT_ALL = """
import importlib, os, pkgutil

read = []
environ_type, original = type(os.environ), type(os.environ).__getitem__


def recording(self, key):  # get() and `in` go through it too
    if str(key).startswith("GUFO_"):
        read.append(key)
    return original(self, key)


environ_type.__getitem__ = recording
import gufo

names = [m.name for m in pkgutil.walk_packages(gufo.__path__, "gufo.")]
for name in names:
    importlib.import_module(name)
os.environ.get("GUFO_INT8_MIN_WEIGHTS")  # the recording works: this read is seen
import sys

heavy = [m for m in ("torch._dynamo", "xgrammar", "transformers") if m in sys.modules]
print(len(names), ",".join(heavy) or "-", sorted(set(read)))
"""


def test_importing_every_module_reads_no_gufo_variable_nor_imports_dynamo_or_xgrammar():
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr
    count, heavy, read = done.stdout.split(" ", 2)
    assert int(count) > 100  # the walk found the package's modules
    assert read.strip() == "['GUFO_INT8_MIN_WEIGHTS']"  # only the deliberate read after the imports
    assert heavy == "-"
