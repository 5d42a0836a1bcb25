"""Where a bucket's copies go, and who leads them: the coordinator's pure decisions.

Kept apart from the loop that applies them (replica_control) so the rules can be read, and
tested, without a cluster: placement spreads leaders and followers round robin over the live
servers; an election picks the next leader from the in-sync replicas only (a replica outside
them may lack acknowledged writes, so electing it would lose them); a replacement moves a long
dead server's copies to the live server holding the fewest; a server back under a new process
leaves the in-sync sets its copy may no longer deserve.
"""

from __future__ import annotations

import dataclasses

from tally.errors import InvalidOptionError, UnavailableError
from tally.server.coordinator.catalog import BucketReplicas

REPLICATION_FACTOR = "table.replication.factor"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
LAG_TIME = "table.replication.lag-time-ms"
MAX_LAG_TIME_MS = 24 * 3600 * 1000


def replication_factor(descriptor, default: int) -> int:
    """The table's replication factor: its option, else the cluster's default."""
    value = descriptor.properties.get(REPLICATION_FACTOR)
    if value is None:
        return default
    try:
        factor = int(value)
    except (TypeError, ValueError):
        factor = 0
    if factor < 1 or str(value).strip() != str(factor):
        raise InvalidOptionError(f"{REPLICATION_FACTOR} must be a whole number of at least 1, "
                                 f"not {value!r}")
    return factor


def min_insync_replicas(descriptor, factor: int) -> int:
    """How many in-sync copies a write needs before it is acknowledged: the table's
    `min.insync.replicas`, by default 2 once there are two copies or more (one copy more than
    the leader's own, so an acknowledged write survives the leader's disk), else 1."""
    value = descriptor.properties.get(MIN_INSYNC_REPLICAS)
    if value is None:
        return 2 if factor >= 2 else 1
    try:
        wanted = int(value)
    except (TypeError, ValueError):
        wanted = 0
    if not 1 <= wanted <= factor or str(value).strip() != str(wanted):
        raise InvalidOptionError(
            f"{MIN_INSYNC_REPLICAS} must be a whole number from 1 to the replication factor "
            f"({factor}), not {value!r}")
    return wanted


def replica_lag_time_ms(descriptor, default_ms: int) -> int:
    """Milliseconds a follower may go without catching up with its leader before it leaves
    the in-sync set: the table's `table.replication.lag-time-ms`, else the cluster's default
    (`--replica-lag-time`)."""
    value = descriptor.properties.get(LAG_TIME)
    if value is None:
        return default_ms
    try:
        ms = int(value)
    except (TypeError, ValueError):
        ms = 0
    if not 1 <= ms <= MAX_LAG_TIME_MS or str(value).strip() != str(ms):
        raise InvalidOptionError(
            f"{LAG_TIME} must be a whole number of milliseconds from 1 to {MAX_LAG_TIME_MS} "
            f"(a day), not {value!r}")
    return ms


def place(live: list[str], bucket_count: int, factor: int, salt: int) -> tuple[BucketReplicas, ...]:
    """Replicas for `bucket_count` new buckets on the `live` servers: bucket b's leader is
    live[(salt + b) % n] and its followers the next servers round the ring, so leaders and
    copies spread evenly and no server holds two copies of one bucket."""
    servers = sorted(live)
    if factor > len(servers):
        raise UnavailableError(
            f"{REPLICATION_FACTOR} is {factor} but only {len(servers)} tablet server(s) are "
            f"live: each copy of a bucket needs its own server; start more or lower the factor")
    out = []
    for b in range(bucket_count):
        first = (salt + b) % len(servers)
        replicas = tuple(servers[(first + i) % len(servers)] for i in range(factor))
        out.append(BucketReplicas(replicas[0], replicas, replicas, 0))
    return tuple(out)


def elect(current: BucketReplicas, live: set[str]) -> BucketReplicas:
    """The bucket after its leader is gone: the first live in-sync replica leads under the
    next epoch, and the in-sync set loses the servers that are not live. With no live in-sync
    replica the bucket is offline (leader None) and keeps its in-sync set, so that whichever of
    them returns first leads again: an out-of-sync replica never leads (it may lack writes
    that were acknowledged)."""
    candidates = [r for r in current.isr if r in live]
    if not candidates:
        if current.leader is None:
            return current
        return dataclasses.replace(current, leader=None, leader_epoch=current.leader_epoch + 1)
    leader = candidates[0]
    return BucketReplicas(leader, current.replicas, tuple(candidates),
                          current.leader_epoch + 1)


def without_dead_followers(current: BucketReplicas, live: set[str]) -> BucketReplicas:
    """The in-sync set without followers that are not live (the leader stays). An offline
    bucket keeps its set: whichever of them returns first must be able to lead."""
    if current.leader is None:
        return current
    isr = tuple(r for r in current.isr if r in live or r == current.leader)
    return current if isr == current.isr else dataclasses.replace(current, isr=isr)


def replace(current: BucketReplicas, gone: str, load: dict[str, int],
            live: set[str]) -> BucketReplicas:
    """The bucket with server `gone`'s copy moved to the live server holding the fewest
    copies that does not hold one of this bucket already (unchanged when there is none). A
    leader is never replaced here: an election moves leadership first."""
    if gone not in current.replicas or gone == current.leader:
        return current
    spare = sorted((s for s in live if s not in current.replicas),
                   key=lambda s: (load.get(s, 0), s))
    if not spare:
        return current
    chosen = spare[0]
    replicas = tuple(chosen if r == gone else r for r in current.replicas)
    isr = tuple(r for r in current.isr if r != gone)
    return BucketReplicas(current.leader, replicas, isr, current.leader_epoch)


def without_restarted(current: BucketReplicas, server: str, live: set[str]) -> BucketReplicas:
    """The bucket after `server` came back under a new process: its copy may be older than
    what it confirmed before (a data directory restored from a backup, writes an unsynced
    crash lost), so it leaves the in-sync set wherever another in-sync replica is live, and a
    bucket it led (or an offline one) is led by the first of those under the next epoch. It
    rejoins by catching up, like any follower. Where no other in-sync replica is live it
    stays: it is the last replica standing, and taking it out would leave no copy that may
    ever lead (see `last_standing`)."""
    if server not in current.isr:
        return current
    others = [r for r in current.isr if r != server and r in live]
    if not others:
        return current
    isr = tuple(r for r in current.isr if r != server)
    if current.leader in (server, None):
        return BucketReplicas(others[0], current.replicas, isr, current.leader_epoch + 1)
    return dataclasses.replace(current, isr=isr)


def last_standing(current: BucketReplicas, server: str, live: set[str]) -> bool:
    """Whether `server` is the only live in-sync replica of a bucket with other copies (what
    `without_restarted` keeps in sync, and the coordinator warns about)."""
    return len(current.replicas) > 1 and server in current.isr and \
        not any(r != server and r in live for r in current.isr)
