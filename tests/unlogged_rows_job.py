"""A process that runs a plan of writes, changelog truncations, tail cuts and checkpoints on
a KvTablet with a small row buffer, prints what it did, then kills itself with SIGKILL.

Rows reach RocksDB without its write-ahead log, so at the kill the rows written since the
memtables were last flushed are lost: the parent checks that the reopened bucket rebuilds
them from its changelog whatever the plan deleted from that changelog before the kill.

Run as `python -m tests.unlogged_rows_job PATH SEED PLAN`, PLAN a JSON list of steps:
["write", n] (the crash writer's next n writes), ["truncate"] (drop the whole changelog
below its end), ["cut", k] (cut the log's tail back to where the k-th newest standing
write began, if the log still holds it), ["checkpoint"]. One JSON line on stdout:
{"end", "start", "kept": seqs of the standing writes, "checkpoints": [[dir, kept]]}.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from tests.crash_writer import descriptor, make_write, send

SMALL_BUFFER = "8kb"  # the row buffer is flushed every few writes


def run(path: str, seed: int, plan: list):
    """(the open tablet, what the parent checks): the caller must hold the tablet until the
    kill, since dropping it closes RocksDB, which flushes the memtables."""
    from merge_engine.kv.tablet import KvTablet

    tablet = KvTablet.open(path, descriptor(SMALL_BUFFER))
    seq, kept, starts, checkpoints = 0, [], {}, []
    for step in plan:
        if step[0] == "write":
            for _ in range(step[1]):
                starts[seq] = tablet.log_end_offset
                send(tablet, make_write(seed, seq), seq)
                kept.append(seq)
                seq += 1
        elif step[0] == "truncate":
            tablet.truncate_log(tablet.log_end_offset)
        elif step[0] == "cut":
            standing = [s for s in kept if starts[s] >= tablet.log_start_offset]
            if standing:
                back = standing[-min(step[1], len(standing))]
                tablet.truncate_tail(starts[back])
                kept = [s for s in kept if s < back]
        elif step[0] == "checkpoint":
            directory = f"{path}-checkpoint-{len(checkpoints)}"
            tablet.checkpoint(directory)
            checkpoints.append([directory, list(kept)])
        else:
            raise ValueError(f"unknown step {step!r}")
    return tablet, {"end": tablet.log_end_offset, "start": tablet.log_start_offset,
                    "kept": kept, "checkpoints": checkpoints}


def main(argv: list[str]) -> None:
    tablet, done = run(argv[0], int(argv[1]), json.loads(argv[2]))
    print(json.dumps(done), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close: RocksDB's memtables die with the process
    tablet.close()  # never reached


if __name__ == "__main__":
    main(sys.argv[1:])
