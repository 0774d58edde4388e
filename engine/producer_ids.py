"""ProducerIdManager: hands out producer ids and bumps epochs.

PIDs come from blocks reserved durably in the metadata store before any PID in
them is issued: after a crash the manager starts at the next unreserved block,
so it never issues a PID twice and wastes at most one block per crash.

`init_producer_id(transactional_id)` keeps the same PID and bumps its epoch, which
fences the previous incarnation (its batches fail with InvalidProducerEpochError
once the new epoch has written); when the epoch would overflow i16 it moves to a
new PID at epoch 0, as Kafka does.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from oncelog.errors import ProducerIdsExhaustedError
from oncelog.segments import format as fmt
from oncelog.storage.fs import DEFAULT_FS, DirLock, FileSystem, MetadataStore
from oncelog.storage.log_dirs import create_dir, lock_dir, opening_failed, unnamed_os_error
from oncelog.storage.metadata_values import committing, read_value

STORE_DIR = "producer_ids.lmdb"
LOCK_FILE = "producer_ids.lock"
BLOCK_END_KEY = "block_end"  # the first PID not yet reserved
TXN_KEY_PREFIX = "txn/"
MAX_EPOCH = 2**15 - 1
MAX_TRANSACTIONAL_ID_BYTES = 511  # an LMDB key is at most 511 bytes, prefix included
_PID = struct.Struct(">q")
_PID_EPOCH = struct.Struct(">qh")


def next_epoch(epoch: int, *, kept_back: int = 0) -> int | None:
    """The epoch a transactional id moves to after `epoch`; None when its producer id has no
    epoch left, and a new producer id starts over at 0.

    The one epoch rule for transactional ids, of `init_producer_id` here and of the server's
    transaction coordinator. `kept_back` epochs at the top stay unused by this step: the
    coordinator keeps one for the bump that fences a zombie when it aborts (Kafka's
    TransactionMetadata: an epoch is exhausted at Short.MaxValue - 1).
    """
    assert 0 <= kept_back < MAX_EPOCH, kept_back
    return epoch + 1 if epoch + 1 <= MAX_EPOCH - kept_back else None


def _decode_pid(raw: bytes) -> int:
    producer_id = int(_PID.unpack(raw)[0])
    fmt.check_int("a stored producer id", producer_id, "i64", minimum=0)
    return producer_id


class ProducerLease(NamedTuple):
    producer_id: int
    producer_epoch: int
    base_sequence: int
    # After this the producer's state may expire from logs; lease a new PID by then.
    expire_ms: int


class ProducerIdManager:
    def __init__(
        self,
        store: MetadataStore,
        dir_lock: DirLock,
        block_size: int,
        lease_ms: int,
        clock: Callable[[], int],
    ):
        self._store = store
        self._dir_lock = dir_lock
        self.block_size = block_size
        self.lease_ms = lease_ms
        self._clock = clock
        reserved_end = read_value(store, BLOCK_END_KEY, _decode_pid) or 0
        # Start at the next unreserved block: whatever was left of the last one
        # before a crash may have been issued.
        self._next = self._block_end = reserved_end
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        block_size: int = 100,
        lease_ms: int = 24 * 3600 * 1000,
        fs: FileSystem | None = None,
        clock: Callable[[], int] | None = None,
    ) -> ProducerIdManager:
        """Open (creating) the manager kept under `root`, beside any logs there.

        CorruptMetadataError if its store is damaged; LogDirectoryError if `root` cannot
        be used (a file where the directory should be).
        """
        fmt.check_int("block_size", block_size, "i32", minimum=1)
        fmt.check_int("lease_ms", lease_ms, "i64", minimum=1)
        directory = os.fspath(root)
        fs = fs or DEFAULT_FS
        create_dir(fs, directory)
        held = f"a ProducerIdManager is already open on {directory}"
        dir_lock = lock_dir(fs, os.path.join(directory, LOCK_FILE), held)
        store: MetadataStore | None = None
        try:
            store = fs.open_store(os.path.join(directory, STORE_DIR))
            return cls(store, dir_lock, block_size, lease_ms, clock or (lambda: int(time.time() * 1000)))
        except BaseException as exc:
            if store is not None:
                store.close()
            dir_lock.release()
            if unnamed_os_error(exc):
                raise opening_failed(exc, directory) from exc
            raise

    def _allocate(self) -> int:
        if self._next == self._block_end:
            end = self._block_end + self.block_size
            if end > fmt.INT64_MAX:
                raise ProducerIdsExhaustedError(
                    f"no producer id is left below 2^63 in {self._store.path} (the next block ends at {end})"
                )
            # Durable before any PID of the block is issued, so none is ever issued twice.
            with committing(self._store, f"reserving producer ids up to {end}"):
                self._store.put({BLOCK_END_KEY: _PID.pack(end)})
            self._block_end = end
        producer_id = self._next
        self._next += 1
        return producer_id

    def lease(self, now_ms: int | None = None) -> ProducerLease:
        """A fresh PID at epoch 0, sequence 0, valid for `lease_ms`."""
        with self._lock:
            self._check_open()
            producer_id = self._allocate()
        now = self._clock() if now_ms is None else now_ms
        return ProducerLease(producer_id, 0, 0, now + self.lease_ms)

    def init_producer_id(self, transactional_id: str) -> tuple[int, int]:
        """(producer_id, epoch) for `transactional_id`: a new PID at epoch 0, then epoch + 1 each call."""
        key = TXN_KEY_PREFIX + transactional_id
        if not transactional_id or len(key.encode()) > MAX_TRANSACTIONAL_ID_BYTES:
            raise ValueError(f"transactional_id must be 1..{MAX_TRANSACTIONAL_ID_BYTES - 4} bytes")
        with self._lock:
            self._check_open()
            stored = read_value(self._store, key, _PID_EPOCH.unpack)
            if stored is None:
                producer_id, epoch = self._allocate(), 0
            else:
                producer_id, last_epoch = stored
                bumped = next_epoch(last_epoch)
                producer_id, epoch = (producer_id, bumped) if bumped is not None else (self._allocate(), 0)
            # Durable before it is returned: a crash must never hand the same epoch out again.
            with committing(self._store, f"recording epoch {epoch} of transactional id {transactional_id!r}"):
                self._store.put({key: _PID_EPOCH.pack(producer_id, epoch)})
        return producer_id, epoch

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._store.close()
            finally:
                self._dir_lock.release()

    def __enter__(self) -> ProducerIdManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this ProducerIdManager is closed")
