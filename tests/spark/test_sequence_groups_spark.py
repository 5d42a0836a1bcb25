"""Two partial TallySink writers of one table, each with its own sequence group: their batches
arrive with sequences out of order (a later batch holds older rows), and each group's last and
first values follow its own sequence, as the reference model says. A writer that leaves out
its group's sequence is refused on the driver."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest

import tally
from merge_engine.testing import ReferenceTable
from sink import TallySink
from sink.spark_errors import tally_error_in
from tally.errors import InvalidInputError

SCHEMA = (tally.Schema.builder().column("k", pa.int64())
          .column("sa", pa.int64())
          .agg_column("a_last", pa.string(), tally.AggFunction.LAST_VALUE)
          .agg_column("a_total", pa.int64(), tally.AggFunction.SUM)
          .column("sb", pa.int64())
          .column("b_last", pa.string())  # last_value_ignore_nulls
          .agg_column("b_first", pa.string(), tally.AggFunction.FIRST_VALUE)
          .primary_key("k").build())
PROPERTIES = {"table.merge-engine": "aggregation", "fields.sa.sequence-group": "a_last,a_total",
              "fields.sb.sequence-group": "b_last,b_first"}
WRITERS = {"a": (["k", "sa", "a_last", "a_total"], "k long, sa long, a_last string, a_total long"),
           "b": (["k", "sb", "b_last", "b_first"], "k long, sb long, b_last string, b_first string")}


def batches(seed: int) -> list[tuple[str, list[dict]]]:
    """Each writer's rows cut into two batches, the second holding the older half of its
    sequences (shuffled), the writers' batches interleaved."""
    rng = random.Random(seed)
    out = {}
    for writer in WRITERS:
        rows = []
        for s in rng.sample(range(1000), 60):
            k = rng.randrange(6)
            if writer == "a":
                rows.append({"k": k, "sa": s, "a_last": f"a{s}", "a_total": 1})
            else:
                rows.append({"k": k, "sb": s, "b_last": None if rng.random() < 0.3 else f"b{s}",
                             "b_first": f"b{s}"})
        sequence = "sa" if writer == "a" else "sb"
        rows.sort(key=lambda r: -r[sequence])  # newest first: the later batch is older
        newer, older = rows[:30], rows[30:]
        rng.shuffle(newer)
        rng.shuffle(older)
        out[writer] = [newer, older]
    return [("a", out["a"][0]), ("b", out["b"][0]), ("a", out["a"][1]), ("b", out["b"][1])]


def test_two_partial_writers_follow_their_own_groups_sequence(spark, cluster, conn):
    conn.admin.create_database("sparkgroups", ignore_if_exists=True)
    name = f"sparkgroups.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_table(name, tally.TableDescriptor(SCHEMA, bucket_count=2,
                                                       properties=PROPERTIES))
    model = ReferenceTable(SCHEMA, PROPERTIES)
    epochs = {"a": 0, "b": 0}
    for writer, rows in batches(seed=11):
        columns, ddl = WRITERS[writer]
        TallySink(cluster.url, name, options={
            "columns": ",".join(columns), "client.column-lock.owner-id": f"groups-{writer}",
            "epoch": str(epochs[writer])}).write(spark.createDataFrame(rows, ddl).repartition(3))
        epochs[writer] += 1
        model.put(rows, target_columns=columns)
    assert conn.table(name).to_arrow().to_pylist() == model.rows()
    # The last values are the newest sequences' although those arrived first.
    row = conn.table(name).lookup({"k": model.rows()[0]["k"]})
    assert row["a_last"] == f"a{row['sa']}"

    with pytest.raises(Exception) as refused:
        TallySink(cluster.url, name, options={
            "columns": "k,a_total", "client.column-lock.owner-id": "groups-c"}).write(
                spark.createDataFrame([{"k": 1, "a_total": 5}], "k long, a_total long"))
    error = tally_error_in(refused.value)
    assert isinstance(error, InvalidInputError) and "'sa'" in str(error), refused.value
    assert conn.table(name).to_arrow().to_pylist() == model.rows()
