"""Durable file steps shared by every store that renames files into place.

A rename is only durable once its directory is fsynced: without it a power loss can bring the
old name back (or no name at all), even though the file's own bytes were fsynced.
"""

from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    """Make the renames and creations in directory `path` survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, payload: bytes) -> None:
    """Replace `path` by `payload` atomically: a crash leaves the old file or the new one whole."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
