"""What the lake operations tests share: lake tables, writes, waiting for the lake to catch up,
scraping the coordinator's metrics and running `tally` in-process."""

from __future__ import annotations

import itertools
import urllib.request

import deltalake
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from merge_engine import Schema, TableDescriptor
from tally.cli.main import main
from tests.waiting import wait_until

_names = itertools.count()


def lake_table(conn, buckets: int = 2, name: str | None = None, **properties) -> str:
    """A new aggregation table tiering every second (its name)."""
    name = name or f"default.lake{next(_names)}"
    schema = (Schema.builder().column("k", pa.string()).agg_column("n", pa.int64(), "sum")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=buckets, properties={
        "table.merge-engine": "aggregation", "table.datalake.enabled": "true",
        "table.datalake.freshness": "1s", **properties}))
    return name


def write(conn, name: str, keys, n: int = 1, **columns) -> None:
    keys = list(keys)
    writer = conn.table(name).upsert_writer()
    writer.upsert(pa.table({"k": keys, "n": [n] * len(keys),
                            **{c: [v] * len(keys) for c, v in columns.items()}}))
    writer.flush()


def caught_up(conn, name: str):
    """The lake status once the lake holds every change written so far (None before)."""
    ends = conn.admin.list_offsets(name)
    status = conn.admin.lake_status(name)
    snapshot = status.snapshot
    if snapshot is None or any(snapshot.offsets.get(k, 0) < e for k, e in ends.items()):
        return None
    return status


def wait_tiered(conn, name: str):
    return wait_until(lambda: caught_up(conn, name), f"the lake of {name} catching up")


def lake_rows(path: str) -> list[dict]:
    return deltalake.DeltaTable(path).to_pyarrow_table().sort_by("k").to_pylist()


def live_rows(conn, name: str) -> list[dict]:
    return conn.table(name).to_arrow().sort_by("k").to_pylist()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one endpoint, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=60) as answer:
        text = answer.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, table: str) -> float | None:
    return samples.get((name, frozenset({("table", table)})))


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()  # what earlier client calls logged (a retry after a table's creation)
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err
