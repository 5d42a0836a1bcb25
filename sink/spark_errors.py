"""Tally's errors as Spark shows them, and back.

The data source's driver-side methods (its schema, readers and writers) run in a Python
worker that Spark starts for planning; an exception there reaches the user as Spark's
`AnalysisException` (or a failed query's `StreamingQueryException`) whose text is the
worker's formatted exception. By default that is the whole Python traceback, so Tally's one
line came after 12 to 26 lines of frames. `one_line` has a Tally error raised there formatted
as Spark's own `spark.sql.execution.pyspark.udf.hideTraceback.enabled` formats every error:
the exception's line alone, so the first line of Spark's message reads

    [PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer:
    tally.errors.InvalidInputError: DataFrame column 'color' is not a column of table ...

(one line; cut in two here).

Other errors (a bug, not a refusal) keep their traceback. `tally_errors()` turns such a Spark
exception back into the Tally error it carries: its class, its message as the whole of
`str(error)`, Spark's exception kept as `spark_error`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

from tally.errors import TallyError

# Read by pyspark's worker when it formats the exception a planning call raised: set, only
# the exception's own line is sent to the JVM.
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"

# "package.module.Class: message" anywhere in a line: after Spark's prefix on the same line,
# or a traceback's last line.
_ERROR = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)+)([A-Za-z_]\w*): ([^\n]*)")
_SQLSTATE = re.compile(r"\s+SQLSTATE: \w+$")

_unset = object()
_before = _unset  # the variable's value before this process hid a traceback, to restore


def one_line(method):
    """Decorate a data source method that runs in Spark's planning worker: a Tally error it
    raises reaches the user as its one line. Spark starts a new worker after a failed
    planning call, so the setting dies with the worker; it is undone anyway when the next
    call of the source runs in a worker that was reused."""

    @functools.wraps(method)
    def planned(*args, **kwargs):
        _restore()
        try:
            return method(*args, **kwargs)
        except TallyError:
            _hide_traceback()
            raise

    return planned


def _hide_traceback() -> None:
    global _before
    if _before is _unset:
        _before = os.environ.get(HIDE_TRACEBACK)
    os.environ[HIDE_TRACEBACK] = "1"


def _restore() -> None:
    global _before
    if _before is _unset:
        return
    if _before is None:
        os.environ.pop(HIDE_TRACEBACK, None)
    else:
        os.environ[HIDE_TRACEBACK] = _before
    _before = _unset


def tally_error_in(error: BaseException) -> TallyError | None:
    """The Tally error a Spark exception carries (its text names the class: the last
    "module.Class: message" naming a Tally error class), built again; None if it carries
    none. A Tally error is returned as it is."""
    if isinstance(error, TallyError):
        return error
    found = None
    for match in _ERROR.finditer(str(error)):
        module, name, message = match.group(1)[:-1], match.group(2), match.group(3)
        cls = _tally_class(module, name)
        if cls is not None:
            found = (cls, _SQLSTATE.sub("", message.strip()))
    if found is None:
        return None
    cls, message = found
    from sink.epoch_errors import EpochFailedError, epoch_failed_again

    if issubclass(cls, EpochFailedError):
        return epoch_failed_again(cls, message)
    rebuilt = cls.__new__(cls)
    Exception.__init__(rebuilt, message)  # its text is the message, whatever its __init__
    return rebuilt


def _tally_class(module: str, name: str) -> type[TallyError] | None:
    found = getattr(sys.modules.get(module), name, None)
    if found is None and module == "sink.epoch_errors":
        # an EpochFailedError typed after its cause: a class made on the fly, not a module
        # attribute (sink.epoch_errors.error_class)
        from sink.epoch_errors import error_class
        from tally import errors

        cause = errors.error_class(name)
        found = error_class(None if cause is TallyError else cause)
    return found if isinstance(found, type) and issubclass(found, TallyError) else None


def _from_spark(error: BaseException) -> bool:
    return type(error).__module__.startswith(("pyspark.", "py4j."))


@contextlib.contextmanager
def tally_errors():
    """Within it, a Spark exception (from pyspark or py4j) that carries a Tally error is
    raised as that Tally error: `except tally.errors.InvalidInputError` catches a write's
    unknown column, and `str(error)` is Tally's message alone. Spark's exception is the
    error's `spark_error`. Also a decorator."""
    try:
        yield
    except Exception as e:
        found = None if isinstance(e, TallyError) or not _from_spark(e) else tally_error_in(e)
        if found is None:
            raise
        found.spark_error = e
        # not chained: a traceback printed would show Spark's dozens of lines first
        raise found from None
