"""A client process that writes one seed's workload, for the end-to-end and kill -9 tests.

    python -m tests.cluster.write_process URL TABLE SEED STEPS ROWS [--acks] [--delete-share F]

Writes `reference_workload.steps(SEED, STEPS, ROWS, delete_share=F)` with one upsert writer,
flushing after each step, then prints the end offsets of every bucket it wrote as one JSON line.
With `--acks` it also prints `ACK <i>` (flushed) after each step's flush returns: the parent knows
exactly which writes were acknowledged when it kills this process or a tablet server.

TABLE `-` starts a writer ahead of time: it imports and connects, prints `READY`, then reads
`TABLE SEED` from stdin (the seed argument is ignored). Process start-up costs about a second,
which the kill -9 trials hide by starting the next trial's writer while the current one runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from tally import client
from tests.cluster import reference_workload

ACK = "ACK"
READY = "READY"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.write_process")
    parser.add_argument("url")
    parser.add_argument("table")
    parser.add_argument("seed", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("--acks", action="store_true")
    parser.add_argument("--delete-share", type=float, default=0.0)
    args = parser.parse_args(argv)
    with client.connect(args.url) as conn:
        table, seed = args.table, args.seed
        if table == "-":
            print(READY, flush=True)
            table, seed = sys.stdin.readline().split()
        writes = reference_workload.steps(int(seed), args.steps, args.rows,
                                          delete_share=args.delete_share)
        writer = conn.table(table).upsert_writer()
        offsets = {}
        for i, (op, rows) in enumerate(writes):
            writer.upsert(rows) if op == "put" else writer.delete(rows)
            offsets.update(writer.flush())
            if args.acks:
                print(f"{ACK} {i}", flush=True)
        print(json.dumps({f"{p}:{b}": end for (p, b), end in offsets.items()}), flush=True)


if __name__ == "__main__":
    main()
