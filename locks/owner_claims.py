"""Whose each owner id of a table is, as the metadata store keeps it (see ownership):

    /owners/<table_id>/<owner>   {"owner_id", "principal", "since"}

Made in the transaction of the acquisition that first uses the owner id (under a principal
other than the servers'), so two principals racing for a new id cannot both win; kept after
the lock is released, so another principal cannot start a tenure under it later and commit in
its name. Changed only by an admin's reassignment; gone with the table.
"""

from __future__ import annotations

import time

from tally.errors import InvalidInputError
from tally.meta import MetadataStore, join_path, node_name


def claim_path(table_id: int, owner_id: str | None = None) -> str:
    if owner_id is None:
        return join_path("owners", str(table_id))
    return join_path("owners", str(table_id), node_name(owner_id, "lock owner id"))


def claimant(store: MetadataStore, table_id: int, owner_id: str) -> str | None:
    """The principal id that owns `owner_id` on the table, or None (nobody yet)."""
    node = store.get(claim_path(table_id, owner_id))
    return None if node is None else node.value.get("principal")


def claim_ops(store: MetadataStore, table_id: int, owner_id: str,
              principal: str | None) -> list[tuple]:
    """The op recording `principal`'s claim on an unclaimed id, to run in the acquisition's
    transaction (a claim made meanwhile fails it, and the acquisition is judged again), or
    a check that the claim read is still the one judged."""
    path = claim_path(table_id, owner_id)
    node = store.get(path)
    if node is not None:
        return [("check", path, node.version)]
    if principal is None:
        return []
    return [("create", path, {"owner_id": owner_id, "principal": principal,
                              "since": time.time()})]


def reassign(store: MetadataStore, table_id: int, owner_id: str, principal: str) -> str | None:
    """Make `principal` the owner id's principal; the one it had (None: nobody)."""
    if not isinstance(principal, str) or not principal:
        raise InvalidInputError(f"a principal is a client name, got {principal!r}")
    before = claimant(store, table_id, owner_id)
    store.update(claim_path(table_id, owner_id),
                 lambda old: {**old, "owner_id": owner_id, "principal": principal,
                              "since": time.time()}, create={})
    return before


def drop_table(store: MetadataStore, table_id: int) -> None:
    store.delete(claim_path(table_id), recursive=True)
