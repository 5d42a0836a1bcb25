"""A tablet server's prefix lookups: the read `prefix_lookup` (a DoGet, role `read`).

The ticket names one bucket this server leads and carries one key prefix, a one-row Arrow
table of the leading primary-key columns (merge_engine.write.key_prefixes checks them, with the
errors the client gives). A prefix that fixes the partition key or the bucket key must belong
to the addressed partition and bucket. The bucket's rows under the prefix are pinned at its
log end offset (merge_engine.kv.prefix_reads) and streamed in key order in batches of at most
`batch_size` rows, once the high watermark reaches that offset, as a scan is: only committed
rows are shown, the offset is in the stream's schema metadata, and the bucket's lock is held
only to pin them.
"""

from __future__ import annotations

import pyarrow as pa

from merge_engine.kv.row_snapshot import scan_schema
from merge_engine.write.key_prefixes import prefix_table
from tally.errors import InvalidInputError
from tally.server.settings import DEFAULT_SCAN_BATCH_ROWS
from tally.wire.bucket_hash import bucket_ids
from tally.wire.messages import SCAN_OFFSET_KEY, read_options
from tally.wire.routing import partition_names


class PrefixLookups:
    """Serves `prefix_lookup` reads for a TabletServer."""

    def __init__(self, server) -> None:
        self.server = server

    def read(self, hosted, header: dict, payload: pa.Table | None) -> pa.RecordBatchReader:
        """The rows of the addressed bucket under the ticket's prefix: `columns` (a list of
        names, default all), `batch_size` rows at most per batch, and the hidden `_unwritten`
        column when `unwritten` is true."""
        columns, batch_size, unwritten = read_options(header, DEFAULT_SCAN_BATCH_ROWS)
        if payload is None or payload.num_rows != 1:
            raise InvalidInputError("a prefix_lookup carries exactly one key prefix, as a "
                                    "one-row Arrow table of the leading primary-key columns")
        routing = hosted.routing
        prefix = prefix_table(routing.primary_key, routing.arrow_schema, payload, hosted.label)
        _check_placement(routing, prefix, hosted)
        schema = scan_schema(routing.arrow_schema, columns, unwritten)
        lead = self.server.leadership(hosted)
        with hosted.lock:
            rows = hosted.tablet.prefix_rows(prefix)
        try:
            lead.wait_replicated(rows.offset, writing=False)
        except BaseException:
            rows.release()
            raise
        schema = schema.with_metadata({SCAN_OFFSET_KEY: str(rows.offset).encode()})
        return pa.RecordBatchReader.from_batches(
            schema, rows.batches(columns, batch_size, unwritten))


def _check_placement(routing, prefix: pa.Table, hosted) -> None:
    """A prefix that fixes the partition key (or the bucket key) names one partition (or
    bucket): it must be the addressed one, or the rows it asks for are not here."""
    names = set(prefix.schema.names)
    if routing.partitioned and set(routing.partition_key) <= names:
        named = partition_names(prefix, routing.partition_key)[0]
        if named != hosted.partition:
            raise InvalidInputError(f"the key prefix belongs to partition '{named}', not to "
                                    f"{hosted.label}")
    if set(routing.bucket_key) <= names:
        found = int(bucket_ids(prefix, list(routing.bucket_key), routing.bucket_count)[0])
        if found != hosted.key.bucket:
            raise InvalidInputError(f"the key prefix belongs to bucket {found}, not to "
                                    f"{hosted.label}")
