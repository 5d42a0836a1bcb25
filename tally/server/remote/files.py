"""The files of a remote directory: a local path or any pyarrow filesystem URI, written so that
a reader never sees half a file.

Remote snapshots trust a file once its name exists. Object stores (S3, GCS, Azure) make an
object visible only when its upload completes, so there a file is written under its own name;
elsewhere (a local disk, HDFS) it is written under a temporary name and then renamed. A crash
leaves at most temporary names, which `is_temporary` recognises so that clean-up removes them.
Everything on the remote side goes through pyarrow.fs, never through os.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow.fs as pafs

OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})  # where a finished upload is atomic
TEMPORARY = ".tmp-"
CHUNK = 1 << 20


def is_temporary(key: str) -> bool:
    """Whether `key` names a file an interrupted write left behind."""
    return TEMPORARY in key.rsplit("/", 1)[-1]


def file_chunks(path: str, chunk: int = CHUNK) -> Iterator[bytes]:
    """The bytes of the local file `path`, a chunk at a time, so large files stream."""
    with open(path, "rb") as f:
        while data := f.read(chunk):
            yield data


@dataclass(frozen=True)
class Listed:
    """A file or directory found under the remote root: `key` is its path below the root."""

    key: str
    size: int
    is_dir: bool


class RemoteFiles:
    """Keys (slash-separated paths below the root) on one pyarrow filesystem.

    `uri` is a plain local path or a URI for pyarrow.fs.FileSystem.from_uri; with `filesystem`
    given, `uri` is the root's path on it (tests wrap a filesystem to fail mid-write).
    """

    def __init__(self, uri: str, filesystem: pafs.FileSystem | None = None):
        if filesystem is not None:
            self.fs, root = filesystem, uri
        elif "://" in uri:
            self.fs, root = pafs.FileSystem.from_uri(uri)
        else:
            self.fs, root = pafs.LocalFileSystem(), os.path.abspath(uri)
        self.root = root.rstrip("/")
        self._atomic_puts = self.fs.type_name in OBJECT_STORES

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write the file `key` whole or not at all; the bytes written."""
        target = self.path(key)
        if self._atomic_puts:
            return self._stream(target, chunks)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        temporary = f"{target}{TEMPORARY}{uuid.uuid4().hex}"
        written = self._stream(temporary, chunks)
        self.fs.move(temporary, target)
        return written

    def _stream(self, path: str, chunks: Iterable[bytes]) -> int:
        written = 0
        with self.fs.open_output_stream(path) as out:
            for data in chunks:
                out.write(data)
                written += len(data)
        return written

    def read(self, key: str) -> bytes:
        """The whole file `key`; FileNotFoundError (or the store's OSError) when absent."""
        with self.fs.open_input_stream(self.path(key)) as f:
            return f.read()

    def chunks(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """The file `key` a chunk at a time; raises before the first chunk when it is absent."""
        stream = self.fs.open_input_stream(self.path(key))
        return self._drain(stream, chunk)

    @staticmethod
    def _drain(stream, chunk: int) -> Iterator[bytes]:
        with stream:
            while data := stream.read(chunk):
                yield data

    def list(self, key: str, recursive: bool = False) -> list[Listed]:
        """What lies below directory `key` (nothing when it does not exist)."""
        base = self.path(key)
        selector = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.NotFound:
                continue
            below = info.path[len(self.root) + 1:]
            is_dir = info.type == pafs.FileType.Directory
            found.append(Listed(below, 0 if is_dir else (info.size or 0), is_dir))
        return found

    def delete(self, key: str) -> None:
        """Delete the file `key`; one already gone is fine (a retried clean-up)."""
        try:
            self.fs.delete_file(self.path(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, key: str) -> None:
        """Delete directory `key` with everything below it, if it exists."""
        if self.fs.get_file_info(self.path(key)).type != pafs.FileType.NotFound:
            self.fs.delete_dir(self.path(key))
