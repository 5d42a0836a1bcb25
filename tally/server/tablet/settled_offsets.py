"""The end of a bucket that nothing unresolved lies above: every record the leader holds is
committed (on min.insync.replicas copies) before the end is given.

A write refused as "not acknowledged" (its followers did not confirm it in time) stays in the
leader's log above the high watermark, and may commit later when a slow follower catches up.
An undo that read only up to the high watermark would skip it, and a replay of the epoch would
then count it twice once it commits. So whatever builds on a bucket's end — an undo, a lock's
initial offsets, an epoch's baseline, a takeover — asks for the settled end: the leader waits
until its high watermark has reached the log end it had when asked. If the tail cannot commit
now (too few copies in sync, a follower that does not answer), the call fails with a retryable
error rather than give an end that an old record could still land below.
"""

from __future__ import annotations

import time

from tally.errors import UnavailableError


def settled_end(lead, deadline: float) -> int:
    """The bucket's high watermark once it covers the leader's whole log as of this call.
    `deadline` (time.monotonic) is shared by the buckets of one request."""
    end = lead.tablet.log_end_offset
    hw = lead.shown_high_watermark()
    if hw >= end:
        return hw
    left = deadline - time.monotonic()
    if left <= 0:
        raise UnavailableError(
            f"{lead.label}: records [{hw}, {end}) are in the leader's log but not yet on "
            "enough copies; an undo or a baseline waits until they are resolved (retry)")
    return lead.wait_replicated(end, timeout=left, writing=True)
