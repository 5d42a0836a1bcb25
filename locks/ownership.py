"""Whose an owner id or a consumer name is, and who may act under it: the one rule table.

The role table says which calls a principal's role admits; this says, for the calls that act
in an owner's or a consumer's name, which principals may make them for *that* owner id or
consumer name. The rule, the way Kafka grants TransactionalId and consumer Group ACLs:

- an id (owner id or consumer name) that matches an auth file grant (`owners = ["billing-*"]`,
  `consumers = ["billing"]`, glob patterns) belongs to the principals granted it: a team's
  service accounts share it;
- a principal with grants of a kind may use only ids matching them;
- an id no grant matches belongs to the first principal that uses it (starts a tenure under
  the owner id, or registers the consumer's positions); that claim is kept in the metadata
  store until an admin reassigns it or the table is dropped (a consumer's, until the consumer
  is removed);
- the servers themselves (the cluster credential, and every caller of a server without
  credentials) are one trusted principal: nothing is claimed or refused for them.

A takeover (another owner taking over an expired, unrecovered lock to undo it) revives that
lock under a lease its taker holds: the taker may renew it, register attempts, read the undo
baselines, write the undo (OVERWRITE writes only) and release it, never commit, begin an epoch
or store a baseline in the expired owner's name.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from tally.errors import PermissionDeniedError, TakeoverLeaseError

OWNERS, CONSUMERS = "owners", "consumers"  # the two kinds of id, as the auth file names them

# How a caller stands to an owner id or a consumer name.
OWN = "its principal"               # claimed it first, or is granted a pattern it matches
TAKER = "the taker"                 # holds the lease of a takeover of its expired lock
OTHER = "another principal"
ADMIN = "admin"                     # an admin that is not its principal
SERVERS = "cluster"                 # the cluster credential; any caller without credentials
RELATIONS = (OWN, TAKER, OTHER, ADMIN, SERVERS)
_ANYONE = frozenset(RELATIONS)

# call -> (the kind of id it acts under, the relations that may make it). The role table is
# checked first: a row here only narrows whom its role admits. `do_put` rows are writes under
# the owner's lease (the tablet servers check them by the lease's secret and takeover flag).
RULES: dict[str, tuple[str, frozenset]] = {
    "lock_acquire": (OWNERS, frozenset({OWN, SERVERS})),
    "lock_take_over": (OWNERS, frozenset({OWN, SERVERS})),  # under the taker's own owner id
    "lock_renew": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "register_attempt": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "register_attempts": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "undo_baselines": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "lock_release": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "commit": (OWNERS, frozenset({OWN, SERVERS})),
    "epoch_baseline": (OWNERS, frozenset({OWN, SERVERS})),
    "epoch_begin": (OWNERS, frozenset({OWN, SERVERS})),
    "epoch_abort": (OWNERS, frozenset({OWN, SERVERS})),
    "do_put under its lease": (OWNERS, frozenset({OWN, SERVERS})),
    "do_put OVERWRITE under its lease (undo)": (OWNERS, frozenset({OWN, TAKER, SERVERS})),
    "lock_discard": (OWNERS, _ANYONE),  # an admin's call (the role table): any owner's lock
    "lock_reassign": (OWNERS, _ANYONE),  # an admin's call
    "lock_describe": (OWNERS, _ANYONE),
    "last_commit": (OWNERS, _ANYONE),
    "consumer_commit": (CONSUMERS, frozenset({OWN, ADMIN, SERVERS})),
    "consumer_remove": (CONSUMERS, frozenset({OWN, ADMIN, SERVERS})),
    "consumer_positions": (CONSUMERS, _ANYONE),
}

# Takers only undo and release; these are what they may not do (TakeoverLeaseError).
_ACTING = {"commit": "commit an epoch", "epoch_baseline": "store an epoch baseline",
           "epoch_begin": "begin an epoch", "epoch_abort": "abort an epoch"}


class Grants:
    """The auth file's grants: principal id -> {kind: glob patterns}, and every principal id
    it knows (a reassignment names one of them)."""

    def __init__(self, patterns: dict[str, dict[str, tuple[str, ...]]] | None = None,
                 principals=()) -> None:
        self._patterns = {p: {k: tuple(v) for k, v in kinds.items() if v}
                          for p, kinds in (patterns or {}).items()}
        self.principals = frozenset(principals) | frozenset(self._patterns)

    def patterns(self, principal_id: str, kind: str) -> tuple[str, ...]:
        return self._patterns.get(principal_id, {}).get(kind, ())

    def granted(self, kind: str, name: str) -> list[str]:
        """The principals granted a pattern of `kind` that `name` matches."""
        return sorted(p for p, kinds in self._patterns.items()
                      if any(fnmatchcase(name, pattern) for pattern in kinds.get(kind, ())))


NO_GRANTS = Grants()


def principal_id(principal) -> str | None:
    """The id claims are recorded under: the auth file's client name; None for the servers."""
    if principal is None or principal.role == SERVERS:
        return None
    return getattr(principal, "id", None)


