"""A log's own metadata store, opened for writing only when first written.

A partition's store holds a handful of values (recovery point, log start, the
client-only flag, producers retired since the last snapshot), and only the log that
holds the partition directory's lock writes it. So the values are read once, in one
read-only open of the store (in LMDB: no lock file, no write buffers, closed at once),
and kept in memory; the writable store is opened by a commit and kept open while its
log commits often. An LMDB environment opened for writing costs three descriptors and
150 KiB to 2 MiB resident, so the process keeps at most STORE_WRITERS.capacity of them
(the least recently committed are closed, and reopened by their next commit): a
broker's idle partitions, however busy they once were, hold none.

Every commit goes to the writable store first and reaches the memory copy only once
it returned: a failed commit (a full disk) leaves both as they were. Everything goes
through the filesystem seam (`open_store`), so the fault twin stands in as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from oncelog import threads
from oncelog.errors import CorruptMetadataError
from oncelog.storage.clean_marker import StoreCopy
from oncelog.storage.fs import FileSystem, MetadataStore

log = logging.getLogger(__name__)

# Writable stores kept open in the process: a commit's LMDB environment open costs about
# as much as the commit, so a few dozen hot partitions keep theirs.
DEFAULT_STORE_WRITERS = 32


class StoreWriters:
    """The stores open for writing, least recently committed first; past `capacity` the
    oldest idle ones close. No I/O runs under its lock: closes run after, each under its
    own store's lock, and a store busy committing is skipped (its commit lists it again)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.closes = 0  # writers closed to make room (for tests and benchmarks)
        self._open: OrderedDict[PartitionStore, None] = OrderedDict()
        self._lock = threading.Lock()

    def committed(self, store: PartitionStore) -> None:
        """`store` just committed (its writer is open): most recent, and room made."""
        with self._lock:
            self._open[store] = None
            self._open.move_to_end(store)
            victims = []
            while len(self._open) > self.capacity:
                victim, _ = self._open.popitem(last=False)
                victims.append(victim)
        for victim in victims:
            if victim is not store and victim.close_writer_if_idle():
                self.closes += 1

    def forget(self, store: PartitionStore) -> None:
        with self._lock:
            self._open.pop(store, None)

    def resize(self, capacity: int) -> None:
        self.capacity = capacity

    def reset_after_fork(self) -> None:
        # A child's copies of the parent's stores are not its to close.
        self._open = OrderedDict()
        self._lock = threading.Lock()


STORE_WRITERS = StoreWriters(DEFAULT_STORE_WRITERS)
os.register_at_fork(after_in_child=STORE_WRITERS.reset_after_fork)


class PartitionStore:
    """A MetadataStore over `fs.open_store(path)` for a store this process alone writes."""

    def __init__(self, fs: FileSystem, path: str, copy: StoreCopy | None = None):
        """`copy`: what the store held when its log last closed cleanly, checked to be
        current (the marker's, recovery.clean_marker), which spares reading it; None:
        read on first use."""
        self._fs = fs
        self._path = path
        # Held across a commit (memory follows the store in commit order). One of the Log's
        # locks (oncelog.threads): the torture harness interleaves threads through it too.
        self._lock = threads.lock()
        self._values: dict[str, bytes] | None = None if copy is None else dict(copy.values)
        # The store's version (FileSystem.store_version) when it last held exactly `_values`,
        # taken after each read and commit; None if unknown. A close compares it with the
        # version then: a store changed behind this log's back gets no copy in the marker.
        self._version: bytes | None = None if copy is None else copy.store_version
        self._writer: MetadataStore | None = None  # opened by a commit
        self._commits = 0  # this log's commits: the only writer of a partition's store
        # Held while a commit uses the writer. A plain lock, taken by an evictor (any thread,
        # any Log, even another torture run's) only without blocking and never across I/O,
        # so it cannot stall the harness's scheduler; a commit takes it under `_lock`.
        self._writer_guard = threading.Lock()

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
                self._version = self._version_now()
        return self._values

    def _version_now(self) -> bytes | None:
        try:
            return self._fs.store_version(self._path)
        except (OSError, CorruptMetadataError):
            return None  # unknown: the close leaves no copy, and the next open reads the store

    def _writable(self) -> MetadataStore:
        if self._writer is None:
            writer = self._fs.open_store(self._path)
            try:
                if self._values and not writer.keys(""):
                    # Removed since the log read it (by hand, by a tool): the values this log
                    # holds are the store's, so they go back whole before anything else, not a
                    # lone recovery point that would hide the loss from the next open.
                    log.warning("%s was lost while its log was open: writing back what it held", self._path)
                    writer.put(dict(self._values))
                    # fsync(dirs): the recreated store's files must not vanish in a power loss.
                    self._fs.fsync_dir(self._path)
                    self._fs.fsync_dir(os.path.dirname(self._path) or ".")
            except BaseException:
                writer.close()  # (a damaged store raises in keys: its environment must not leak)
                raise
            self._writer = writer
        return self._writer

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._loaded().get(key)

    def copy_if_unchanged(self) -> StoreCopy | None:
        """Every value as this log's commits left them, with the store's version, if the
        store is still as its last read or commit left it; else None."""
        with self._lock:
            if self._values is None or self._version is None:
                return None
            if self._version_now() != self._version:
                return None  # changed, replaced or damaged since: the next open must read it
            return StoreCopy(self._version, dict(self._values))

    def generation(self) -> int:
        with self._lock:
            return self._commits

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key in self._loaded() if key.startswith(prefix))

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._lock:
            return sorted((key, value) for key, value in self._loaded().items() if key.startswith(prefix))

    def put(self, values: Mapping[str, bytes]) -> None:
        with self._lock:
            current = self._loaded()
            with self._writer_guard:
                self._writable().put(values)
            current.update(values)
            self._version = self._version_now()
            self._commits += 1
        STORE_WRITERS.committed(self)

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            current = self._loaded()
            with self._writer_guard:
                self._writable().delete(keys)
            for key in keys:
                current.pop(key, None)
            self._version = self._version_now()
            self._commits += 1
        STORE_WRITERS.committed(self)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        with self._lock:
            current = self._loaded()
            with self._writer_guard:
                new = self._writable().update(key, change)
            if new is None:
                current.pop(key, None)
            else:
                current[key] = new
            self._version = self._version_now()
            self._commits += 1
        STORE_WRITERS.committed(self)
        return new

    def close_writer_if_idle(self) -> bool:
        """Close the writable store unless a commit is using it; whether it closed. The
        values stay in memory, and the next commit opens the store again (once this close
        is done: opens of one store take turns, recovery.fs)."""
        if not self._writer_guard.acquire(blocking=False):
            return False
        try:
            writer, self._writer = self._writer, None
        finally:
            self._writer_guard.release()
        if writer is None:
            return False
        writer.close()
        return True

    def close(self) -> None:
        STORE_WRITERS.forget(self)
        with self._lock, self._writer_guard:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
