"""One exception hierarchy for all of Tally.

Every error a user can meet derives from `TallyError`, so `except TallyError` catches them all.
Servers send the class name with the message, and the client raises the same class again, so a
caller sees one type whether the table is in-process or across the network.
"""


class TallyError(Exception):
    """Base class of every error Tally raises on purpose."""


# --- schema, options and input validation -------------------------------------------------------


class SchemaError(TallyError):
    """A schema or table descriptor is invalid (wrong types, bad functions, bad keys)."""


class InvalidOptionError(SchemaError):
    """A table option or connector option is unknown or has a bad value."""


class LakeSetupError(InvalidOptionError):
    """The lake cannot be turned on for a table as the cluster is set up: the coordinator has
    no lake directory, or no tiering process can import deltalake. Nothing was changed."""


class InvalidAggFunctionError(SchemaError):
    """An aggregate function name, its parameters or its column type is invalid."""


class InvalidInputError(TallyError):
    """A write does not fit the table: unknown column, wrong type, null key, bad target columns."""


class AggregateOverflowError(InvalidInputError):
    """An exact aggregate (sum, product of integers or decimals) left the column's type."""


class RetractionError(InvalidInputError):
    """A retraction cannot be applied exactly to a column."""


class DeleteDisabledError(InvalidInputError):
    """A delete was sent to a table whose `table.delete.behavior` is `disable`."""


# --- storage -------------------------------------------------------------------------------------


class StorageError(TallyError):
    """The tablet's files are missing, corrupt or were written by an incompatible version, or
    its disk refused a write."""


class StorageWriteError(StorageError):
    """The bucket's disk refused a write (an I/O error): nothing of that write was applied or
    acknowledged, and the bucket refuses writes until it is reopened (a tablet server does that
    by itself once the disk takes writes again)."""


class DiskFullError(StorageWriteError):
    """The bucket's disk is full ("no space left on device"); see StorageWriteError."""


class RemoteStorageError(StorageError):
    """A bucket's remote snapshot or changelog segment is missing, corrupt or could not be
    written to the remote directory."""


class OffsetOutOfRangeError(TallyError):
    """A changelog offset lies outside [log start offset, log end offset]."""


class FencedLeaderEpochError(TallyError):
    """A bucket was asked to record a leader epoch below (or conflicting with) one it already
    recorded: the leader that asked was deposed; nothing was recorded."""


# --- cluster, metadata and locks -----------------------------------------------------------------


class NotFoundError(TallyError):
    """A database, table, partition or bucket does not exist."""


class AlreadyExistsError(TallyError):
    """A database or table already exists."""


class ClusterError(TallyError):
    """A server could not be reached or answered with something unexpected."""


class UnavailableError(ClusterError):
    """A server or the metadata store cannot be reached right now; the same call may succeed later."""


class NotEnoughReplicasError(UnavailableError):
    """A bucket has fewer in-sync replicas than its table's `min.insync.replicas`: a write is
    refused (or, when they dropped out while it was replicating, not acknowledged) rather than
    kept on fewer copies than the table asks for. Retried while followers catch up."""


class NotLeaderError(UnavailableError):
    """The server addressed no longer leads the bucket (a leader election moved it, or this
    server was deposed while it waited for its followers). Nothing was acknowledged; the
    client refreshes its metadata and retries on the new leader."""


class StaleMetadataError(ClusterError):
    """The caller's view of the cluster is out of date (bucket hosted elsewhere, table re-created).

    Clients refresh their metadata and retry; users only see it when retries run out.
    """


