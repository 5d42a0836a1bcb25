"""PNG plots of each benchmark's results, drawn with matplotlib for `tally bench --report`.

One function per benchmark (named like it in tally.bench.suite): it takes what that benchmark's
`run()` returned and a directory, writes `<benchmark>.png` there, and returns the paths.
matplotlib is imported here only (the `bench` extra), with the Agg backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _label_bars(ax, bars, texts: list[str]) -> None:
    ax.margins(y=0.12)  # room above the tallest bar for its label
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")  # no "1e6" offset
    for bar, text in zip(bars, texts):
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")


def _rate_bars(ax, names: list[str], rates: list[float], colors: list[str], ylabel: str) -> None:
    """One bar of rows/s per system, each labelled in thousands."""
    bars = ax.bar(names, rates, color=colors)
    _label_bars(ax, bars, [f"{rate / 1e3:,.0f}k" for rate in rates])
    ax.set_ylabel(ylabel)


def ingest(results: list[dict], directory: Path) -> list[Path]:
    """Rows/s of every side per case: the floor, the engine, DuckDB, ClickHouse and the naive
    loop; the engine's bar labelled with its ratios."""
    plt = _pyplot()
    cases = [r for r in results if r["kind"] == "throughput"]
    sides = [("floor", "floor (one group-by, one write batch)", "tab:gray"),
             ("engine", "KvTablet.put (engine)", "tab:blue"),
             ("duckdb", "DuckDB, a transaction per batch", "tab:orange"),
             ("clickhouse", "ClickHouse (chdb), insert-only", "tab:green"),
             ("naive", "naive per-row loop", "tab:brown")]
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    width = 0.8 / len(sides)
    for j, (side, label, color) in enumerate(sides):
        x = [i - 0.4 + width * (j + 0.5) for i in range(len(cases))]
        bars = ax.bar(x, [r[f"{side}_rows_per_s"] for r in cases], width, label=label,
                      color=color)
        if side == "engine":
            texts = [f"{r['floor_share']:.0%} of floor\n{r['duckdb_ratio']:.1f}x DuckDB\n"
                     f"{r['clickhouse_ratio']:.1f}x ClickHouse" for r in cases]
        else:
            texts = [f"{r[f'{side}_rows_per_s'] / 1e3:,.0f}k" for r in cases]
        _label_bars(ax, bars, texts)
    ax.set_xticks(list(range(len(cases))), [f"({r['case']}) {r['label']}" for r in cases],
                  fontsize=8)
    ax.set_ylabel("rows/s")
    ax.set_title("Ingest: the engine beside its floor, DuckDB, ClickHouse and a naive loop")
    ax.legend(fontsize=7)
    return [_save(fig, directory / "ingest.png")]


def cluster(result: dict, directory: Path) -> list[Path]:
    """Throughput through the client vs in-process, and lookup latency vs the round-trip floor."""
    plt = _pyplot()
    fig, (left, right, many_ax) = plt.subplots(1, 3, figsize=(12.6, 3.6))
    sides = ["in-process", f"cluster\n({result['buckets']} buckets)"]
    rates = [result["in_process"]["rows_per_s"], result["cluster"]["rows_per_s"]]
    _rate_bars(left, sides, rates, ["tab:gray", "tab:blue"], "rows/s")
    left.set_title(f"Client vs in-process ({result['ratio']:.2f}x)")
    lk = result["lookup"]
    x = [0, 1]
    lookup = right.bar([i - 0.2 for i in x], [lk["p50_ms"], lk["p99_ms"]], 0.4,
                       label="lookup")
    floor = right.bar([i + 0.2 for i in x], [lk["noop_p50_ms"], lk["noop_p99_ms"]], 0.4,
                      label="no-op round trip", color="tab:gray")
    _label_bars(right, lookup, [f"{lk['p50_ms']:.2f}", f"{lk['p99_ms']:.2f}"])
    _label_bars(right, floor, [f"{lk['noop_p50_ms']:.2f}", f"{lk['noop_p99_ms']:.2f}"])
    bound = lk["noop_p99_ms"] * result["p99_vs_noop_target"]
    right.axhline(bound, color="tab:red", linestyle="--", linewidth=1,
                  label=f"p99 target {result['p99_vs_noop_target']}x no-op ({bound:.2f} ms)")
    right.set_xticks(x, ["p50", "p99"])
    right.set_ylabel("ms")
    right.set_title(f"Single-key lookup latency (p99 {lk['p99_vs_noop']:.2f}x no-op)")
    right.legend(fontsize=8)
    many = result["lookup_many"]
    _rate_bars(many_ax, ["lookup", f"lookup_many\n({many['keys']:,} keys)"],
               [many["single_keys_per_s"], many["keys_per_s"]], ["tab:gray", "tab:blue"],
               "keys/s")
    many_ax.set_title(f"Key lookups: {many['ratio']:.1f}x (target >= {result['many_target']:g}x)")
    return [_save(fig, directory / "cluster.png")]


