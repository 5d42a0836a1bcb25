"""Hypothesis settings profiles for Tally's property tests, chosen by TALLY_HYPOTHESIS_PROFILE.

`make test` runs the `default` profile (the suite stays within a few minutes on 2 cores). CI or
a developer can raise the effort without editing tests: `TALLY_HYPOTHESIS_PROFILE=thorough`
multiplies every test's example count by 10; `quick` divides it by 4 for a fast local loop.
Tests ask for `examples(n)`, the scaled count, instead of hard-coding `max_examples`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALES = {"quick": 0.25, "default": 1.0, "ci": 1.0, "thorough": 10.0}
ENV = "TALLY_HYPOTHESIS_PROFILE"

for _name in SCALES:
    settings.register_profile(
        f"tally-{_name}",
        # Tablets do disk I/O; timing varies on shared CI machines, so no per-example deadline.
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def profile_name() -> str:
    name = os.environ.get(ENV, "default").strip().lower() or "default"
    if name not in SCALES:
        raise ValueError(f"{ENV}={name!r}: expected one of {sorted(SCALES)}")
    return name


def load_profile() -> str:
    """Load the profile named by TALLY_HYPOTHESIS_PROFILE (default: `default`)."""
    name = profile_name()
    settings.load_profile(f"tally-{name}")
    return name


def examples(n: int) -> int:
    """`n` examples scaled by the active profile."""
    return max(1, int(n * SCALES[profile_name()]))
