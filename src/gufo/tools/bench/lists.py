"""llama-bench's list syntax: `a,b,c` and ranges `first-last`, `first-last+step`, `first-last*mult`."""

from __future__ import annotations

import re

from gufo.errors import BadInputError

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def parse_int_list(text: str, flag: str) -> list[int]:
    """Expand `text` into integers >= 0, in the order written; one clear error naming `flag` otherwise."""
    items = text.split(",")
    if not text or any(not item for item in items):
        raise BadInputError(f"{flag}: expected a list like 32,64 or a range like 32-512*2, got {text!r}")
    values: list[int] = []
    for item in items:
        match = _ITEM.fullmatch(item)
        if match is None:
            raise BadInputError(
                f"{flag}: {item!r} is not a non-negative integer or a range first-last[+step|*mult]"
            )
        first, last, op, amount = match.groups()
        values.extend(_expand(int(first), last, op, amount, item, flag))
    return values


def _expand(
    first: int, last: str | None, op: str | None, amount: str | None, item: str, flag: str
) -> list[int]:
    if last is None:
        return [first]
    end = int(last)
    if end < first:
        raise BadInputError(f"{flag}: range {item!r} ends before it starts")
    if op == "*":
        factor = int(amount)
        if factor < 2 or first == 0:
            raise BadInputError(f"{flag}: range {item!r} needs a start > 0 and a multiplier >= 2")
        out, value = [], first
        while value <= end:
            out.append(value)
            value *= factor
        return out
    step = int(amount) if op == "+" else 1
    if step < 1:
        raise BadInputError(f"{flag}: range {item!r} needs a step >= 1")
    return list(range(first, end + 1, step))


def parse_pair(text: str, flag: str) -> tuple[int, int]:
    """A `-pg` value: `PP,TG`, two integers >= 0."""
    values = parse_int_list(text, flag)
    if len(values) != 2 or "-" in text:
        raise BadInputError(f"{flag}: expected PP,TG (two integers), got {text!r}")
    return values[0], values[1]


def parse_positive_list(text: str, flag: str) -> list[int]:
    values = parse_int_list(text, flag)
    if 0 in values:
        raise BadInputError(f"{flag}: values must be positive, got {text!r}")
    return values


def parse_span(text: str, flag: str) -> tuple[int, int]:
    """`N` or `A:B` (inclusive), positive integers with A <= B: the range a value is drawn from."""
    parts = text.split(":")
    if len(parts) > 2 or not all(part.isdigit() for part in parts):
        raise BadInputError(f"{flag}: expected a positive integer N or a range A:B, got {text!r}")
    low, high = int(parts[0]), int(parts[-1])
    if low == 0 or high < low:
        raise BadInputError(f"{flag}: {text!r} needs 0 < A <= B")
    return low, high


def parse_positive_floats(text: str, flag: str) -> list[float]:
    """A list of positive numbers such as `0.5,1,4` (request rates)."""
    try:
        values = [float(item) for item in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v < float("inf") for v in values):
        raise BadInputError(f"{flag}: expected positive numbers like 0.5,1,4, got {text!r}")
    return values
