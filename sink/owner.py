"""Owner ids: the name under which a Spark job locks its columns and records its commits.

The owner id must be the same every time the same logical writer runs again, because that is
how a restarted job gets its lock back (with its original initial offsets) and finds its last
commit. It must also differ between writers that may run at the same time, so one job writing
two tables, or two column sets of one table, never collides with itself. Exact formats:

    streaming:  spark-query:<streaming query id>/<database>.<table>/<col>,<col>,...
    batch:      spark-app:<Spark application id>/<database>.<table>/<col>,<col>,...

where the columns are the locked ones: the non-key target columns in the table's schema order
(all non-key columns for a full-row writer). The streaming query id lives in the checkpoint
(`<checkpoint>/metadata`), so it survives restarts from that checkpoint; a new checkpoint is a
new owner. `client.column-lock.owner-id`, when given, is used verbatim instead.
"""

from __future__ import annotations

from tally.errors import InvalidOptionError

QUERY_PREFIX = "spark-query"
APP_PREFIX = "spark-app"


def lock_columns(schema, target_columns) -> list[str]:
    """The columns a writer locks: its non-key targets in schema order (all for full rows)."""
    key = set(schema.primary_key)
    wanted = None if target_columns is None else set(target_columns)
    return [c.name for c in schema.columns
            if c.name not in key and (wanted is None or c.name in wanted)]


def derive_owner_id(prefix: str, job_id: str, table: str, columns: list[str]) -> str:
    if not job_id:
        raise InvalidOptionError(
            "Cannot derive a column-lock owner id: the Spark job id is unknown; set the "
            "option 'client.column-lock.owner-id'")
    return f"{prefix}:{job_id}/{table}/{','.join(columns)}"


def streaming_owner_id(explicit: str | None, query_id: str, table: str, columns) -> str:
    return explicit or derive_owner_id(QUERY_PREFIX, query_id, table, list(columns))


def batch_owner_id(explicit: str | None, app_id: str, table: str, columns) -> str:
    return explicit or derive_owner_id(APP_PREFIX, app_id, table, list(columns))
