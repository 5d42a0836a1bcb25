"""A streaming job into Tally, run as a subprocess so tests can SIGKILL it and restart it.

    python -m tests.spark.stream_job '<json spec>'

spec: url, table, source (a directory of JSON-lines files, one file per micro-batch), checkpoint,
columns (target columns or null), options (sink options), format ("sink", the default:
TallySink; "tally": writeStream.format("tally")), kill (null or {"point", "epoch", "bucket"}):
  point "task":          SIGKILL from inside a bucket's write of that epoch (bucket >= "bucket"),
                         after half its writes: a TallySink write task or driver delivery,
                         or the data source's commit process
  point "server":        SIGKILL of the tablet server "server_pid" from inside a bucket's write
                         of that epoch; the job goes on (replicated tables fail over)
  point "before_commit": SIGKILL on the driver after every task wrote, before the sink commits
  point "after_commit":  SIGKILL after the sink's commit, before Spark's own commit log
(before_commit and after_commit: TallySink only, whose commit runs on the driver.)
The job processes every file present (availableNow, one file per trigger) and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile


def main(spec: dict) -> int:
    kill = spec.get("kill")
    kill_file = None
    if kill:
        kill_file = os.path.join(tempfile.mkdtemp(prefix="tally-kill-"), "kill.json")
        os.environ["TALLY_TEST_KILL_FILE"] = kill_file
    from tests.spark.conftest import spark_builder

    spark = spark_builder(spec.get("master", "local[2,4]")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    pids = [os.getpid(), int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())]
    if kill:
        with open(kill_file, "w") as f:
            json.dump({**kill, "pids": pids}, f)
        if kill["point"] in ("before_commit", "after_commit"):
            _kill_around_commit(kill, pids)

    frame = (spark.readStream.schema(spec["schema"]).option("maxFilesPerTrigger", 1)
             .json(spec["source"]))
    if spec.get("select"):
        frame = frame.select(*spec["select"])
    hook = None if not kill else "tests.spark.hooks:kill_tablet_server" \
        if kill["point"] == "server" else "tests.spark.hooks:kill_job"
    if spec.get("format") == "tally":
        query, owners = _start_data_source(spark, spec, frame, hook), lambda: []
    else:
        from sink import TallySink

        sink = TallySink(spec["url"], spec["table"], target_columns=spec.get("columns"),
                         options=spec.get("options") or {}, fail_hook=hook)
        query = sink.start(frame, spec["checkpoint"], trigger={"availableNow": True})
        owners = sink.owner_ids
    try:
        query.awaitTermination()
    except Exception:  # noqa: BLE001 - reported below through query.exception()
        pass
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 2
    print(json.dumps({"query_id": str(query.id), "owners": owners()}))
    spark.stop()
    return 0


def _start_data_source(spark, spec: dict, frame, hook: str | None):
    import sink

    sink.register(spark)
    writer = (frame.writeStream.format("tally").option("url", spec["url"])
              .option("table", spec["table"]).option("checkpointLocation", spec["checkpoint"]))
    options = dict(spec.get("options") or {})
    if spec.get("columns"):
        options["columns"] = ",".join(spec["columns"])
    if hook:
        options["fail-hook"] = hook
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(availableNow=True).start()


def _kill_around_commit(kill: dict, pids: list[int]) -> None:
    from sink import remote

    real_commit = remote.commit_together

    def commit(conn, commits, epoch):
        if epoch == kill["epoch"] and kill["point"] == "before_commit":
            _kill(pids)
        done = real_commit(conn, commits, epoch)
        if epoch == kill["epoch"] and kill["point"] == "after_commit":
            _kill(pids)
        return done

    remote.commit_together = commit


def _kill(pids: list[int]) -> None:
    for pid in reversed(pids):  # the JVM first, then this driver process
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
