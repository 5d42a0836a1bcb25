"""Markdown tables of each benchmark's results, for `tally bench --report`.

One function per benchmark, named like it in tally.bench.suite, taking exactly what that
benchmark's `run()` returned. The numbers are formatted the same way as the text renderings
each benchmark module prints, so the report and the terminal agree.
"""

from __future__ import annotations


def table(headers: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    """A markdown table; columns from `numeric_from` on are right-aligned. Cells are already
    formatted text (`1,000`, `1.5x`): tabulate must not parse them as numbers again."""
    from tabulate import tabulate

    align = ["left" if i < numeric_from else "right" for i in range(len(headers))]
    return tabulate(rows, headers, tablefmt="pipe", colalign=align, disable_numparse=True)


def _mark(good: bool) -> str:
    return "met" if good else "MISSED"


def ingest(results: list[dict]) -> str:
    from tally.bench.ingest import HEADERS, problems, rss_line, table_rows, versions_line

    parts = [table(HEADERS, table_rows(results))]
    for line in (versions_line(results), rss_line(results)):
        if line:
            parts.append(line[0].upper() + line[1:] + ".")
    found = problems(results)
    if found:
        parts.append("Verification problems:\n\n" + "\n".join(f"- {p}" for p in found))
    return "\n\n".join(parts)


def cluster(result: dict) -> str:
    ip, cl, lk = result["in_process"], result["cluster"], result["lookup"]
    throughput = table(["side", "rows/s", "seconds"], [
        ["in-process `KvTablet.put`", f"{ip['rows_per_s']:,.0f}", f"{ip['seconds']:.2f}"],
        [f"client -> LocalCluster ({result['tablet_servers']} tablet servers, "
         f"{result['buckets']} buckets)", f"{cl['rows_per_s']:,.0f}", f"{cl['seconds']:.2f}"],
    ])
    ratio_ok = result["ratio"] >= result["throughput_target"]
    latency = table(["single-key lookups", "p50 ms", "p99 ms", "max ms"], [
        [f"`table.lookup` over Flight ({lk['count']:,})", f"{lk['p50_ms']:.3f}",
         f"{lk['p99_ms']:.3f}", f"{lk['max_ms']:.1f}"],
        ["no-op Flight round trip (the floor, in turn with the lookups)",
         f"{lk['noop_p50_ms']:.3f}", f"{lk['noop_p99_ms']:.3f}", ""],
    ])
    many = result["lookup_many"]
    throughputs = table(["key lookups", "keys/s"], [
        ["`table.lookup`, one key at a time", f"{many['single_keys_per_s']:,.0f}"],
        [f"`table.lookup_many`, {many['keys']:,} keys a call", f"{many['keys_per_s']:,.0f}"],
    ])
    verify = result["verify"]
    return "\n\n".join([
        f"Workload: {result['workload']}.",
        throughput,
        f"Ratio cluster / in-process: **{result['ratio']:.2f}x** (target >= "
        f"{result['throughput_target']}x: {_mark(ratio_ok)}).",
        latency,
        f"Lookup p99 target < {result['p99_target_ms']} ms: "
        f"{_mark(lk['p99_ms'] < result['p99_target_ms'])}; lookup p99 / no-op p99: "
        f"**{lk['p99_vs_noop']:.2f}x** (target <= {result['p99_vs_noop_target']}x: "
        f"{_mark(lk['p99_vs_noop'] <= result['p99_vs_noop_target'])}).",
        throughputs,
        f"`lookup_many` / single lookups: **{many['ratio']:.1f}x** (target >= "
        f"{result['many_target']:g}x: {_mark(many['ratio'] >= result['many_target'])}). "
        f"Verification: {verify['samples']} sampled keys, {verify['mismatches']} mismatches.",
    ])


def undo(results: list[dict]) -> str:
    from tally.bench.undo import TARGET_RATIO, target_mark

    rows = [[f"{r['table_rows']:,}", f"{r['batch_keys']:,}", f"{r['write_s']:.3f}",
             f"{r['undo_s']:.3f}", f"{r['ratio']:.2f}x",
             target_mark(r), "yes" if r["verified"] else "NO"]
            for r in results]
    return table(["table rows", "batch keys", "write s", "undo s", "undo / write",
                  f"target <= {TARGET_RATIO}x", "verified"], rows, numeric_from=0)


def spark(result: dict) -> str:
    from tally.bench.spark import target_lines

    rows = [[leg["system"], f"{leg['rows_per_s']:,.0f}", f"{leg['seconds']:.1f}",
             " / ".join(f"{s:.1f}" for s in leg["round_seconds"]),
             "yes" if leg["verified"] else "NO"] for leg in result["legs"]]
    ratios = ", ".join(f"Tally / {system}: **{ratio:.2f}x**"
                       for system, ratio in result["tally_over"].items())
    parts = [
        f"{result['rows']:,} source rows over {result['keys']:,} keys in "
        f"{result['micro_batches']} micro-batches (sum per key); after an untimed warm-up "
        f"round, {result['rounds']} timed rounds in rotated leg order, each leg's median counts. "
        "The no-op shape is TallySink's task shape (mapInArrow, shuffle, mapInArrow) with no "
        "store behind it.",
        table(["sink", "rows/s", "median seconds", "rounds (s)", "verified"], rows),
        f"{ratios}; Tally / the no-op shape: {result['tally_share_of_noop']:.2f}x.",
    ]
    latency = result.get("latency")
    if latency:
        parts.append(
            f"Latency: micro-batches of {latency['rows_per_batch']:,} rows, one file each, "
            f"{latency['batches']} per query (the first {latency['skipped']} left out), "
            f"{latency['rounds']} alternating rounds; a batch's time is Spark's "
            "`triggerExecution`. The Tally batch ends with a point lookup of one of its keys, "
            "which must read the key's new totals (every batch visible: "
            f"{'yes' if latency['visible'] else 'NO'}).")
        parts.append(table(["query", "median ms", "p90 ms", "batches"], [
            [name, f"{leg['median_ms']:.0f}", f"{leg['p90_ms']:.0f}", str(leg["count"])]
            for name, leg in latency["legs"].items()]))
    parts.append("Targets: " + "; ".join(target_lines(result)) + ".")
    return "\n\n".join(parts)


def spark_read(result: dict) -> str:
    rows = [[leg["system"], f"{leg['rows_per_s']:,.0f}", f"{leg['seconds']:.2f}",
             " / ".join(f"{s:.2f}" for s in leg["round_seconds"]), str(leg["partitions"]),
             "yes" if leg["verified"] else "NO"] for leg in result["legs"]]
    ratios = ", ".join(f"Tally / {system}: **{ratio:.2f}x**"
                       for system, ratio in result["tally_over"].items())
    jvm = result.get("jvm_over", {})
    if jvm:
        ratios += "; the JVM reader (`sink.read_table`): " + ", ".join(
            f"/ {system}: **{ratio:.2f}x**" for system, ratio in jvm.items()
            if not system.startswith("tally"))
    best = max(result["tally_over"].get("postgresql", 0), jvm.get("postgresql", 0))
    return "\n\n".join([
        f"{result['rows']:,} rows read by Spark from each system ({result['buckets']} buckets "
        f"in Tally, read in {result.get('spark_partitions', result['buckets'])} Spark "
        f"partitions); after an untimed warm-up round, {result['rounds']} timed rounds in "
        "rotated order, each leg's median counts.",
        table(["source", "rows/s", "median seconds", "rounds (s)", "Spark partitions",
               "verified"], rows),
        f"{ratios}. Target: Tally >= 2x PostgreSQL over JDBC: "
        f"{_mark(best >= 2.0)}."
        + (f" Rows flushed to RocksDB (`tally-stored`): **{result['stored_over_postgresql']:.2f}x**"
           " PostgreSQL: a scan steps RocksDB's iterator once per row."
           if "stored_over_postgresql" in result else "")
        + (f" The JVM reader of those rows: **{result['jvm_stored_over_postgresql']:.2f}x**."
           if "jvm_stored_over_postgresql" in result else ""),
    ])


def replication(result: dict) -> str:
    f = result["failover"]
    def rounds(side: dict) -> str:
        return ", ".join(f"{r:,.0f}" for r in side.get("rounds", [side["rows_per_s"]]))

    ingest = table(["table", "rows/s (median round)", "seconds", "every round's rows/s"], [
        ["replication factor 1", f"{result['rf1']['rows_per_s']:,.0f}",
         f"{result['rf1']['seconds']:.2f}", rounds(result["rf1"])],
        ["replication factor 3 (min.insync.replicas 2)", f"{result['rf3']['rows_per_s']:,.0f}",
         f"{result['rf3']['seconds']:.2f}", rounds(result["rf3"])],
    ])
    failover = table(["failover (kill -9 of a leader to the first acknowledged write)", "p50 s",
                      "p99 s", "max s"],
                     [[f"{f['kills']} kills", f"{f['p50_s']:.2f}", f"{f['p99_s']:.2f}",
                       f"{f['max_s']:.2f}"]])
    session = result.get("session_timeout") or "the default 6"
    return "\n\n".join([
        f"Workload: {result['workload']}, 3 tablet servers, 4 buckets, session timeout "
        f"{session} s; {result.get('rounds', 1)} rounds per factor into fresh tables, "
        "alternating which goes first, each factor's median round counts.",
        ingest,
        f"RF 3 / RF 1: **{result['ratio']:.2f}x** (target >= {result['ratio_target']}x: "
        f"{_mark(result['ratio'] >= result['ratio_target'])}).",
        failover,
        f"Failover p99 target <= {result['failover_target_s']:g} s: "
        f"{_mark(f['p99_s'] <= result['failover_target_s'])}. Verification: "
        f"{result['verify']['samples']} sampled keys, {result['verify']['mismatches']} "
        "mismatches.",
    ] + ([] if not result.get("restore") else [
        f"Restore of a wiped replica from its remote snapshot: "
        f"{result['restore']['seconds']:.1f} s for "
        f"{result['restore']['snapshot_bytes'] / 1e6:,.0f} MB "
        f"({result['restore']['rows']:,} rows), **{result['restore']['seconds_per_gb']:.0f} s "
        "per GB** (from the wiped server's start to every copy in sync)."]))


def tiering(result: dict) -> str:
    from tally.lake.tier_round import ROUND_RECORDS

    t = result["tiered"]
    ingest = table(["table", "rows/s", "seconds"], [
        ["the lake off", f"{result['plain']['rows_per_s']:,.0f}",
         f"{result['plain']['seconds']:.2f}"],
        ["tiered into Delta Lake while written", f"{t['rows_per_s']:,.0f}", f"{t['seconds']:.2f}"],
    ])
    lag = table(["tiering throughput (records/s)", "lag p50 s", "lag p99 s", "lag max s"],
                [[f"{t['tiered_records_per_s']:,.0f}", f"{t['lag_p50_s']:.2f}",
                  f"{t['lag_p99_s']:.2f}", f"{t['lag_max_s']:.2f}"]])
    return "\n\n".join([
        f"Workload: {result['workload']}, 1 tablet server, 4 buckets, one tiering process, "
        f"`table.datalake.freshness` {result['freshness']}.",
        ingest,
        f"Tiered / plain: **{result['ratio']:.2f}x** (target >= {result['ratio_target']}x: "
        f"{_mark(result['ratio'] >= result['ratio_target'])}).",
        lag,
        f"Lag: per sample of the table's end offsets, the seconds until the lake's offsets "
        f"reached them ({t['lag_samples']} samples). Verified: the lake (version "
        f"{result['verify']['version']}, {result['verify']['lake_rows']:,} rows) equals the "
        f"live table: {_mark(result['verify']['equal'])}.",
        "The tiering process runs in its own process and asks the tablet server only for "
        "changelog ranges, so it costs the ingest little while a core is free. The lag is set by "
        f"the round size, not by the freshness: a round reads up to {ROUND_RECORDS:,} records, "
        "folds them with one Arrow group-by and merges the net changes in one Delta commit, so "
        "at full ingest speed a round takes seconds and the lake moves in steps (the plot). "
        "With writes slower than the tiering throughput, the lag is about the freshness plus "
        "one round.",
    ])


def rollups(result: dict) -> str:
    from tally.bench.rollup_bench import HEADERS, ratio_line, rollup_lines, table_rows

    parts = [f"{result['workload']}, in batches of {result['batch']:,}, each written once into "
             "the events table and its three rollups:",
             "\n".join(f"- {line}" for line in rollup_lines(result)),
             table(HEADERS, table_rows(result)),
             ratio_line(result) + "."]
    if result["problems"]:
        parts.append("Verification problems:\n\n"
                     + "\n".join(f"- {p}" for p in result["problems"]))
    return "\n\n".join(parts)
