"""Shared setup for the kernel-resource tests: the fuzz marker and the fixture folder."""

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: long fuzzing run; only with GUFO_FUZZ=1")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("GUFO_FUZZ") == "1":
        return
    skip = pytest.mark.skip(reason="fuzzing runs only with GUFO_FUZZ=1")
    for item in items:
        if "fuzz" in item.keywords:
            item.add_marker(skip)
