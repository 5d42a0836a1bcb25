"""Owner ids and consumers belong to principals, over a real secured cluster.

The matrix walks the one rule table (`locks.ownership.RULES`, joined with the role table) over
the principals that matter: the owner id's own principal, a principal granted the id's pattern,
another write principal, a read principal and an admin. Each acts on a lock (with the owner's
very lease in hand, so only the ownership rule can refuse it) and on a consumer's positions;
a refusal must be PermissionDeniedError and leave the lock, the last commit and the positions
as they were, and an admitted call must not be refused.
"""

from __future__ import annotations

import itertools
import os

import pyarrow as pa
import pytest

from locks import ownership
from merge_engine import Schema, TableDescriptor
from recovery.recover import acquire as take_over_and_acquire
from tally import client
from tally.errors import PermissionDeniedError, TakeoverLeaseError
from tally.server import LocalCluster
from tally.server.access import REQUIRED_ROLE, allows, owner_table_markdown
from tally.server.clock import SkewedClock
from tally.server.credentials import new_secret, write_auth_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENTS = {"alice": "write", "bob": "write", "reader": "read", "boss": "admin",
           "team1": "write", "team2": "write"}
GRANTS = {name: {"owners": ["team-*"], "consumers": ["team-*"]} for name in ("team1", "team2")}
_names = itertools.count()


@pytest.fixture(scope="module")
def owned(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("ownership")
    tokens = {name: new_secret() for name in CLIENTS}
    write_auth_file(str(data_dir / "auth.toml"), new_secret(),
                    {name: (tokens[name], role) for name, role in CLIENTS.items()}, GRANTS)
    clock_file = str(data_dir / "clock")
    with LocalCluster(str(data_dir), tablet_servers=1, authenticate=True,
                      lock_clock_file=clock_file) as c:
        conns = {name: client.connect(c.url, token=tokens[name], retry_timeout=60)
                 for name in CLIENTS}
        c.conns, c.client_tokens, c.clock = conns, tokens, SkewedClock(clock_file)
        try:
            yield c
        finally:
            for conn in conns.values():
                conn.close()


def make_table(conn) -> str:
    name = f"default.own{next(_names)}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=1, properties={
        "table.merge-engine": "aggregation"}))
    return name


def state(conn, table: str, owner: str, consumer: str):
    return ([{k: v for k, v in d.items() if k not in ("expires_in", "expires_at")}
             for d in conn.locks.describe(table, include_expired=True)],
            conn.locks.last_commit(table, owner),
            [(p.consumer, p.positions, p.principal) for p in
             conn.admin.consumer_positions(table) if p.consumer == consumer])


def actions(conn, owner_conn, table, owner, consumer, lease):
    """call -> what `conn` does for that call against `owner`'s lock and `consumer`."""
    ends = owner_conn.locks.epoch_baseline(lease, 1)
    return {
        "lock_acquire": lambda: conn.locks.acquire(table, owner, ["a"], ttl=60),
        "lock_renew": lambda: conn.locks.renew(lease),
        "register_attempts": lambda: conn.locks.register_attempts(lease, [0]),
        "undo_baselines": lambda: conn.locks.undo_baselines(lease),
        "epoch_begin": lambda: conn.locks.begin_epoch(lease, 2, [0]),
        "epoch_baseline": lambda: conn.locks.epoch_baseline(lease, 3),
        "epoch_abort": lambda: conn.locks.abort_epoch(lease, 1),
        "commit": lambda: conn.locks.commit(lease, 5, ends),
        "lock_release": lambda: conn.locks.release(lease),
        "consumer_commit": lambda: conn.admin.commit_consumer(table, consumer, [[None, 0, 0]]),
        "consumer_remove": lambda: conn.admin.remove_consumer(table, consumer),
    }


CALLS = ["lock_acquire", "lock_renew", "register_attempts", "undo_baselines", "epoch_begin",
         "epoch_baseline", "epoch_abort", "commit", "lock_release", "consumer_commit",
         "consumer_remove"]

# principal -> (the owner's principal, the ids' prefix, how it stands to them)
MATRIX = {"alice": ("alice", "A", ownership.OWN), "team2": ("team1", "team-", ownership.OWN),
          "bob": ("alice", "A", ownership.OTHER), "reader": ("alice", "A", ownership.OTHER),
          "boss": ("alice", "A", ownership.ADMIN)}


