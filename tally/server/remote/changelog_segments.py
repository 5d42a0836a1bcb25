"""The bytes of a remote changelog segment: the leader's stored changelog entries in the
replication wire format (one Arrow IPC stream, a row per entry), so a restore appends them
verbatim as a follower would, offsets, written times and idempotent writers included."""

from __future__ import annotations

from tally.errors import RemoteStorageError


def encode_segment(entries) -> bytes:
    from merge_engine.kv.replica_entries import ReplicatedEntry
    from tally.wire.messages import table_to_ipc

    return table_to_ipc(ReplicatedEntry.to_arrow(entries))


def decode_segment(segment, data: bytes) -> list:
    """The entries of `segment` (a SegmentInfo), checked to cover exactly its offsets."""
    from merge_engine.kv.replica_entries import ReplicatedEntry
    from tally.wire.messages import ipc_to_table

    try:
        entries = ReplicatedEntry.from_arrow(ipc_to_table(data))
    except Exception as exc:  # noqa: BLE001 - Arrow's errors for damaged data vary
        raise RemoteStorageError(f"{segment} is unreadable: {exc}") from None
    if not entries or entries[0].first_offset != segment.first_offset or \
            entries[-1].end_offset != segment.end_offset or \
            any(a.end_offset != b.first_offset for a, b in zip(entries, entries[1:])):
        raise RemoteStorageError(f"{segment} does not hold the contiguous entries of its "
                                 f"offsets")
    return entries
