"""A client process for the end-to-end test: writes one seed's batches, then prints its offsets.

    python -m tests.cluster.write_process URL TABLE SEED BATCHES ROWS
"""

from __future__ import annotations

import json
import sys

import client
from tests.cluster import workload


def main(url: str, table: str, seed: int, count: int, rows: int) -> None:
    with client.connect(url) as conn:
        writer = conn.table(table).upsert_writer()
        offsets = {}
        for batch in workload.batches(seed, count, rows):
            writer.upsert(batch)
            offsets.update(writer.flush())
        print(json.dumps({f"{p}:{b}": end for (p, b), end in offsets.items()}))


if __name__ == "__main__":
    url, table, seed, count, rows = sys.argv[1:6]
    main(url, table, int(seed), int(count), int(rows))
