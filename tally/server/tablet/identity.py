"""A tablet server's identity: made on its first start, kept in its data directory.

Replicas are assigned to identities, so the identity must outlive restarts and port changes,
and a wiped data directory must come back as a new server (its copies are gone with it).
"""

from __future__ import annotations

import json
import os
import uuid

from tally.fsync import write_durably


def load_server_id(data_dir: str) -> str:
    """This server's identity, made on first start and kept in <data_dir>/server.json."""
    path = os.path.join(data_dir, "server.json")
    try:
        with open(path) as f:
            return json.load(f)["server_id"]
    except FileNotFoundError:
        pass
    server_id = f"ts-{uuid.uuid4().hex[:10]}"
    os.makedirs(data_dir, exist_ok=True)
    write_durably(path, json.dumps({"server_id": server_id}).encode())
    return server_id
