"""A small real filesystem for the disk-full tests: a tmpfs of a given size, mounted on a directory.

RocksDB then meets a real ENOSPC from the kernel, on its write-ahead log, its table files and its
manifest alike, which no injected fault reproduces faithfully. Mounting needs the right to mount
(root, as on the test machines); without it the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Iterator

import pytest

CHUNK = 1 << 20


@contextlib.contextmanager
def small_filesystem(path: str, size_bytes: int) -> Iterator[str]:
    """A tmpfs of `size_bytes` mounted on `path` (created) while the block runs."""
    os.makedirs(path, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command: the disk-full tests need a small tmpfs to fill")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", path],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size_bytes}-byte tmpfs to fill (the disk-full tests need "
                    f"the right to mount, e.g. root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazy: a process that still holds a file there cannot keep the mount alive.
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(directory: str, leave_bytes: int) -> str:
    """A filler file in `directory` that leaves about `leave_bytes` of its filesystem free; its
    path (delete it to give the space back)."""
    path = os.path.join(directory, "filler")
    size = shutil.disk_usage(directory).free - leave_bytes
    assert size > 0, f"{directory} has less than {leave_bytes} bytes free to begin with"
    zeros = bytes(CHUNK)
    with open(path, "wb") as f:
        while size > 0:
            f.write(zeros[:min(size, CHUNK)])
            size -= CHUNK
    return path
