"""A local pyarrow filesystem that dies after a set number of writes, to stand for a process
killed in the middle of an upload: every effect before the crash is on disk, none after."""

from __future__ import annotations

import pyarrow.fs as pafs


class SimulatedCrash(Exception):
    """The process 'died' here; not an OSError, so nothing under test mistakes it for a
    failed write it may report or recover from."""


class CrashingHandler(pafs.FileSystemHandler):
    """Local files; `crash_after = k` lets k more writes (a file written or moved into place)
    happen and makes the next one crash before it has any effect."""

    def __init__(self):
        self.local = pafs.LocalFileSystem()
        self.crash_after: int | None = None

    def _step(self) -> None:
        if self.crash_after is not None:
            if self.crash_after == 0:
                raise SimulatedCrash()
            self.crash_after -= 1

    def open_output_stream(self, path, metadata):
        self._step()
        return self.local.open_output_stream(path)

    def move(self, src, dest):
        self._step()
        self.local.move(src, dest)

    def get_type_name(self):
        return "crashing-local"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError("never deletes a whole filesystem")

    def delete_file(self, path):
        self.local.delete_file(path)

    def copy_file(self, src, dest):
        self._step()
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_append_stream(self, path, metadata):
        self._step()
        return self.local.open_append_stream(path)


def crashing_filesystem() -> tuple[pafs.FileSystem, CrashingHandler]:
    handler = CrashingHandler()
    return pafs.PyFileSystem(handler), handler
