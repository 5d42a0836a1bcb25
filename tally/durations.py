"""Durations as users write them in options: 86400000 (milliseconds), '30s', '15min', '2h', '7d'."""

from __future__ import annotations

import re

from tally.errors import InvalidOptionError

_UNITS_MS = {"": 1, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(name: str, value) -> int:
    """A duration in milliseconds: an integer (milliseconds), optionally with a unit (ms, s,
    min, h, d). `name` is the option, for the error message."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|h|d)?\s*", str(value).lower())
    if match is None:
        raise InvalidOptionError(
            f"Invalid value for option '{name}': {value!r} (expected a duration such as "
            "86400000 (milliseconds), '30s', '15min', '2h' or '7d')")
    number, unit = match.groups()
    return int(number) * _UNITS_MS[unit or ""]
