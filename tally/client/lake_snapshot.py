"""What the coordinator knows of a table's lake copy: the Delta table, its version and how far
into each bucket's changelog that version reaches."""

from __future__ import annotations

import dataclasses

from locks.lease import offsets_from_json

Offsets = dict[tuple[str | None, int], int]


@dataclasses.dataclass(frozen=True)
class LakeSnapshot:
    """A lake table at one version. `offsets` is keyed like `admin.list_offsets`: the version
    holds every bucket's changes below its offset, and none at or above it (a bucket missing
    from it, of a partition created since, is not in the lake yet)."""

    path: str
    version: int
    offsets: Offsets

    @classmethod
    def from_status(cls, status: dict) -> "LakeSnapshot | None":
        if status.get("version") is None:
            return None
        return cls(status["path"], int(status["version"]), offsets_from_json(status["offsets"]))


@dataclasses.dataclass(frozen=True)
class LakeStatus:
    """`admin.lake_status`: how far a table's lake is, and its last tiering round."""

    name: str
    table_id: int
    path: str | None
    snapshot: LakeSnapshot | None
    tier_id: str | None          # the tiering process that holds the table now
    tiering_epoch: int
    freshness_ms: int
    log_offsets: dict[tuple[str | None, int], tuple[int, int]]
    committed_at: float | None   # when the coordinator learnt of the lake's last commit
    last_round: dict | None      # rows, duration_ms, finished_at of the holder's last round
    error: str | None            # why the holder's last round failed, if it did
    retention_ignores_lake: bool
    lag_seconds: float = 0.0     # since the lake last held every change (0 while it does)
    retention_alert: str | None = None  # why the lake lags further than retention allows
    holder_live: bool = False    # whether the holder heartbeats (a killed one still holds)

    @classmethod
    def from_json(cls, doc: dict) -> "LakeStatus":
        return cls(doc["name"], int(doc["table_id"]), doc.get("path"),
                   LakeSnapshot.from_status(doc), doc.get("tier_id"),
                   int(doc.get("tiering_epoch", 0)), int(doc["freshness_ms"]),
                   {(p, int(b)): (int(s), int(e)) for p, b, s, e in doc["log_offsets"]},
                   doc.get("committed_at"), doc.get("round"), doc.get("error"),
                   bool(doc.get("retention_ignores_lake")), float(doc.get("lag_seconds", 0.0)),
                   doc.get("retention_alert"), bool(doc.get("holder_live")))

    def lag_records(self) -> dict[tuple[str | None, int], int]:
        """Per bucket, how many changelog records are not in the lake yet."""
        lake = self.snapshot.offsets if self.snapshot else {}
        return {key: max(0, end - lake.get(key, 0)) for key, (_s, end) in self.log_offsets.items()}
