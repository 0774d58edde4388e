"""What the group and transaction coordinators keep across restarts, in one LMDB store.

`ROOT/coordinator.lmdb` (never a `<topic>-<n>` name, so no partition scan sees it) holds:

- `epoch`: the coordinator epoch, bumped at every start, so transaction markers a
  previous process was writing are fenced by the logs once this one writes its own;
- `offsets/<id>`: a group's committed offsets, one value per group, so a load costs
  O(groups x partitions) whatever the commit history, and a commit rewrites only them;
- `group/<id>`: a group's generation, and its members and their assignments while it
  is Stable (rewritten at each rebalance, never by a commit);
- `txn/<id>`: a transactional id's producer id and epoch, state, partitions, and the
  offsets its transaction will commit.

Why LMDB and not a compacted `__consumer_offsets` log: every commit is one atomic,
durable write of the whole value, so a load reads only the latest value of each key
and needs no compaction or snapshot to stay bounded; and a transaction's Complete
state and the offsets it commits land in the same commit, so a crash can never apply
one without the other.

Keys are `<kind>/<id>` for ids up to MAX_PLAIN_ID_BYTES of UTF-8; longer ids (Kafka
allows 32,767 characters) are `<kind>#<SHA-256 of the id>`, since an LMDB key holds 511
bytes. The separator differs, so no id, however chosen, has another's key; the full id
is inside every value, and a load checks that it keys the value it is in.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

import msgpack

from oncelog.storage.fs import FileSystem, MetadataStore
from oncelog.storage.metadata_values import committing, decode_value, read_value

T = TypeVar("T")
STORE_DIR: Final = "coordinator.lmdb"
EPOCH_KEY: Final = "epoch"
# The kinds of record, each keyed by an id (see store_key).
GROUP: Final = "group"
OFFSETS: Final = "offsets"
TXN: Final = "txn"
MAX_PLAIN_ID_BYTES: Final = 400
_EPOCH = struct.Struct(">i")
MAX_COORDINATOR_EPOCH: Final = 2**31 - 1


def store_key(kind: str, ident: str) -> str:
    """The key of the `kind` record of `ident`: `kind/ident` if short, else `kind#SHA-256(ident)`."""
    raw = ident.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_PLAIN_ID_BYTES:
        return f"{kind}/{ident}"
    return f"{kind}#{hashlib.sha256(raw).hexdigest()}"


def _unpack(raw: bytes) -> dict[str, Any]:
    value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    if not isinstance(value, dict):
        raise ValueError(f"a coordinator record is a map, got {type(value).__name__}")
    return value


def _decoded(
    raw: bytes, *, key: str, kind: str, id_field: str, decode: Callable[[dict[str, Any]], T]
) -> tuple[dict[str, Any], T]:
    record = _unpack(raw)
    ident = record[id_field]
    if not isinstance(ident, str) or store_key(kind, ident) != key:
        raise ValueError(f"the record holds id {ident!r}, which is not keyed {key!r}")
    return record, decode(record)


class CoordinatorStore:
    """Durable records of groups and transactional ids; every write is one atomic commit."""

    def __init__(self, store: MetadataStore):
        self._store = store
        # LMDB serializes writers itself; this keeps a commit and the reads that build on it
        # from interleaving between the event loop and a marker-writing thread.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, fs: FileSystem, root: str) -> CoordinatorStore:
        return cls(fs.open_store(os.path.join(root, STORE_DIR)))

    @property
    def path(self) -> str:
        return self._store.path

    def next_epoch(self) -> int:
        """Bump and return the coordinator epoch (durable before any marker uses it)."""
        with self._lock:
            stored = read_value(self._store, EPOCH_KEY, lambda raw: int(_EPOCH.unpack(raw)[0]))
            epoch = 0 if stored is None else stored + 1
            if epoch > MAX_COORDINATOR_EPOCH:
                raise ValueError(f"the coordinator epoch in {self.path} is exhausted")
            # Durable first: a crash after markers of this epoch must not reuse it.
            with committing(self._store, f"storing coordinator epoch {epoch}"):
                self._store.put({EPOCH_KEY: _EPOCH.pack(epoch)})
            return epoch

    def records(
        self, kind: str, id_field: str, decode: Callable[[dict[str, Any]], T]
    ) -> Iterator[tuple[dict[str, Any], T]]:
        """Every `kind` record (GROUP, OFFSETS or TXN), with `decode(record)`.

        A record that does not unpack or `decode`, or whose id (`record[id_field]`) is not
        the one its key names, is CorruptMetadataError naming the store and the key.
        """
        for separator in "/#":
            for key in self._store.keys(kind + separator):
                raw = self._store.get(key)
                if raw is not None:
                    checked = functools.partial(
                        _decoded, key=key, kind=kind, id_field=id_field, decode=decode
                    )
                    yield decode_value(self._store, key, raw, checked)

    def write(self, records: Mapping[str, dict[str, Any]], what: str) -> None:
        """Store `records` (by key) in one atomic, durable commit."""
        packed = {key: msgpack.packb(record, use_bin_type=True) for key, record in records.items()}
        with self._lock, committing(self._store, what):
            self._store.put(packed)

    def delete(self, keys: list[str], what: str) -> None:
        """Remove `keys` (absent ones are ignored) in one atomic, durable commit."""
        with self._lock, committing(self._store, what):
            self._store.delete(keys)

    def close(self) -> None:
        self._store.close()