class TableRecreatedError(StaleMetadataError):
    """The table a handle, writer or reader resolved was dropped and its name now belongs to a
    new table (another table id). Never retried: following the name would write the old
    table's rows into the new one (or read the new one's data as the old one's)."""

    def __init__(self, message: str, table: str | None = None, resolved_id: int | None = None,
                 current_id: int | None = None) -> None:
        super().__init__(message)
        self.table, self.resolved_id, self.current_id = table, resolved_id, current_id

    @classmethod
    def of(cls, table: str, resolved_id: int, current_id: int) -> "TableRecreatedError":
        return cls(f"table '{table}' was dropped and re-created: this handle refers to table "
                   f"id {resolved_id}, the name now to table id {current_id}; nothing was "
                   f"written to or read from the new table. Open it again with "
                   f"conn.table('{table}')", table, resolved_id, current_id)


class WireVersionError(TallyError):
    """A request or answer of another version of Tally's wire format than this side's: client
    and server are of different Tally versions."""


class VersionConflictError(TallyError):
    """A compare-and-set on the metadata store lost: the node changed since it was read."""


class AuthenticationError(TallyError):
    """A request carried no token or the wrong one."""


class PermissionDeniedError(TallyError):
    """The caller is authenticated but its role does not allow the call, or it acts on a lock
    whose secret it does not hold; nothing was changed."""


class TakeoverLeaseError(PermissionDeniedError):
    """A lease revived by a takeover of an expired lock was used to act as that lock's owner
    (commit, begin an epoch, store a baseline, write other than an undo's OVERWRITE): a
    takeover only undoes the owner's uncommitted writes and releases the lock."""


class ColumnLockConflict(TallyError):
    """Another owner holds a live lock on some of the requested columns."""


class UnrecoveredLockError(ColumnLockConflict):
    """An expired lock still covers the columns: its tenure's writes since its last commit may
    have to be undone, so nobody else may write them until its owner recovers, another owner
    takes the columns over (which undoes them first), or an operator discards the lock."""


class RollupBuildingError(ColumnLockConflict):
    """An epoch on a table was refused because one of its rollups is being backfilled: the
    backfill's scan must see no epoch in flight. Nothing was written; a writer waits and
    begins the epoch again once the rollup is ready."""


class LeaseLostError(TallyError):
    """A lease expired or was superseded: its owner is fenced and may not write any more."""


class AttemptSupersededError(LeaseLostError):
    """A write to a bucket came from an attempt older than the one registered last for that
    bucket (a retried task replaced it): the lease still holds, only this attempt is fenced."""


class EpochAbortedError(LeaseLostError):
    """A task of an epoch's run that was rolled back asked to begin its bucket: the writer
    aborted that run (its rollback is under way or done), so the task may not write. The lease
    still holds; a later run of the epoch begins afresh."""


class RecoveryError(TallyError):
    """Undo recovery cannot run safely (truncated log, re-created table, bad baseline)."""


class WriteUndoConflictError(TallyError):
    """A refused flush's applied part could not be taken back in a bucket: another writer
    changed one of its keys since. Nothing was undone there; the part stays applied."""


class PartialWriteError(TallyError):
    """A flush was refused in some buckets and stays applied in others.

    `applied` maps each (partition, bucket) whose part stays applied to its end offset;
    `refused` maps each (partition, bucket) that refused its part (or whose undo failed) to
    the error. Sending the whole batch again would apply the `applied` part twice."""

    def __init__(self, message: str, applied: dict | None = None,
                 refused: dict | None = None) -> None:
        super().__init__(message)
        self.applied = dict(applied or {})
        self.refused = dict(refused or {})


class TieringFencedError(TallyError):
    """A tiering process no longer holds a table (another one took it under a newer tiering
    epoch): its lake commit or report is refused; nothing of it was recorded."""


class LakeError(TallyError):
    """A table's lake copy cannot be read or written as it is (not a lake table of this table,
    missing, or its commits do not carry Tally's offsets)."""


def error_class(name: str) -> type[TallyError]:
    """The TallyError subclass called `name`, or TallyError itself for an unknown name."""
    found = globals().get(name)
    if isinstance(found, type) and issubclass(found, TallyError):
        return found
    return TallyError


class MissingDependencyError(TallyError, ImportError):
    """An optional package a call needs is not installed (e.g. pandas for `to_pandas`)."""
