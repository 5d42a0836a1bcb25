"""Entry point of a measurement process: `python -m tally.bench.worker JOB JSON-ARGS`.

Each measurement runs in a fresh process so that one run's caches, allocator state and peak
memory cannot leak into the next. The protocol on stdout is line based: `progress <rows>` while
working, then one `result <json>` line that carries the job's result and the process's peak
RSS. Anything else (warnings) goes to stderr.
"""

from __future__ import annotations

import json
import resource
import sys

from tally.bench.workload import Workload


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM), falling back to getrusage."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def report_progress(rows: int) -> None:
    print(f"progress {rows}", flush=True)


def run(job: str, args: dict) -> dict:
    if job.startswith("rollup_"):
        from tally.bench import rollup_bench as rollups

        return rollups.run_job(job, args, report_progress)
    workload = Workload(**args["workload"])
    if job == "engine":
        from tally.bench import engine

        return engine.ingest(args["path"], workload, report_progress)
    if job == "naive":
        from tally.bench import naive

        return naive.ingest(args["path"], workload, report_progress)
    if job == "floor":
        from tally.bench import floor

        return floor.ingest(args["path"], workload, report_progress)
    if job == "duckdb":
        from tally.bench import duckdb_peer

        return duckdb_peer.ingest(args["path"], workload, report_progress)
    if job == "clickhouse":
        from tally.bench import clickhouse_peer

        return clickhouse_peer.ingest(args["path"], workload, report_progress)
    if job == "baseline":
        # what any engine process holds before its first put: interpreter, pyarrow, the engine's
        # code and one input batch; the rest of an engine run's peak is the engine's working set
        from tally.bench.workload import table_descriptor
        import merge_engine  # noqa: F401

        table_descriptor()
        workload.make_batch(0)
        return {}
    if job == "verify":
        from tally.bench import verify

        return verify.verify(args["side_path"], args["naive_path"], workload, args["samples"],
                             args["side"])
    raise SystemExit(f"unknown bench job {job!r}")


def main(argv: list[str]) -> None:
    job, raw = argv
    result = run(job, json.loads(raw))
    result["peak_rss_bytes"] = peak_rss_bytes()
    print("result " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
