"""A changelog stream of a Tally table into per-batch files, as a subprocess tests can SIGKILL.

    python -m tests.spark.changelog_job '<json spec>'

spec: url, table, out (directory of batch files), checkpoint, options (stream options), kill
(null or a batch id: the first attempt of that micro-batch saves what it got as
`attempt-<id>.json`, then SIGKILLs the JVM and this driver, mid-batch). The job reads what the
changelog holds (Trigger.AvailableNow) and exits 0. `Batches` is the sink, shared with the
in-process tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys


class Batches:
    """A foreachBatch sink keeping each micro-batch's rows in a file named by its batch id (a
    replayed batch replaces its first attempt); `crash_at` makes the first attempt of that
    batch save what it got and then fail (an exception, or with `kill_pids` a SIGKILL)."""

    def __init__(self, directory, kill_pids=None):
        self.directory = directory
        self.crash_at = None
        self.kill_pids = kill_pids
        os.makedirs(directory, exist_ok=True)

    def __call__(self, df, batch_id):
        rows = [(r["_partition"], r["_bucket"], r["_offset"], r["_change_type"], r["k"], r["a"])
                for r in df.collect()]
        if batch_id == self.crash_at and not os.path.exists(self._path(f"attempt-{batch_id}")):
            self._save(f"attempt-{batch_id}", rows)
            if self.kill_pids:
                for pid in reversed(self.kill_pids):  # the JVM first, then this driver
                    os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"injected crash in micro-batch {batch_id}")
        self._save(f"batch-{batch_id:05d}", rows)

    def _path(self, name):
        return os.path.join(self.directory, name + ".json")

    def _save(self, name, rows):
        path = self._path(name)
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(path + ".tmp", path)

    def load(self, name):
        with open(self._path(name)) as f:
            return [tuple(r) for r in json.load(f)]

    def batch_count(self):
        return sum(1 for n in os.listdir(self.directory) if n.startswith("batch-"))

    def delivered(self):
        names = sorted(n[:-5] for n in os.listdir(self.directory) if n.startswith("batch-"))
        return [row for name in names for row in self.load(name)]


def main(spec: dict) -> int:
    from tests.spark.conftest import spark_builder

    import sink

    spark = spark_builder().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sink.register(spark)
    pids = [os.getpid(), int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())]
    batches = Batches(spec["out"], kill_pids=pids)
    batches.crash_at = spec.get("kill")
    reader = (spark.readStream.format("tally").option("url", spec["url"])
              .option("table", spec["table"]).option("changelog", "true"))
    for key, value in (spec.get("options") or {}).items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(batches)
             .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception:  # noqa: BLE001 - reported below through query.exception()
        pass
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 2
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
