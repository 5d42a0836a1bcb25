"""The error a refused flush raises claims no more than happened.

FlushOutcome alone (no cluster): which buckets applied and which refused, in any order, and
an undo that succeeds or fails, decide between the refusal's own class ("Nothing of this flush
was applied", naming every refused bucket) and PartialWriteError (naming what stays applied,
and saying a part may yet be applied when a leader gave no certain answer).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tally.client.flush_outcome import FlushOutcome
from tally.errors import (AggregateOverflowError, NotEnoughReplicasError, PartialWriteError,
                          TallyError, UnavailableError)

REFUSALS = {
    "overflow": lambda b: AggregateOverflowError(f"bucket {b}: column 'n' overflows int8"),
    "unanswered": lambda b: UnavailableError(f"bucket {b}: not acknowledged, retry"),
    "after_append": lambda b: NotEnoughReplicasError(
        f"bucket {b}: the write is in the leader's log but its in-sync replicas fell: "
        "not acknowledged"),
    "before_append": lambda b: NotEnoughReplicasError(
        f"bucket {b}: fewer than min.insync.replicas: the write was refused and nothing was "
        "applied"),
}
UNCERTAIN = {"unanswered", "after_append"}


@given(st.dictionaries(st.integers(0, 7), st.one_of(
    st.sampled_from(sorted(REFUSALS)),
    st.tuples(st.booleans(), st.booleans()))))  # applied: (range known, undo succeeds)
def test_the_error_says_what_stays_and_what_may_yet_apply(events):
    if not any(isinstance(e, str) for e in events.values()):
        return  # a flush nothing refused raises nothing
    outcome = FlushOutcome()
    undo_fails = set()
    for bucket, event in events.items():
        key = (None, bucket)
        if isinstance(event, str):
            outcome.refuse(key, REFUSALS[event](bucket))
        else:
            known, undoable = event
            outcome.applied(key, 10 * bucket if known else None, 10 * bucket + 3)
            if not undoable:
                undo_fails.add(key)

    undone = []

    def undo(key, records):
        if key in undo_fails:
            raise TallyError(f"{key}: changed since")
        undone.append((key, records))
        return 0

    error = outcome.failure(undo)
    refused = {(None, b): e for b, e in events.items() if isinstance(e, str)}
    applied = {(None, b): e for b, e in events.items() if not isinstance(e, str)}
    kept = {key for key, (known, undoable) in applied.items() if not known or not undoable}
    assert {key for key, _ in undone} == set(applied) - kept
    maybe = [k for k, e in refused.items() if e in UNCERTAIN]
    if not kept and not maybe:
        first = next(iter(refused))
        assert type(error) is type(REFUSALS[refused[first]](first[1]))
        assert "Nothing of this flush was applied" in str(error)
        assert set(error.refused) == set(refused)
        for _, bucket in refused:
            assert f"bucket {bucket}" in str(error)
    else:
        assert isinstance(error, PartialWriteError)
        assert set(error.applied) == kept
        assert set(refused) <= set(error.refused)
        assert "Nothing of this flush" not in str(error)
        assert ("may yet be applied" in str(error)) == bool(maybe)


def test_without_undo_every_applied_bucket_stays():
    outcome = FlushOutcome()
    outcome.applied((None, 0), 0, 4)
    outcome.applied((None, 1), 0, 0)  # an empty range applied nothing
    outcome.refuse((None, 2), AggregateOverflowError("bucket 2: overflow"))
    error = outcome.failure(None)
    assert isinstance(error, PartialWriteError)
    assert error.applied == {(None, 0): 4}
    assert "partly applied" in str(error) and "bucket 0 (to offset 4)" in str(error)
