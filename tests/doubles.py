"""Fault doubles shared by the tests: file systems that fail one kind of call on demand.

Each wraps the real OS through the seam's DelegatingFileSystem; the fault-injecting
twin (oncelog.torture.faultfs) is for crash states, these are for one
failing call at a chosen moment.
"""

from __future__ import annotations

import errno
import os

from oncelog.storage.fs import DelegatingFileHandle, DelegatingFileSystem, FileHandle


def eio(path: str) -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO), path)


class FsyncFailingFileSystem(DelegatingFileSystem):
    """The real OS; every file fsync and fdatasync fails with EIO while `failing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.fsync_calls = 0

    def wrap(self, handle: FileHandle) -> FileHandle:
        return _FsyncFailingHandle(handle, self)


class _FsyncFailingHandle(DelegatingFileHandle):
    def __init__(self, inner: FileHandle, fs: FsyncFailingFileSystem) -> None:
        super().__init__(inner)
        self._fs = fs

    def fsync(self) -> None:
        self._fs.fsync_calls += 1
        if self._fs.failing:
            raise eio(self.path)
        self.inner.fsync()

    def fdatasync(self) -> None:
        self._fs.fsync_calls += 1
        if self._fs.failing:
            raise eio(self.path)
        self.inner.fdatasync()
