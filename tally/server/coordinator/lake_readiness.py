"""Whether the cluster can tier a table at all, checked when a table's lake is turned on, so
that a lake which would never fill is refused at once instead of lagging in silence.

Two things must hold: the coordinator has a lake directory (`--datalake-dir`), and some
tiering process can import deltalake. Tiering processes say so themselves: each heartbeat
carries the deltalake version the process imported (`tally tier` refuses to start without
one). A live process that reports a version is enough. With none live (no process started yet,
or the coordinator just restarted and has heard no heartbeat), the coordinator's own Python
stands in: a local cluster runs its tiering processes in that same environment, and an operator
who starts them elsewhere can start one before enabling the lake.

The processes heard from are kept in memory only, like their liveness (a restarted coordinator
learns them again from the next heartbeats); one silent for an hour is forgotten.
"""

from __future__ import annotations

import importlib
import threading

from tally.errors import LakeSetupError, MissingDependencyError

LAKE_INSTALL = "pip install 'tally-aggregates[lake]'"  # the extra that brings deltalake
FORGET_AFTER = 3600.0  # seconds of silence after which a tiering process is no longer listed
UNKNOWN = object()  # a heartbeat that did not say (a tiering process of an older version)

_imported: str | None = None


def deltalake_version() -> str | None:
    """The deltalake version this process can import, or None. A failed import is tried again
    next time (the package may have been installed meanwhile)."""
    global _imported
    if _imported is None:
        try:
            module = importlib.import_module("deltalake")
        except Exception:  # noqa: BLE001 - missing, or installed but broken: cannot tier either way
            return None
        _imported = str(getattr(module, "__version__", "unknown"))
    return _imported


def require_deltalake(who: str) -> None:
    """MissingDependencyError, naming the extra, unless this process can import deltalake."""
    if deltalake_version() is None:
        raise MissingDependencyError(f"{who} need the deltalake package, which this Python "
                                     f"cannot import: {LAKE_INSTALL} (in a clone: pip install "
                                     "-e '.[lake]')")


class TierProcesses:
    """The tiering processes heard from: when each last heartbeated, and its deltalake."""

    def __init__(self, clock, timeout: float) -> None:
        self.clock = clock
        self.timeout = timeout
        self._seen: dict[str, tuple[float, object]] = {}  # tier id -> (clock, deltalake)
        self._lock = threading.Lock()

    def heard(self, tier_id: str, deltalake=UNKNOWN) -> None:
        """A heartbeat or report from `tier_id`; `deltalake` the version it imported (a
        heartbeat that names none is refused: that process cannot tier)."""
        if deltalake is None:
            raise MissingDependencyError(
                f"tiering process {tier_id} cannot import deltalake, so it gets no tables: "
                f"{LAKE_INSTALL} in its environment")
        now = self.clock()
        with self._lock:
            known = self._seen.get(tier_id, (now, UNKNOWN))[1]
            self._seen[tier_id] = (now, known if deltalake is UNKNOWN else deltalake)
            for other, (seen, _) in list(self._seen.items()):
                if now - seen > FORGET_AFTER:
                    del self._seen[other]

    def last_seen(self, tier_id: str) -> float | None:
        with self._lock:
            entry = self._seen.get(tier_id)
        return entry[0] if entry is not None else None

    def is_live(self, tier_id: str | None, now: float | None = None) -> bool:
        seen = self.last_seen(tier_id) if tier_id is not None else None
        now = self.clock() if now is None else now
        return seen is not None and now - seen <= self.timeout

    def live(self, now: float) -> set[str]:
        with self._lock:
            return {t for t, (seen, _) in self._seen.items() if now - seen <= self.timeout}

    def listing(self) -> list[dict]:
        """Every process heard from within the last hour: id, seconds since its last word,
        whether it counts as live, and its deltalake version (None: it did not say)."""
        now = self.clock()
        with self._lock:
            entries = sorted(self._seen.items())
        return [{"tier_id": t, "seen_seconds_ago": round(now - seen, 3),
                 "live": now - seen <= self.timeout,
                 "deltalake": None if version is UNKNOWN else version}
                for t, (seen, version) in entries]

    def able(self) -> list[str]:
        """The live processes that imported deltalake."""
        now = self.clock()
        with self._lock:
            return sorted(t for t, (seen, version) in self._seen.items()
                          if now - seen <= self.timeout and isinstance(version, str))


def unready(root: str | None, processes: TierProcesses) -> str | None:
    """Why nothing could tier a table now, naming the fix; None when something could."""
    if root is None:
        return ("the coordinator has no lake directory: start it with --datalake-dir URI "
                "(LocalCluster(..., datalake_dir=...))")
    if processes.able() or deltalake_version() is not None:
        return None
    return ("no tiering process can import deltalake (no live `tally tier` reports it and the "
            f"coordinator's Python cannot import it): {LAKE_INSTALL} where `tally tier` runs "
            "and start one")


def check_can_tier(root: str | None, processes: TierProcesses, name: str) -> None:
    """Refuse (LakeSetupError naming the fix) to turn on the lake of table `name` when nothing
    could ever tier it."""
    why = unready(root, processes)
    if why is not None:
        raise LakeSetupError(f"table.datalake.enabled = true refused for table '{name}': {why}; "
                             "nothing was changed")