def undo(results: list[dict], directory: Path) -> list[Path]:
    """Undo and write time against batch size, one line per table size."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for table_rows in sorted({r["table_rows"] for r in results}):
        rows = sorted((r for r in results if r["table_rows"] == table_rows),
                      key=lambda r: r["batch_keys"])
        keys = [r["batch_keys"] for r in rows]
        line, = ax.plot(keys, [r["undo_s"] for r in rows], marker="o",
                        label=f"undo, {table_rows:,}-row table")
        ax.plot(keys, [r["write_s"] for r in rows], marker="x", linestyle="--",
                color=line.get_color(), label=f"write, {table_rows:,}-row table")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys in the batch")
    ax.set_ylabel("seconds")
    ax.set_title("Undo time vs write time, by batch and table size")
    ax.legend(fontsize=7)
    return [_save(fig, directory / "undo.png")]


def spark(result: dict, directory: Path) -> list[Path]:
    """Rows/s of the same Spark streaming job into each system (and of the no-op shape); next
    to it, when measured, the per-batch times of 1,000-row micro-batches."""
    plt = _pyplot()
    latency = result.get("latency")
    fig, axes = plt.subplots(1, 2 if latency else 1, figsize=(10.4 if latency else 6.4, 3.6))
    ax = axes[0] if latency else axes
    legs = result["legs"]
    colors = ["tab:blue" if leg["system"] == "tally" else
              "lightgray" if leg["system"] == "no-op shape" else "tab:gray" for leg in legs]
    _rate_bars(ax, [leg["system"] for leg in legs], [leg["rows_per_s"] for leg in legs],
               colors, "source rows/s")
    ax.set_title("Spark streaming aggregation into each system")
    if latency:
        right = axes[1]
        names = list(latency["legs"])
        right.boxplot([latency["legs"][n]["millis"] for n in names], showfliers=False)
        right.set_xticks(range(1, len(names) + 1), names)
        right.set_ylabel("ms per micro-batch (triggerExecution)")
        right.set_title(f"{latency['rows_per_batch']:,}-row micro-batches: "
                        f"{latency['ratio']:.2f}x (target <= {latency['target_ratio']:g}x)")
    return [_save(fig, directory / "spark.png")]


def spark_read(result: dict, directory: Path) -> list[Path]:
    """Rows/s of the same Spark batch read from each system."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    legs = result["legs"]
    _rate_bars(ax, [leg["system"] for leg in legs], [leg["rows_per_s"] for leg in legs],
               ["tab:blue"] + ["tab:gray"] * (len(legs) - 1), "rows/s")
    ax.set_title("Spark batch read from each system")
    return [_save(fig, directory / "spark_read.png")]


def replication(result: dict, directory: Path) -> list[Path]:
    """Ingest at RF 1 and RF 3, and the failover times of every kill."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    rates = [result["rf1"]["rows_per_s"], result["rf3"]["rows_per_s"]]
    _rate_bars(left, ["RF 1", "RF 3"], rates, ["tab:gray", "tab:blue"], "rows/s")
    left.set_title(f"Ingest, RF 3 / RF 1 = {result['ratio']:.2f}x")
    seconds = result["failover"]["seconds"]
    right.plot(range(1, len(seconds) + 1), seconds, marker="o")
    right.axhline(result["failover_target_s"], color="tab:red", linestyle="--", linewidth=1,
                  label=f"p99 target {result['failover_target_s']:g} s")
    right.set_xlabel("kill")
    right.set_ylabel("seconds to the first acknowledged write")
    right.set_title("Failover after kill -9 of a leader")
    right.legend(fontsize=8)
    return [_save(fig, directory / "replication.png")]


def tiering(result: dict, directory: Path) -> list[Path]:
    """The table's changelog and the lake's offsets over time, while ingest ran."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    samples = result["tiered"]["samples"]
    seconds = [s[0] for s in samples]
    ax.plot(seconds, [s[1] for s in samples], label="table (end offsets)")
    ax.plot(seconds, [s[2] for s in samples], label="lake (its offsets)")
    ax.set_xlabel("seconds since ingest began")
    ax.set_ylabel("changelog records, all buckets")
    t = result["tiered"]
    ax.set_title(f"Tiering while ingesting: lag p50 {t['lag_p50_s']:.1f} s, "
                 f"p99 {t['lag_p99_s']:.1f} s")
    ax.legend(fontsize=8)
    return [_save(fig, directory / "tiering.png")]


def rollups(result: dict, directory: Path) -> list[Path]:
    """Events/s of each side until every rollup is readable, split into writes and reads."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    names = {"engine": "Tally", "clickhouse": "ClickHouse"}
    sides = result["sides"]
    _rate_bars(left, [names[s] for s in sides], [sides[s]["rows_per_s"] for s in sides],
               ["tab:blue", "tab:green"], "events/s until every rollup is readable")
    left.set_title(f"One write, three rollups: {result['ratio']:.2f}x "
                   f"(target >= {result['target']:g}x)")
    x = list(range(len(sides)))
    writes = [sides[s]["write_seconds"] for s in sides]
    reads = [sides[s]["read_seconds"] for s in sides]
    right.bar(x, writes, label="writes (events + rollups)", color="tab:gray")
    right.bar(x, reads, bottom=writes, label="read of every rollup", color="tab:orange")
    right.set_xticks(x, [names[s] for s in sides])
    right.set_ylabel("seconds (median run)")
    right.set_title(f"Where the time goes ({result['rows']:,} events)")
    right.legend(fontsize=8)
    return [_save(fig, directory / "rollups.png")]
