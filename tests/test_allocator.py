"""A process that opens a KvTablet puts Arrow on the system allocator, unless the user chose a
pool with ARROW_DEFAULT_MEMORY_POOL (merge_engine/kv/allocator.py says why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
import sys, pyarrow as pa
from tests.crash_writer import descriptor
from merge_engine.kv.tablet import KvTablet
before = pa.default_memory_pool().backend_name
with KvTablet.open(sys.argv[1], descriptor()) as tablet:
    tablet.put([{"id": 1, "qty": 2}])
print(before, pa.default_memory_pool().backend_name)
"""


def pools(tmp_path: Path, chosen: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "t")], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_opening_a_tablet_switches_arrow_to_the_system_allocator(tmp_path):
    _, after = pools(tmp_path, None)
    assert after == "system"


@pytest.mark.parametrize("chosen", ["mimalloc", "jemalloc"])
def test_a_pool_chosen_by_the_user_is_kept(tmp_path, chosen):
    import pyarrow as pa

    available = {"mimalloc": pa.mimalloc_memory_pool, "jemalloc": pa.jemalloc_memory_pool}
    try:
        available[chosen]()
    except NotImplementedError:
        pytest.skip(f"this pyarrow build has no {chosen}")
    assert pools(tmp_path, chosen) == [chosen, chosen]
