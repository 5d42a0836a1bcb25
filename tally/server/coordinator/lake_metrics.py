"""The coordinator's lake metrics, on its ServerMetrics registry.

Counters move with the holders' reports (`tier_report`): a round counts once, when its report
moves the lake's version on, so a report sent again is not counted twice. Gauges are read at
each scrape from the lake registry: one end-offsets request per lake table (to its buckets'
leaders), the same numbers `lake_status` gives. A table dropped, or whose buckets cannot be
reached, during a scrape loses its series for that scrape (its lag in seconds stays when only
the offsets failed); the scrape itself never fails for it.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


class LakeMetrics:
    def __init__(self, metrics, lake) -> None:
        """`metrics`: the coordinator's ServerMetrics; `lake`: its LakeRegistry."""
        r = metrics.registry
        self.rounds = Counter("tally_lake_rounds",
                              "Tiering rounds that committed to the lake table (whole-table "
                              "copies included)", ("table",), registry=r)
        self.rows = Counter("tally_lake_merged_rows",
                            "Rows the committed rounds merged into the lake table (net changes "
                            "per key; a whole-table copy counts every row)", ("table",),
                            registry=r)
        self.errors = Counter("tally_lake_round_errors",
                              "Tiering rounds that failed (each retry counts)", ("table",),
                              registry=r)
        r.register(_LakeCollector(lake))

    def reported(self, table: str, round_info: dict | None, error: str | None,
                 advanced: bool) -> None:
        """A holder's report was taken; `advanced`: it moved the lake's version on."""
        if error is not None:
            self.errors.labels(table).inc()
        if advanced and round_info is not None and round_info.get("committed", True):
            self.rounds.labels(table).inc()
            rows = round_info.get("rows")
            if isinstance(rows, int) and not isinstance(rows, bool) and 0 <= rows < 2**63:
                self.rows.labels(table).inc(rows)

    def dropped(self, table: str) -> None:
        """Forget a dropped table's series: a table re-created under its name starts at 0."""
        for counter in (self.rounds, self.rows, self.errors):
            counter.remove(table)


class _LakeCollector:
    def __init__(self, lake) -> None:
        self._lake = lake

    def collect(self):
        records = GaugeMetricFamily("tally_lake_lag_records",
                                    "Changelog records not in the lake table yet, over the "
                                    "table's buckets", labels=["table"])
        seconds = GaugeMetricFamily("tally_lake_lag_seconds",
                                    "Seconds since the lake table last held every change (0 "
                                    "while it does)", labels=["table"])
        alerts = GaugeMetricFamily("tally_lake_retention_alert",
                                   "1 while the lake falls further behind than the table's "
                                   "changelog retention allows (tally lake says why)",
                                   labels=["table"])
        try:
            healths = self._lake.healths()
        except Exception as e:  # noqa: BLE001 - the metadata store is away: no lake series
            log.info("lake status not read for metrics: %s", e)
            healths = []
        for name, lag_seconds, health in sorted(healths, key=lambda h: h[0]):
            seconds.add_metric([name], lag_seconds)
            if health is not None:
                records.add_metric([name], health.total_lag)
                alerts.add_metric([name], 1 if health.retention_alert else 0)
        yield records
        yield seconds
        yield alerts
