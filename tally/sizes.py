"""Byte sizes as users write them in options and flags: 67108864, '64mb', '512kb', '0'."""

from __future__ import annotations

import re

from tally.errors import InvalidOptionError

_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def parse_size(name: str, value) -> int:
    """A byte size: an integer, optionally with a unit (b, kb, mb, gb; 1kb = 1024 bytes).
    `name` is the option or flag, for the error message."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?b?)\s*", str(value).lower())
    if match is None:
        raise InvalidOptionError(
            f"Invalid value for option '{name}': {value!r} (expected a size such as 67108864, "
            "'64mb' or '0' for none)")
    number, unit = match.groups()
    return int(number) * _UNITS[unit if unit.endswith("b") or not unit else unit + "b"]
