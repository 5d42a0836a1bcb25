"""A recovering job, run as its own process so tests can kill -9 it mid-undo.

Usage: python -m tests.cluster.recover_process URL TABLE OWNER COLUMN[,COLUMN...]
Re-acquires the owner's lock (a restarted job) and runs recover(); prints "done" at the end.
"""

import sys

from recovery import recover
from tally import client


def main() -> None:
    url, table, owner, columns = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    with client.connect(url, retry_timeout=30) as conn:
        lease = conn.locks.acquire(table, owner, columns, ttl=30)
        print("recovering", flush=True)
        report = recover(conn, table, lease, target_columns=conn.table(table).routing.primary_key
                         + tuple(c for c in columns))
        print(report.summary(), flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    main()
