"""A tablet server's id assignment for dictionary tables: the action `assign_ids`.

A request names one bucket this server leads and carries up to MAX_LOOKUP_KEYS keys; the
answer holds every key's id, in input order. Under the bucket's lock, the keys are looked up,
the absent ones get the bucket's next ids (merge_engine.table.dictionary: bucket b of n gives
its k-th key k * n + b), and those rows are applied as one ordinary put, so the changelog
carries them to the followers and a leader elected after a failover holds every id a client
was answered. The answer waits until the high watermark reaches the bucket's log end: an id is
never shown before it is on every in-sync copy, and a key whose answer was lost is answered the
same id when asked again (it is found). A request whose keys all have ids writes nothing, so
it is answered below min.insync.replicas too. Two requests for a new key are serialised by the
lock, so both get the id the first one assigned. A request that cannot be served whole
(exhausted ids, a bad key) is refused with nothing applied.

The bucket's next sequence is cached per leadership: it is valid while the same tablet, under
the same leader epoch, is at the log end offset of this server's last assignment; anything
else that moved the bucket (a follower's fetch, a restored copy, a new term) makes it read the
largest id in the bucket again. Ordinary writes to a dictionary table are refused (a
`write_checks` check), so ids are only ever assigned here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine import MergeMode
from merge_engine.table.dictionary import (ID_COLUMN, KEY_COLUMN, DictionarySpec,
                                           dictionary_spec, is_dictionary)
from tally.errors import InvalidInputError, SchemaError
from tally.wire.messages import MAX_LOOKUP_KEYS, table_to_ipc, unframe


@dataclasses.dataclass
class _Next:
    """A bucket's next sequence, and what it was computed under."""

    tablet: object
    epoch: int
    end: int
    sequence: int


class IdAssignment:
    """Adds `assign_ids` (an action that reads its own request) to a TabletServer, and refuses
    ordinary writes to dictionary tables."""

    def __init__(self, server) -> None:
        self.server = server
        self._next: dict = {}  # TabletKey -> _Next
        server.raw_actions["assign_ids"] = self.assign_ids
        server.write_checks.append(refuse_writes)

    def assign_ids(self, request: pa.Buffer | bytes) -> bytes:
        """The ids of the request's keys (an Arrow IPC stream with the column `id`)."""
        header, payload = unframe(request, "an assign_ids request", max_rows=MAX_LOOKUP_KEYS)
        if not isinstance(header, dict):
            raise InvalidInputError("assign_ids must start with a JSON object")
        if payload is None:
            raise InvalidInputError("an assign_ids request carries its keys as an Arrow table")
        server = self.server
        hosted = server.addressed(header)
        try:
            spec = dictionary_spec(hosted.tablet.descriptor, f"table {hosted.routing.name}")
        except SchemaError as e:
            raise InvalidInputError(str(e)) from None
        keys = checked_keys(payload, spec, hosted.label)
        server.check_rows(hosted, pa.table({KEY_COLUMN: keys}))
        lead = server.leadership(hosted)
        with hosted.lock:
            tablet = hosted.tablet
            rows, present = tablet.lookup_many(pa.table({KEY_COLUMN: keys}))
            ids = rows.column(ID_COLUMN).combine_chunks() if len(keys) else \
                pa.array([], spec.id_arrow_type)
            absent = pc.invert(pa.array(present, pa.bool_()))
            wrote = False
            if len(keys) and pc.any(absent).as_py():
                lead.check_insync()  # a write: refused below min.insync.replicas
                new_keys = pc.unique(keys.filter(absent))  # in order of first appearance
                cached, new_ids = self._new_ids(hosted, lead, spec, len(new_keys))
                tablet.put(pa.table({KEY_COLUMN: new_keys, ID_COLUMN: new_ids}),
                           mode=MergeMode.AGGREGATE)
                cached.sequence += len(new_keys)
                cached.end = tablet.log_end_offset
                assigned = new_ids.take(pc.index_in(keys, value_set=new_keys))
                ids = pc.if_else(absent, assigned, ids)
                wrote = True
            end = tablet.log_end_offset
        if wrote:
            server.replicas.appended()
            lead.wait_replicated(end)
        else:  # ids another request assigned are shown once they are acknowledged
            lead.wait_replicated(end, writing=False)
        return table_to_ipc(pa.table({ID_COLUMN: ids.cast(spec.id_arrow_type)}))

    def _new_ids(self, hosted, lead, spec: DictionarySpec, count: int) -> tuple[_Next, pa.Array]:
        """The bucket's cached next sequence (under its lock; the caller moves it once the ids
        are applied) and `count` new ids from it; InvalidInputError when they would pass the
        id type's limit."""
        tablet, bucket = hosted.tablet, hosted.key.bucket
        cached = self._next.get(hosted.key)
        if cached is None or cached.tablet is not tablet or cached.epoch != lead.epoch \
                or cached.end != tablet.log_end_offset:
            sequence = spec.next_sequence(largest_id(tablet), bucket)
            cached = self._next[hosted.key] = _Next(tablet, lead.epoch, tablet.log_end_offset,
                                                    sequence)
        first = cached.sequence
        last_id = spec.id_of(first + count - 1, bucket)
        if last_id > spec.limit:
            raise InvalidInputError(
                f"dictionary {hosted.routing.name} is exhausted in bucket {bucket}: {count} new "
                f"key(s) would need ids up to {last_id}, past the largest {spec.id_type} id "
                f"{spec.limit}; nothing was assigned (use an int64 dictionary, and rbm64)")
        sequences = np.arange(first, first + count, dtype=np.int64)
        return cached, pa.array(spec.id_of(sequences, bucket)).cast(spec.id_arrow_type)


def largest_id(tablet) -> int | None:
    """The largest id a dictionary bucket holds (a read of every row: once per leadership)."""
    snapshot = tablet.snapshot()
    largest = None
    try:
        for batch in snapshot.batches([ID_COLUMN]):
            top = pc.max(batch.column(0)).as_py()
            if top is not None and (largest is None or top > largest):
                largest = top
    finally:
        snapshot.release()
    return largest


def checked_keys(payload: pa.Table, spec: DictionarySpec, label: str) -> pa.Array:
    """The request's keys: exactly the column `key`, of the dictionary's key type, no null."""
    if payload.column_names != [KEY_COLUMN]:
        raise InvalidInputError(f"assign_ids for {label} carries the one column "
                                f"'{KEY_COLUMN}', not {payload.column_names}")
    keys = payload.column(KEY_COLUMN).combine_chunks()
    if keys.type != spec.key_type:
        raise InvalidInputError(f"the keys of dictionary {label} are {spec.key_type}, not "
                                f"{keys.type}")
    if keys.null_count:
        row = int(pc.index(pc.is_null(keys), True).as_py())
        raise InvalidInputError(f"key {row} of an assign_ids request for {label} is null; a "
                                f"dictionary has no id for null (nothing was assigned)")
    return keys


def refuse_writes(hosted, header: dict, rows: pa.Table) -> None:
    """A write check: a dictionary's rows are written by assign_ids only (a client's id could
    collide with an assigned one, and a delete would give an id away twice)."""
    if is_dictionary(hosted.tablet.descriptor):
        raise InvalidInputError(
            f"{hosted.label} is a dictionary table: its ids are assigned by the tablet servers "
            f"(table.ids(keys)), never written or deleted; nothing was applied")
