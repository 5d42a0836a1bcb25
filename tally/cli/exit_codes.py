"""What a `tally` command's exit status means, and the one line it prints when it fails.

Scripts branch on the status: 2 (usage) means fix the command line, 3 (not found) that the
table, partition or key is absent, 4 (unreachable) that retrying later may help, 5 (denied)
that the credentials are wrong. The traceback is for `--verbose` only: a user needs the
message, a developer the stack.

A `tally serve` that cannot start follows the same rule: 1 for a port another process holds
(a conflict, like an existing table), 2 for a path or value it cannot use, 4 for a ZooKeeper it
cannot reach.
"""

from __future__ import annotations

import sys
import traceback

from tally.errors import (AlreadyExistsError, AuthenticationError, ClusterError,
                          InvalidInputError, NotFoundError, PermissionDeniedError, SchemaError,
                          TallyError)

OK = 0
FAILED = 1        # any other error: a conflict, an existing table, a server-side failure
USAGE = 2         # bad arguments or options (argparse's own status for the same fault)
NOT_FOUND = 3     # no such database, table, partition, bucket or key
UNREACHABLE = 4   # the cluster could not be reached or did not answer
DENIED = 5        # authentication or permission refused
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

# Most specific first: InvalidOptionError is a SchemaError, UnavailableError a ClusterError.
_CODES = ((NotFoundError, NOT_FOUND), (SchemaError, USAGE), (InvalidInputError, USAGE),
          (AuthenticationError, DENIED), (PermissionDeniedError, DENIED),
          (AlreadyExistsError, FAILED), (ClusterError, UNREACHABLE))


class NoRowError(NotFoundError):
    """A lookup found no row with the key (exit 3, like any other thing not found)."""


def exit_code(error: BaseException) -> int:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return FAILED


def report(error: BaseException, verbose: bool) -> int:
    """Print `tally: <message>` (and the traceback when `verbose`) to stderr; the exit status."""
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if not isinstance(error, TallyError):
        # Not one of Tally's own errors: name the type, since the message alone may be cryptic.
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
        if not verbose:
            message += " (--verbose shows the traceback)"
    print(f"tally: {message}", file=sys.stderr)
    return exit_code(error)
