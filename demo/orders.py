"""Generated orders for the demo, written as JSON files (a replayable streaming source), and the
exactly-once result they must produce, computed by a plain Python fold.

Order ids grow across files, and the job folds each micro-batch in order-id order (the sink's
`sequence-column`), so even the order-sensitive columns (string_agg, array_agg, last value) have
one right answer.
"""

from __future__ import annotations

import json
import os
import random
from decimal import Decimal

import pyarrow as pa

PRODUCTS = ["anvil", "bicycle", "camera", "drone", "easel", "fiddle", "guitar", "hammock",
            "igloo", "jetpack", "kayak", "lantern"]
TAGS = ["gift", "sale", "new", "bulk", "eco"]
STATUSES = ["placed", "paid", "shipped", None, None]

ORDER_SCHEMA = pa.schema([("order_id", pa.int64()), ("product", pa.string()),
                          ("amount", pa.decimal128(12, 2)), ("price", pa.decimal128(10, 2)),
                          ("tags", pa.string()), ("status", pa.string())])


def write_orders(directory: str, files: int, per_file: int, seed: int = 7) -> list[dict]:
    """Write `files` JSON-lines files of orders; return every order, in order-id order."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    orders, order_id = [], 1000
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
        with open(os.path.join(directory, f"orders-{f:03d}.json"), "w") as out:
            out.write("\n".join(json.dumps(o) for o in batch) + "\n")
        orders += batch
    return orders


def expected_totals(orders: list[dict]) -> dict[str, dict]:
    """The table every order applied exactly once must hold, per product."""
    totals: dict[str, dict] = {}
    for o in sorted(orders, key=lambda o: o["order_id"]):
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
