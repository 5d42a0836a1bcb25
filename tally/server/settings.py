"""Defaults shared by the server roles and the command line (kept free of heavy imports)."""

DEFAULT_MAX_BATCH_BYTES = 64 << 20   # largest write request a tablet server accepts
DEFAULT_MEMORY_BUDGET = "1gb"       # write memory of all buckets of a tablet server (MemoryBudget)
SESSION_TIMEOUT = 3.0                # seconds of silence before a tablet server counts as gone
HEARTBEAT_INTERVAL = 0.5             # seconds between a tablet server's heartbeats
# a leader lease lasts this share of the session timeout from its heartbeat's send time: the
# rest is the margin for clocks that run at different rates (leader_lease)
LEASE_FRACTION = 0.75
STORAGE_PROBE_INTERVAL = 1.0         # seconds between looks for buckets to reopen (disk full)
DEFAULT_SCAN_BATCH_ROWS = 65536        # rows per batch of a scan that names no batch_size

# replication
REPLICA_ACK_TIMEOUT = 30.0   # longest a write waits for its followers before it is not acknowledged
REPLICA_LAG_TIME = 10.0      # default seconds a follower may go without catching up and stay in sync
# How long one offsets request may wait for its buckets' tails: below the callers' per-call
# deadline, above the replica lag time after which a stuck follower leaves the in-sync set.
SETTLE_TIMEOUT = 20.0

# remote snapshots (--remote-dir)
SNAPSHOT_INTERVAL = 300.0            # seconds between snapshots of each led bucket that moved
SEGMENT_INTERVAL = 10.0              # seconds between uploads of acknowledged changelog
SNAPSHOT_KEEP = 3                    # remote snapshots kept per bucket

# the lake (--datalake-dir)
TIER_TIMEOUT = 15.0                  # seconds a tiering process may miss heartbeats
