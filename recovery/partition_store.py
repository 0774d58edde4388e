"""A log's own metadata store, opened for writing only when first written.

A partition's store holds a handful of values (recovery point, log start, the
client-only flag, producers retired since the last snapshot), and only the log that
holds the partition directory's lock writes it. So the values are read once, in one
read-only open of the store (in LMDB: no lock file, no write buffers, closed at once),
and kept in memory; the writable store is opened by the first commit and kept until
close. An LMDB environment opened for writing costs three descriptors and about
150 KiB resident: a broker's idle partitions, opened and perhaps read but not written
since, hold neither.

Every commit goes to the writable store first and reaches the memory copy only once
it returned: a failed commit (a full disk) leaves both as they were. Everything goes
through the filesystem seam (`open_store`), so the fault twin stands in as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from oncelog import threads
from oncelog.recovery.fs import FileSystem, MetadataStore

log = logging.getLogger(__name__)


class PartitionStore:
    """A MetadataStore over `fs.open_store(path)` for a store this process alone writes."""

    def __init__(self, fs: FileSystem, path: str):
        self._fs = fs
        self._path = path
        # Held across a commit (memory follows the store in commit order). One of the Log's
        # locks (oncelog.threads): the torture harness interleaves threads through it too.
        self._lock = threads.lock()
        self._values: dict[str, bytes] | None = None  # read on first use
        self._writer: MetadataStore | None = None  # opened by the first commit

    @property
    def path(self) -> str:
        return self._path

    @property
    def is_open_for_writing(self) -> bool:
        return self._writer is not None

    def _loaded(self) -> dict[str, bytes]:
        if self._values is None:
            try:
                reader = self._fs.open_store(self._path, readonly=True)
            except FileNotFoundError:
                self._values = {}  # no store yet (a new log): the first commit creates it
            else:
                try:
                    values = dict(reader.items(""))  # one read transaction, not one per key
                finally:
                    reader.close()
                self._values = values
        return self._values

    def _writable(self) -> MetadataStore:
        if self._writer is None:
            writer = self._fs.open_store(self._path)
            if self._values and not writer.keys(""):
                # Removed since the log read it (by hand, by a tool): the values this log
                # holds are the store's, so they go back whole before anything else, not a
                # lone recovery point that would hide the loss from the next open.
                log.warning("%s was lost while its log was open: writing back what it held", self._path)
                try:
                    writer.put(dict(self._values))
                    # fsync(dirs): the recreated store's files must not vanish in a power loss.
                    self._fs.fsync_dir(self._path)
                    self._fs.fsync_dir(os.path.dirname(self._path) or ".")
                except BaseException:
                    writer.close()
                    raise
            self._writer = writer
        return self._writer

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._loaded().get(key)

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key in self._loaded() if key.startswith(prefix))

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._lock:
            return sorted((key, value) for key, value in self._loaded().items() if key.startswith(prefix))

    def put(self, values: Mapping[str, bytes]) -> None:
        with self._lock:
            current = self._loaded()
            self._writable().put(values)
            current.update(values)

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            current = self._loaded()
            self._writable().delete(keys)
            for key in keys:
                current.pop(key, None)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        with self._lock:
            current = self._loaded()
            new = self._writable().update(key, change)
            if new is None:
                current.pop(key, None)
            else:
                current[key] = new
            return new

    def close(self) -> None:
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()
