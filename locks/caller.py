"""Who the call being served comes from, for the checks that depend on it (owner ids,
consumer names).

The Flight service authenticates a call, then runs its handler inside `calling_as(principal)`;
a handler reads `caller()`. Outside any served call (a server's own in-process work, a test
driving the services directly) there is no caller: `caller()` is None, which the checks treat
as the servers themselves.
"""

from __future__ import annotations

import contextlib
import contextvars

_CALLER: contextvars.ContextVar = contextvars.ContextVar("tally_caller", default=None)


def caller():
    """The principal of the call being served, or None outside one."""
    return _CALLER.get()


@contextlib.contextmanager
def calling_as(principal):
    token = _CALLER.set(principal)
    try:
        yield principal
    finally:
        _CALLER.reset(token)
