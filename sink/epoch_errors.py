"""The error a failed epoch raises, and the typed cause it keeps.

When an epoch's write fails for good while the writer's process lives (bad data in one bucket,
a task out of retries, a lost lease), `WriterRun` rolls every bucket back to the epoch's
baseline and raises an `EpochFailedError`. Its message says what happened to the table:

- `rolled_back` true: nothing of the epoch was applied (N buckets were undone);
- `rolled_back` false: the rollback failed too, part of the epoch may be applied, and the
  message says how to repair it (restart the writer with the same owner id).

The cause keeps its type: when the failure was a Tally error, raised on the driver or in a
Spark task (recovered by name from the task's Python traceback, which is all Spark hands
back), the error raised is an instance of both `EpochFailedError` and that class, so
`except AggregateOverflowError` still catches a decimal sum that overflowed in one bucket. It
is chained (`raise ... from`) to the original exception.
"""

from __future__ import annotations

import re
import sys

from tally.errors import TallyError

# "module.Class: message" lines of a Python traceback (the last one names the raised error).
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)\.([A-Za-z_]\w*): (.*)$", re.MULTILINE)


class EpochFailedError(TallyError):
    """An epoch's write failed; `rolled_back` says whether nothing of it was applied."""

    cause_class: type[TallyError] | None = None

    def __init__(self, message: str, *, epoch: int | None = None, table: str | None = None,
                 owner_id: str | None = None, rolled_back: bool = False,
                 buckets_undone: int = 0):
        super().__init__(message)
        self.epoch = epoch
        self.table = table
        self.owner_id = owner_id
        self.rolled_back = rolled_back
        self.buckets_undone = buckets_undone

    def __reduce__(self):
        return _rebuild, (self.cause_class, self.args, dict(self.__dict__))


_TYPED: dict[type, type] = {}


def error_class(cause_class: type[TallyError] | None) -> type[EpochFailedError]:
    """EpochFailedError, or its subclass that is also `cause_class` (one per cause class)."""
    if cause_class is None or cause_class is TallyError or \
            issubclass(cause_class, EpochFailedError):
        return EpochFailedError
    typed = _TYPED.get(cause_class)
    if typed is None:
        typed = type(cause_class.__name__, (cause_class, EpochFailedError),
                     {"__module__": __name__, "__qualname__": cause_class.__name__,
                      "__doc__": f"{cause_class.__name__} that failed an epoch (see "
                                 "EpochFailedError)", "cause_class": cause_class})
        _TYPED[cause_class] = typed
    return typed


def _rebuild(cause_class, args, state):
    error = error_class(cause_class)(*args)
    error.__dict__.update(state)
    return error


def cause_of(failure: BaseException) -> tuple[type[TallyError] | None, str]:
    """The failure's Tally error class (None when it is not one) and a one-line summary.

    A Spark task's exception reaches the driver as text (a PythonException or a Java error
    holding the task's Python traceback): its last "module.Class: message" line that names a
    Tally error class already imported here gives the class back.
    """
    if isinstance(failure, TallyError):
        return type(failure), f"{type(failure).__name__}: {failure}"
    text = str(failure)
    typed, other = None, None
    for match in _ERROR_LINE.finditer(text):
        module, name, message = match.groups()
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and issubclass(found, TallyError):
            typed = (found, f"{name}: {message.strip()}")
        elif isinstance(found, type) and issubclass(found, BaseException) or \
                name.endswith(("Error", "Exception", "Failure")):
            other = f"{name}: {message.strip()}"
    if typed is not None:
        return typed
    if other is not None:
        return None, other
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return None, f"{type(failure).__name__}: {first[:500]}"


def epoch_failed(failure: BaseException, *, label: str, table: str, owner_id: str,
                 epoch: int, rolled_back: bool, buckets_undone: int = 0,
                 undo_error: BaseException | None = None) -> EpochFailedError:
    """The error to raise (from `failure`) for a failed epoch, typed after its cause."""
    cause_class, cause = cause_of(failure)
    if rolled_back:
        message = (f"{label} into {table} failed and was rolled back: nothing of it was "
                   f"applied ({buckets_undone} bucket(s) written before the failure were "
                   f"undone to the epoch's baseline). Cause: {cause}")
    else:
        message = (f"{label} into {table} failed, and rolling back what it had written failed "
                   f"too ({type(undo_error).__name__}: {undo_error}): part of it may be "
                   f"applied. Restart the writer with the same owner id '{owner_id}' (a "
                   "streaming query from the same checkpoint, a batch job with the same "
                   "client.column-lock.owner-id): its recovery undoes the partial epoch "
                   f"before it writes again. Cause: {cause}")
    return error_class(cause_class)(message, epoch=epoch, table=table, owner_id=owner_id,
                                    rolled_back=rolled_back, buckets_undone=buckets_undone)


_UNDONE = re.compile(r"\((\d+) bucket\(s\) written before the failure were undone")


def epoch_failed_again(cls: type[EpochFailedError], message: str) -> EpochFailedError:
    """An epoch's error rebuilt from its message alone (all a Spark exception hands back of
    the data source's commit): `rolled_back` and `buckets_undone` as `epoch_failed` wrote
    them into it; the epoch, table and owner are in the message only."""
    undone = _UNDONE.search(message)
    return cls(message, rolled_back=" failed and was rolled back: " in message,
               buckets_undone=int(undone.group(1)) if undone else 0)