@pytest.mark.parametrize("principal", list(MATRIX))
def test_every_lock_and_consumer_action_for_every_principal(owned, principal):
    owner_name, prefix, relation = MATRIX[principal]
    wrong = []
    for call in CALLS:
        owner_conn, conn = owned.conns[owner_name], owned.conns[principal]
        table = make_table(owned.conns["boss"])
        owner, consumer = f"{prefix}{next(_names)}", f"{prefix}c{next(_names)}"
        lease = owner_conn.locks.acquire(table, owner, ["a"], ttl=60)
        owner_conn.locks.commit(lease, 1, owner_conn.locks.epoch_baseline(lease, 1))
        owner_conn.admin.commit_consumer(table, consumer, [[None, 0, 0]])
        todo = actions(conn, owner_conn, table, owner, consumer, lease)[call]
        before = state(owned.conns["boss"], table, owner, consumer)
        admitted = allows(CLIENTS[principal], REQUIRED_ROLE[call]) and \
            ownership.may(call, relation)
        try:
            todo()
            error = None
        except PermissionDeniedError as e:
            error = e
        if admitted and error is not None:
            wrong.append(f"{call}: expected to pass, got {error}")
        if not admitted:
            if error is None:
                wrong.append(f"{call}: expected PermissionDeniedError, it passed")
            elif state(owned.conns["boss"], table, owner, consumer) != before:
                wrong.append(f"{call}: refused, but something changed")
            elif principal == "bob" and \
                    f"'{consumer if call.startswith('consumer') else owner}'" not in str(error):
                wrong.append(f"{call}: the refusal does not name the id: {error}")
        if call != "lock_release" or error is not None:
            owner_conn.locks.release(lease)
    assert not wrong, "\n".join(wrong)


def test_an_owner_id_is_held_by_its_principal_after_release(owned):
    """Released, the id still belongs to its principal: another may not start a tenure in its
    name (and commit past the owner's epochs); an admin's reassignment hands it over."""
    alice, bob, boss = (owned.conns[n] for n in ("alice", "bob", "boss"))
    table = make_table(boss)
    lease = alice.locks.acquire(table, "job", ["a"], ttl=60)
    alice.locks.commit(lease, 4, alice.locks.epoch_baseline(lease, 4))
    assert alice.locks.release(lease)
    with pytest.raises(PermissionDeniedError, match="'job'.*'alice'"):
        bob.locks.acquire(table, "job", ["a"], ttl=60)
    assert alice.locks.last_commit(table, "job").epoch == 4
    # the same principal resumes from another process (a new connection, the same token)
    with client.connect(owned.url, token=owned.client_tokens["alice"], retry_timeout=60) as again:
        again.locks.release(again.locks.acquire(table, "job", ["a"], ttl=60))
    with pytest.raises(PermissionDeniedError):
        bob.locks.reassign(table, "job", "bob")  # admins only
    assert boss.locks.reassign(table, "job", "bob")["before"] == "alice"
    bob.locks.release(bob.locks.acquire(table, "job", ["a"], ttl=60))
    with pytest.raises(PermissionDeniedError, match="'bob'"):
        alice.locks.acquire(table, "job", ["a"], ttl=60)


def test_grants_bind_patterns_to_their_principals(owned):
    team1, alice = owned.conns["team1"], owned.conns["alice"]
    table = make_table(owned.conns["boss"])
    with pytest.raises(PermissionDeniedError, match=r"matching \['team-\*'\]"):
        team1.locks.acquire(table, "elsewhere", ["a"], ttl=60)
    with pytest.raises(PermissionDeniedError, match="grants owner id 'team-x'"):
        alice.locks.acquire(table, "team-x", ["a"], ttl=60)
    with pytest.raises(PermissionDeniedError, match="consumer 'team-c'"):
        alice.admin.commit_consumer(table, "team-c", [[None, 0, 0]])
    team1.locks.release(team1.locks.acquire(table, "team-x", ["a"], ttl=60))


