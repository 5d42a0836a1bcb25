"""Waiting for a condition with a generous deadline, so a test holds on a loaded machine.

Tests never sleep for a guessed time and hope: they poll the condition they need until a
deadline far beyond what a quiet machine takes, and fail naming what did not happen.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

DEADLINE = 120.0


def wait_until(condition: Callable[[], T], what: str, deadline: float = DEADLINE,
               every: float = 0.05) -> T:
    """The first truthy value of `condition()`; AssertionError naming `what` at the deadline."""
    stop = time.monotonic() + deadline
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < stop, f"{what} did not happen within {deadline:.0f}s"
        time.sleep(every)
