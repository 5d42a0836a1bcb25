"""Owner ids: the name under which a Spark job locks its columns and records its commits.

The owner id must be the same every time the same logical writer runs again, because that is
how a restarted job gets its lock back (with its original initial offsets) and finds its last
commit. It must also differ between writers that may run at the same time, so one job writing
two tables, or two column sets of one table, never collides with itself. Exact formats:

    streaming:  spark-query:<streaming query id>/<database>.<table>/<col>,<col>,...
    batch:      spark-app:<Spark application id>/<database>.<table>/<col>,<col>,...

where the columns are the locked ones: the non-key target columns in the table's schema order
(all non-key columns for a full-row writer); when that is too long for a metadata node name
(253 bytes once quoted), `sha256-<32 hex digits>` of the column names stands for them. The streaming query id lives in the checkpoint
(`<checkpoint>/metadata`), so it survives restarts from that checkpoint; a new checkpoint is a
new owner. `client.column-lock.owner-id`, when given, is used verbatim instead.
"""

from __future__ import annotations

import hashlib

from tally.errors import InvalidInputError, InvalidOptionError
from tally.meta import node_name

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
    owner = f"{prefix}:{job_id}/{table}/{','.join(columns)}"
    if _fits(owner):
        return owner
    # Too long to be a metadata node name on either store (many or long column names): the
    # columns' digest names the same column set as stably, across restarts and processes.
    digest = hashlib.sha256("\0".join(columns).encode()).hexdigest()[:32]
    return f"{prefix}:{job_id}/{table}/sha256-{digest}"


def _fits(owner: str) -> bool:
    try:
        node_name(owner)
    except InvalidInputError:
        return False
    return True


def streaming_owner_id(explicit: str | None, query_id: str, table: str, columns) -> str:
    return explicit or derive_owner_id(QUERY_PREFIX, query_id, table, list(columns))


def batch_owner_id(explicit: str | None, app_id: str, table: str, columns) -> str:
    return explicit or derive_owner_id(APP_PREFIX, app_id, table, list(columns))