def test_a_takeover_only_undoes_and_releases(owned):
    """B takes over C's expired lock: it may undo and release, never commit C's epoch, begin
    one or write new data in C's name; C's last commit stays where C left it."""
    carol, bob = owned.conns["alice"], owned.conns["bob"]
    table = make_table(owned.conns["boss"])
    lease = carol.locks.acquire(table, "C", ["a"], ttl=5)
    carol.locks.commit(lease, 5, carol.locks.epoch_baseline(lease, 5))
    start = carol.locks.begin_epoch(lease, 6, [0])
    with carol.table(table).upsert_writer(target_columns=["k", "a"], lease=lease,
                                          attempt=start.attempts[0]) as w:
        w.upsert([{"k": 1, "a": 7}])
    carol.locks._stop_all()  # C crashes: nobody renews its lease
    owned.clock.advance(60)
    [revived] = bob.locks.take_over(table, "B", ["a"], ttl=60)
    assert revived.takeover
    for refused in (lambda: bob.locks.commit(revived, 6, start.offsets),
                    lambda: bob.locks.begin_epoch(revived, 7, [0]),
                    lambda: bob.locks.epoch_baseline(revived, 7)):
        with pytest.raises(TakeoverLeaseError, match="takeover"):
            refused()
    with pytest.raises(TakeoverLeaseError, match="takeover"):
        with bob.table(table).upsert_writer(target_columns=["k", "a"], lease=revived) as w:
            w.upsert([{"k": 2, "a": 1}])
    assert bob.locks.last_commit(table, "C").epoch == 5
    bob.locks.release(revived)
    lease_b = take_over_and_acquire(bob, table, "B", ["a"], ttl=60)
    assert bob.locks.last_commit(table, "C").epoch == 5
    bob.locks.release(lease_b)


def test_a_read_principal_cannot_move_another_consumer(owned):
    alice, reader = owned.conns["alice"], owned.conns["reader"]
    table = make_table(owned.conns["boss"])
    alice.admin.commit_consumer(table, "billing", [[None, 0, 0]])
    with pytest.raises(PermissionDeniedError, match="consumer 'billing'.*'alice'"):
        reader.admin.commit_consumer(table, "billing", [[None, 0, 10]])
    [position] = [p for p in alice.admin.consumer_positions(table) if p.consumer == "billing"]
    assert position.positions == {(None, 0): 0} and position.principal == "alice"
    owned.conns["boss"].admin.commit_consumer(table, "billing", [[None, 0, 0]])  # admin resets


def test_the_security_page_prints_the_owner_table():
    with open(os.path.join(ROOT, "docs", "security.md")) as f:
        assert owner_table_markdown() in f.read(), \
            "docs/security.md must hold tally.server.access.owner_table_markdown()"


def test_claims_survive_a_coordinator_restart(owned):
    """Kept in the metadata store: a restarted (killed) coordinator still refuses another
    principal the owner id and the consumer, and the owner resumes its tenure."""
    alice, bob = owned.conns["alice"], owned.conns["bob"]
    table = make_table(owned.conns["boss"])
    lease = alice.locks.acquire(table, "kept", ["a"], ttl=600)
    alice.admin.commit_consumer(table, "kept-reads", [[None, 0, 0]])
    owned.restart_coordinator(kill=True)
    with pytest.raises(PermissionDeniedError, match="'kept'.*'alice'"):
        bob.locks.acquire(table, "kept", ["a"], ttl=60)
    with pytest.raises(PermissionDeniedError, match="'kept-reads'.*'alice'"):
        bob.admin.commit_consumer(table, "kept-reads", [[None, 0, 5]])
    again = alice.locks.acquire(table, "kept", ["a"], ttl=60)
    assert again.tenure == lease.tenure
    alice.locks.release(again)


@pytest.mark.parametrize("grant, complaint", [
    ('owners = "billing-*"', "owners of client 'c' must be a list"),
    ('consumers = [""]', "consumers of client 'c' must be a list"),
    ('groups = ["x"]', "may have owners and consumers"),
])
def test_a_bad_grant_is_refused_naming_it(tmp_path, grant, complaint):
    from tally.errors import InvalidOptionError
    from tally.server.credentials import Credentials

    path = tmp_path / "auth.toml"
    path.write_text(f'cluster = "{new_secret()}"\n\n[clients.c]\ntoken = "{new_secret()}"\n'
                    f'role = "write"\n{grant}\n')
    path.chmod(0o600)
    with pytest.raises(InvalidOptionError, match=complaint):
        Credentials.load(str(path))
