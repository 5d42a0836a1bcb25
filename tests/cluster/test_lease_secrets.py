"""Leases are secrets: a lease forged from what `lock_describe` shows is refused everywhere.

The fencing token is public (`lock_describe`, `tally locks`); every call that acts as a lock's
owner also needs the secret its acquirer was given. A forger who knows everything public and
guesses the secret gets PermissionDeniedError from renew, register_attempt, epoch_baseline,
commit, release and a write, and changes nothing; the real owner goes on as before.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from locks import Lease
from locks.lease import offsets_from_json
from merge_engine import Schema, TableDescriptor
from tally import client
from tally.errors import PermissionDeniedError


def make_table(conn, name):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "sum").primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation"}))
    return conn.table(name)


def forge(conn, table: str, secret: str) -> Lease:
    """The owner's lease as anyone who may read the table can rebuild it, and a guessed secret."""
    [shown] = conn.locks.describe(table)
    assert "secret" not in json.dumps(shown) and "hash" not in json.dumps(shown)
    return Lease(table, conn.table_meta(table).table_id, shown["owner_id"],
                 tuple(shown["columns"]), shown["token"], shown["expires_at"], shown["ttl"],
                 offsets_from_json(shown["initial_offsets"]), shown["tenure"], secret)


def state(conn, table: str, owner: str) -> dict:
    return {"locks": [{k: v for k, v in d.items() if k not in ("expires_in", "expires_at")}
                      for d in conn.locks.describe(table, include_expired=True)],
            "commit": conn.locks.last_commit(table, owner),
            "offsets": conn.coordinator_action("list_offsets", {"name": table}),
            "rows": sorted(conn.table(table).to_arrow().to_pylist(), key=lambda r: r["k"])}


@pytest.mark.parametrize("guess", ["", "x", "A" * 43])
def test_a_forged_lease_is_refused_for_every_lease_operation(cluster, conn, table_name, guess):
    table = make_table(conn, table_name)
    lease = conn.locks.acquire(table_name, "owner", ["a"], ttl=60)
    with table.upsert_writer(target_columns=["k", "a"], lease=lease) as w:
        w.upsert([{"k": 1, "a": 1}])
    assert conn.locks.commit(lease, 1, conn.locks.epoch_baseline(lease, 1))
    before = state(conn, table_name, "owner")
    with client.connect(cluster.url) as forger:  # its own connection: no keeper of the lease
        fake = forge(forger, table_name, guess)
        assert fake.token == lease.token and fake.secret != lease.secret
        attempts = {
            "renew": lambda: forger.locks.renew(fake),
            "register_attempt": lambda: forger.locks.register_attempt(fake, 0),
            "register_attempts": lambda: forger.locks.register_attempts(fake, [0, 1]),
            "epoch_baseline": lambda: forger.locks.epoch_baseline(fake, 99),
            "begin_epoch": lambda: forger.locks.begin_epoch(fake, 99, [0, 1]),
            "begin_epoch of a run": lambda: forger.locks.begin_epoch(fake, 99, [0], run=0),
            "abort_epoch": lambda: forger.locks.abort_epoch(fake, 1),
            "commit": lambda: forger.locks.commit(fake, 99, {(None, 0): 0, (None, 1): 0}),
            "release": lambda: forger.locks.release(fake),
        }
        for name, attempt in attempts.items():
            with pytest.raises(PermissionDeniedError, match="secret"):
                attempt()
            assert state(conn, table_name, "owner") == before, f"{name} changed something"
        writer = forger.table(table_name).upsert_writer(target_columns=["k", "a"], lease=fake)
        writer.upsert([{"k": 1, "a": 1000}, {"k": 2, "a": 1000}])
        with pytest.raises(PermissionDeniedError, match="secret"):
            writer.flush()
        assert state(conn, table_name, "owner") == before
    # The real owner is untouched: no attempt was registered over its writer, its lease renews,
    # it writes, commits and releases.
    assert conn.locks.renew(lease).token == lease.token
    with table.upsert_writer(target_columns=["k", "a"], lease=lease) as w:
        w.upsert([{"k": 1, "a": 1}])
    assert conn.locks.commit(lease, 2, conn.locks.epoch_baseline(lease, 2))
    assert conn.locks.release(lease) and conn.locks.describe(table_name) == []
    assert table.lookup({"k": 1})["a"] == 2 and table.lookup({"k": 2}) is None


def test_the_secret_is_new_with_every_grant(conn, table_name):
    """A re-acquisition (a restarted job) and a takeover each get a new secret: the earlier
    holder's secret no longer works, even with the current token."""
    make_table(conn, table_name)
    first = conn.locks.acquire(table_name, "job", ["a"], ttl=60)
    again = conn.locks.acquire(table_name, "job", ["a"], ttl=60)
    assert again.secret != first.secret and again.tenure == first.tenure
    stale = Lease(**{**first.__dict__, "token": again.token, "expires_at": again.expires_at})
    with pytest.raises(PermissionDeniedError):
        conn.locks.renew(stale)
    assert conn.locks.release(again)