def _grants(principal) -> Grants:
    return getattr(principal, "grants", None) or NO_GRANTS


def owners(principal, kind: str, name: str, claimed: str | None) -> list[str]:
    """Who `name` belongs to as `principal`'s auth file sees it: the granted principals, else
    its claimant (empty: nobody yet)."""
    return _grants(principal).granted(kind, name) or ([claimed] if claimed else [])


def relation(principal, kind: str, name: str, claimed: str | None,
             taker: str | None = None) -> str:
    """How `principal` stands to the id `name` of `kind`, claimed by `claimed` (None: nobody
    yet), whose lock a takeover by principal `taker` may hold."""
    pid = principal_id(principal)
    if pid is None:
        return SERVERS
    mine = _grants(principal).patterns(pid, kind)
    allowed = not mine or any(fnmatchcase(name, pattern) for pattern in mine)
    belongs = owners(principal, kind, name, claimed)
    if allowed and (not belongs or pid in belongs):
        return OWN
    if taker is not None and pid == taker:
        return TAKER
    return ADMIN if principal.role == "admin" else OTHER


def may(call: str, relation_: str) -> bool:
    return relation_ in RULES[call][1]


def check(call: str, principal, name: str, claimed: str | None, *, table: str,
          taker: str | None = None) -> str:
    """The caller's relation to `name` if it may make `call` under it; else
    PermissionDeniedError (TakeoverLeaseError for a taker acting as the owner), naming the id
    and whom it belongs to, never a secret."""
    kind = RULES[call][0]
    found = relation(principal, kind, name, claimed, taker)
    if may(call, found):
        return found
    what = "owner id" if kind == OWNERS else "consumer"
    if found == TAKER:
        raise TakeoverLeaseError(
            f"{principal.name} holds the lock of owner '{name}' on {table} by a takeover: it "
            f"may undo that owner's uncommitted writes and release the lock, never "
            f"{_ACTING.get(call, call)} in its name; nothing was changed")
    mine = _grants(principal).patterns(principal_id(principal), kind)
    belongs = owners(principal, kind, name, claimed)
    if mine and not any(fnmatchcase(name, pattern) for pattern in mine):
        why = f"its grants allow only {kind} matching {list(mine)}"
    elif _grants(principal).granted(kind, name):
        why = (f"the auth file grants {what} '{name}' to "
               f"{', '.join(repr(p) for p in belongs)}")
    else:
        why = f"{what} '{name}' belongs to client {belongs[0]!r}, which used it first"
    raise PermissionDeniedError(
        f"{principal.name} may not call {call!r} for {what} '{name}' on {table}: {why} "
        "(an admin may reassign an owner id); nothing was changed")


def table_markdown(role_allows, required_role) -> str:
    """Who may do what to whose lock and position, as the security page prints it:
    `role_allows(role, required)` and `required_role(call)` come from the role table."""
    # its principal and the taker are taken to hold the role the call needs
    columns = [("its principal", OWN, None), ("the taker of its expired lock", TAKER, None),
               ("another write principal", OTHER, "write"), ("a read principal", OTHER, "read"),
               ("admin", ADMIN, "admin"), ("cluster", SERVERS, "cluster")]
    lines = ["| call | acts on | " + " | ".join(c[0] for c in columns) + " |",
             "| --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for call, (kind, _) in RULES.items():
        required = required_role(call)
        marks = []
        for _, relation_, role in columns:
            if relation_ == TAKER and kind == CONSUMERS:
                marks.append("—")
            else:
                marks.append("yes" if may(call, relation_) and
                             (role is None or role_allows(role, required)) else "no")
        lines.append(f"| `{call}` | {'lock' if kind == OWNERS else 'position'} | "
                     + " | ".join(marks) + " |")
    return "\n".join(lines)
