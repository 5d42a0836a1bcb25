"""What one flush of an upsert writer applied and what refused it, and the error that says so.

Each (partition, bucket) the flush reached keeps the offset ranges its requests were applied
at. When a bucket refuses, an all-or-nothing flush takes every applied bucket back by those
ranges; the error raised then claims no more than happened: the refusal itself (its class
kept, so `except AggregateOverflowError` still works) when every applied part was taken back,
PartialWriteError naming each bucket that stays applied and each that refused otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tally.errors import PartialWriteError, TallyError, UnavailableError

Key = tuple  # (partition name or None, bucket)


def uncertain(error: TallyError) -> bool:
    """A refusal that may not be one: a server that did not answer in time, or whose in-sync
    copies fell below min.insync.replicas while the request replicated, may still apply it (it
    sits in the leader's log, not acknowledged). A server that refused before applying says so
    ("nothing was applied"): that one is certain."""
    return isinstance(error, UnavailableError) and "nothing was applied" not in str(error).lower()


UNCERTAIN = ("{} gave no certain answer (its part is, or may be, in the leader's log but was "
             "not acknowledged): it may yet be applied (read the bucket before sending it again)")


def label(key: Key) -> str:
    partition, bucket = key
    return f"{partition + '/' if partition else ''}bucket {bucket}"


@dataclasses.dataclass
class BucketApplied:
    """The requests one bucket applied in this flush: their offset ranges (None when a
    retry found a request applied already, so its range is unknown) and the end after them."""

    ranges: list = dataclasses.field(default_factory=list)
    end: int = 0

    @property
    def known(self) -> bool:
        return all(r is not None for r in self.ranges)

    def records(self) -> list[tuple[int, int]]:
        return [r for r in self.ranges if r is not None and r[1] > r[0]]


class FlushOutcome:
    """Collected under the writer's lock while the flush's requests come back."""

    def __init__(self) -> None:
        self.buckets: dict[Key, BucketApplied] = {}
        self.refused: dict[Key, TallyError] = {}

    def applied(self, key: Key, start: int | None, end: int) -> None:
        bucket = self.buckets.setdefault(key, BucketApplied())
        bucket.ranges.append(None if start is None else (start, end))
        bucket.end = end

    def refuse(self, key: Key, error: TallyError) -> None:
        self.refused.setdefault(key, error)

    def ends(self) -> dict[Key, int]:
        return {key: b.end for key, b in self.buckets.items()}

    def failure(self, undo: Callable[[Key, list], int] | None) -> TallyError:
        """The error the flush raises; with `undo`, after taking back every applied bucket
        it can (None: the writer keeps what was applied)."""
        kept: dict[Key, int] = {}
        refused = dict(self.refused)
        undone = 0
        for key, bucket in self.buckets.items():
            records = bucket.records()
            if undo is None:
                if records or not bucket.known:
                    kept[key] = bucket.end
                continue
            if not bucket.known:
                kept[key] = bucket.end
                refused.setdefault(key, TallyError(
                    f"{label(key)}: a request was retried after its answer was lost, so the "
                    "offsets it was applied at are not known and it cannot be taken back"))
                continue
            if not records:
                continue
            try:
                undo(key, records)
                undone += 1
            except TallyError as e:
                kept[key] = bucket.end
                refused.setdefault(key, e)
        if not kept and not any(uncertain(e) for e in self.refused.values()):
            return self._refusal(undone)
        return PartialWriteError(self._partial_message(kept, refused, undo is not None),
                                 applied=kept, refused=refused)

    def _refusal(self, undone: int) -> TallyError:
        """The first refusal, re-raised with the flush's whole story (of the same class)."""
        key, first = next(iter(self.refused.items()))
        others = [f"{label(k)}: {type(e).__name__}: {str(e).rstrip('.')}"
                  for k, e in self.refused.items()
                  if k != key]
        story = [f"{label(key)}: {str(first).rstrip('.')}"]
        if others:
            story.append(f"Also refused: {'; '.join(others)}")
        story.append("Nothing of this flush was applied"
                     + (f" ({undone} bucket(s) that had applied their part were undone)"
                        if undone else ""))
        try:
            error = type(first)(". ".join(story))
            error.__dict__.update(first.__dict__)  # what the class carries besides its text
        except TypeError:  # a class that wants more than a message
            error = TallyError(". ".join(story))
        error.refused = dict(self.refused)
        return error

    @staticmethod
    def _partial_message(kept: dict, refused: dict, tried_undo: bool) -> str:
        applied = ", ".join(f"{label(k)} (to offset {end})" for k, end in kept.items())
        causes = "; ".join(f"{label(k)}: {type(e).__name__}: {str(e).rstrip('.')}"
                           for k, e in refused.items())
        maybe = [label(k) for k, e in refused.items() if uncertain(e)]
        story = [f"the write may be partly applied: {len(kept)} bucket(s) stay applied"
                 if maybe and not kept else
                 f"the write was partly applied: {len(kept)} bucket(s) stay applied"]
        if kept:
            story[0] += f" ({applied}){' and could not be undone' if tried_undo else ''}"
        story.append(f"{len(refused)} refused ({causes})")
        if maybe:
            story.append(UNCERTAIN.format(", ".join(maybe)))
        return "; ".join(story) + ". Sending the same rows again would apply the applied " \
            "part twice"
