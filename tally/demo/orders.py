"""Generated orders for the demo, written as JSON files (a replayable streaming source), and the
exactly-once result they must produce, computed by a plain Python fold.

Determinism. The result holds order-sensitive columns (string_agg, array_agg, last value), so
the model must fold the orders in exactly the order the job does:

- across micro-batches, in batch order. Spark's file source takes new files in ascending
  modification time (ties in directory-listing order, which is arbitrary); `write_orders` gives
  each file an explicit modification time `MTIME_STEP_S` seconds after the previous one, so the
  order is the file order whatever the file system's timestamp resolution, and the job reads one
  file per micro-batch (`maxFilesPerTrigger` 1, `latestFirst` false). The demo still checks, in
  the checkpoint's source log, which files each batch really read (`spark_batches`) and folds
  the model in that recorded order;
- within a micro-batch, as the sink does (sink/fold.py `order_of`): by the sequence column
  (`order_id`, ascending, nulls first), ties by input position. Order ids are unique, so the
  order inside a batch never depends on how Spark split or ordered its input partitions.
"""

from __future__ import annotations

import json
import os
import random
import time
from decimal import Decimal
from urllib.parse import unquote, urlparse

import pyarrow as pa

PRODUCTS = ["anvil", "bicycle", "camera", "drone", "easel", "fiddle", "guitar", "hammock",
            "igloo", "jetpack", "kayak", "lantern"]
TAGS = ["gift", "sale", "new", "bulk", "eco"]
STATUSES = ["placed", "paid", "shipped", None, None]

ORDER_SCHEMA = pa.schema([("order_id", pa.int64()), ("product", pa.string()),
                          ("amount", pa.decimal128(12, 2)), ("price", pa.decimal128(10, 2)),
                          ("tags", pa.string()), ("status", pa.string())])

# Seconds between two files' modification times: far above any file system's timestamp
# resolution (FAT's is 2 s, Hadoop's local file status reports milliseconds).
MTIME_STEP_S = 10


def file_name(index: int) -> str:
    return f"orders-{index:03d}.json"


def write_orders(directory: str, files: int, per_file: int, seed: int = 7) -> list[list[dict]]:
    """Write `files` JSON-lines files of orders into the new, empty `directory`; return each
    file's orders in line order (file i is meant to be micro-batch i).

    Every file gets an explicit modification time, strictly increasing in file order and
    `MTIME_STEP_S` apart, ending a little before now; the times are read back and checked.
    """
    os.makedirs(directory, exist_ok=False)
    rng = random.Random(seed)
    batches, order_id = [], 1000
    for f in range(files):
        batch = []
        for _ in range(per_file):
            order_id += 1
            quantity = rng.randint(1, 4)
            price = Decimal(rng.randint(500, 90000)) / 100
            batch.append({
                "order_id": order_id, "product": rng.choice(PRODUCTS),
                "amount": str(price * quantity), "price": str(price),
                "tags": ",".join(sorted(rng.sample(TAGS, rng.randint(1, 2)))),
                "status": rng.choice(STATUSES)})
        with open(os.path.join(directory, file_name(f)), "w") as out:
            out.write("\n".join(json.dumps(o) for o in batch) + "\n")
        batches.append(batch)
    stamp_in_order(directory, files)
    return batches


def stamp_in_order(directory: str, files: int, now: float | None = None) -> list[int]:
    """Set file i's modification time to start + i * MTIME_STEP_S (whole seconds, the last one
    at least a step before `now`); return the times read back, in nanoseconds."""
    now = time.time() if now is None else now
    start = int(now) - files * MTIME_STEP_S
    for f in range(files):
        ns = (start + f * MTIME_STEP_S) * 1_000_000_000
        os.utime(os.path.join(directory, file_name(f)), ns=(ns, ns))
    stamps = [os.stat(os.path.join(directory, file_name(f))).st_mtime_ns for f in range(files)]
    millis = [s // 1_000_000 for s in stamps]
    if any(b <= a for a, b in zip(millis, millis[1:])):
        raise RuntimeError(f"the file system did not keep strictly increasing modification "
                           f"times on the demo's files ({millis} ms): Spark's file source "
                           f"would read them in an arbitrary order")
    return stamps


def spark_batches(checkpoint: str) -> list[tuple[int, list[str]]]:
    """The files each batch of the (single) file source read, as Spark recorded them in the
    checkpoint's source log: [(source batch id, [file names])], in batch order.

    The log is `<checkpoint>/sources/0/<id>` (and `<id>.compact` after compaction): a version
    line, then one JSON file entry per line with `path` (a URI), `timestamp` and `batchId`.
    """
    log_dir = os.path.join(checkpoint, "sources", "0")
    found: dict[int, list[str]] = {}
    for name in sorted(os.listdir(log_dir)):
        if not name.removesuffix(".compact").isdigit():
            continue  # Hadoop's .crc files, temporary files
        with open(os.path.join(log_dir, name)) as f:
            lines = f.read().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise RuntimeError(f"unexpected file source log {os.path.join(log_dir, name)}")
        for line in lines[1:]:
            if not line.strip():
                continue
            entry = json.loads(line)
            path = os.path.basename(unquote(urlparse(entry["path"]).path))
            files = found.setdefault(int(entry["batchId"]), [])
            if path not in files:
                files.append(path)
    return sorted(found.items())


def orders_of_batches(batches: list[list[dict]], schedule: list[tuple[int, list[str]]]
                      ) -> list[list[dict]]:
    """The orders of each scheduled batch: the files it read, each in line order."""
    by_name = {file_name(i): orders for i, orders in enumerate(batches)}
    return [[o for name in names for o in by_name[name]] for _, names in schedule]


def sink_order(batch: list[dict]) -> list[dict]:
    """A micro-batch's rows in the sink's fold order (sink/fold.py order_of): the sequence
    column ascending, nulls first, then input position (a stable sort keeps it)."""
    return sorted(batch, key=lambda o: (o["order_id"] is not None, o["order_id"] or 0))


def expected_totals(batches: list[list[dict]]) -> dict[str, dict]:
    """The table every order applied exactly once must hold, per product, when the micro-batches
    hold `batches` (each in input position order) and apply in list order."""
    totals: dict[str, dict] = {}
    for batch in batches:
        for o in sink_order(batch):
            t = totals.setdefault(o["product"], {"product": o["product"], "revenue": Decimal(0),
                                                 "orders": 0, "max_price": None, "tags": [],
                                                 "order_ids": [], "status": None})
            t["revenue"] += Decimal(o["amount"])
            t["orders"] += 1
            price = Decimal(o["price"])
            t["max_price"] = price if t["max_price"] is None else max(t["max_price"], price)
            for tag in o["tags"].split(","):
                if tag not in t["tags"]:
                    t["tags"].append(tag)
            t["order_ids"].append(o["order_id"])
            if o["status"] is not None:
                t["status"] = o["status"]
    for t in totals.values():
        t["tags"] = ",".join(t["tags"])
    return totals
