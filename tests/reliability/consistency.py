"""What the reliability tests check a table against, read through the client only.

- `rows_by_bucket`: the table's rows (a scan) split by (partition, bucket) with the client's own
  bucket function, so each bucket can be compared on its own.
- `replay_changelog`: a bucket's state rebuilt from its changelog alone (+I/+U images set a key,
  -D removes it), checking on the way that the log is well formed: offsets run 0..end-1, `+I`
  only for absent keys, every `-U`/`-D` before-image equals the replayed state, every `+U`
  follows its key's `-U`.
- `assert_kv_matches_changelog`: for every bucket, the scanned rows equal the replay and the
  changelog ends at the bucket's log end offset (list_offsets).
"""

from __future__ import annotations

import pyarrow as pa

from tally.wire.bucket_hash import bucket_ids

def key_of(row: dict, primary_key) -> tuple:
    return tuple(row[c] for c in primary_key)


def split_by_bucket(routing, rows: dict[tuple, dict]) -> dict[tuple, dict[tuple, dict]]:
    """{(partition, bucket): {key: row}} of `rows` ({key: row}), by the table's bucket function."""
    out: dict[tuple, dict[tuple, dict]] = {}
    if not rows:
        return out
    values = list(rows.values())
    keys = pa.Table.from_pylist([{c: r[c] for c in routing.primary_key} for r in values],
                                schema=routing.key_schema(routing.primary_key))
    buckets = bucket_ids(keys, list(routing.bucket_key), routing.bucket_count)
    for row, bucket in zip(values, buckets.tolist()):
        where = (routing.partition_of(row), int(bucket))
        out.setdefault(where, {})[key_of(row, routing.primary_key)] = row
    return out


def rows_by_bucket(table) -> dict[tuple, dict[tuple, dict]]:
    """The scanned rows of a client `Table`, split by (partition, bucket)."""
    routing = table.routing
    scanned = {key_of(r, routing.primary_key): r for r in table.to_arrow().to_pylist()}
    return split_by_bucket(routing, scanned)


def replay_changelog(log: pa.Table, primary_key, columns: list[str]) -> dict[tuple, dict]:
    """The state a bucket's changelog (from offset 0) describes, as rows of the table's
    `columns` (the changelog also carries metadata and hidden state columns); AssertionError
    if the log is malformed."""
    offsets = log.column("_offset").to_pylist()
    assert offsets == list(range(len(offsets))), f"changelog offsets not contiguous: {offsets[:20]}"
    data = log.select(columns)
    state: dict[tuple, dict] = {}
    pending_update: dict[tuple, int] = {}
    for offset, kind, row in zip(offsets, log.column("_change_type").to_pylist(),
                                 data.to_pylist()):
        key = key_of(row, primary_key)
        if kind == "+I":
            assert key not in state, f"offset {offset}: +I of existing key {key}"
            state[key] = row
        elif kind in ("-U", "-D"):
            assert state.get(key) == row, \
                f"offset {offset}: {kind} image {row} differs from the replayed {state.get(key)}"
            if kind == "-D":
                del state[key]
            else:
                pending_update[key] = offset
        elif kind == "+U":
            assert pending_update.pop(key, None) is not None, f"offset {offset}: +U without -U"
            state[key] = row
        else:
            raise AssertionError(f"offset {offset}: unknown change type {kind!r}")
    assert not pending_update, f"-U without +U at offsets {sorted(pending_update.values())}"
    return state


def assert_kv_matches_changelog(conn, name: str) -> dict[tuple, dict[tuple, dict]]:
    """Every bucket's rows equal the replay of its changelog; returns the rows by bucket."""
    table = conn.table(name)
    routing = table.routing
    scanned = rows_by_bucket(table)
    ends = conn.admin.list_log_offsets(name)
    for (partition, bucket), (start, end) in ends.items():
        assert start == 0, f"bucket {partition}/{bucket} lost its log head (starts at {start})"
        log = table.changelog(bucket, 0, partition=partition)
        assert log.num_rows == end, \
            f"bucket {partition}/{bucket}: changelog has {log.num_rows} records, end is {end}"
        replayed = replay_changelog(log, routing.primary_key, routing.arrow_schema.names)
        got = scanned.get((partition, bucket), {})
        assert got == replayed, \
            f"bucket {partition}/{bucket}: KV differs from the changelog replay " \
            f"({len(got)} rows vs {len(replayed)}; e.g. {_first_difference(got, replayed)})"
    stray = set(scanned) - set(ends)
    assert not stray, f"rows in buckets list_offsets does not know: {stray}"
    return scanned


def _first_difference(a: dict, b: dict) -> str:
    for key in sorted(set(a) | set(b), key=repr):
        if a.get(key) != b.get(key):
            return f"key {key}: {a.get(key)} vs {b.get(key)}"
    return "none"
