"""llama-bench's list and range syntax, and the errors for malformed lists."""

from __future__ import annotations

import pytest

from gufo.errors import BadInputError
from gufo.tools.bench.lists import parse_int_list, parse_pair, parse_positive_list


@pytest.mark.parametrize(
    "text,expected",
    [
        ("512", [512]),
        ("0", [0]),
        ("64,512", [64, 512]),
        ("1-4", [1, 2, 3, 4]),
        ("0-1024+256", [0, 256, 512, 768, 1024]),
        ("0-1000+256", [0, 256, 512, 768]),
        ("64-1024*2", [64, 128, 256, 512, 1024]),
        ("16-100*3", [16, 48]),
        ("7-7", [7]),
        ("1,8-32*2,100", [1, 8, 16, 32, 100]),
    ],
)
def test_lists_and_ranges_expand_like_llama_bench(text, expected):
    assert parse_int_list(text, "-p") == expected


@pytest.mark.parametrize(
    "text", ["32x", "32,", ",32", "-1", "", "1,,2", "8-4", "0-8*2", "4-8*1", "4-8+0", "a", " 32"]
)
def test_malformed_lists_are_bad_input_naming_the_flag(text):
    with pytest.raises(BadInputError, match="^-p: "):
        parse_int_list(text, "-p")


def test_pairs_and_positive_lists():
    assert parse_pair("512,128", "-pg") == (512, 128)
    for bad in ("512", "512,128,1", "1-3,4", "x,1"):
        with pytest.raises(BadInputError, match="^-pg: "):
            parse_pair(bad, "-pg")
    assert parse_positive_list("1-3", "-t") == [1, 2, 3]
    with pytest.raises(BadInputError, match="positive"):
        parse_positive_list("0,2", "-t")
