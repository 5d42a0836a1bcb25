"""How Tally writes times and durations for people: reprs, log lines and CLI output.

Times are epoch seconds inside Tally (what the metadata stores and the wire carry); a person
reads `2026-11-24T04:47:03.120Z` more easily than `1795495623.12`, and a duration rounded to
what matters (`1.25s`, `60s`) more easily than `1.2487301230430603`.
"""

from __future__ import annotations

import datetime
import math


def iso(seconds: float | None) -> str:
    """An epoch time as ISO 8601 in UTC, to the millisecond ('never' for infinity)."""
    if seconds is None:
        return "None"
    if not math.isfinite(seconds):
        return "never" if seconds > 0 else "-inf"
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(seconds: float | None) -> str:
    """A duration rounded for reading: `60s`, `1.25s`, `0.004s`, `inf`."""
    if seconds is None:
        return "None"
    if not math.isfinite(seconds):
        return "inf"
    if seconds == int(seconds) and abs(seconds) < 1e15:
        return f"{int(seconds)}s"
    if abs(seconds) >= 1:
        return f"{seconds:.2f}s"
    return f"{seconds:.3g}s"
