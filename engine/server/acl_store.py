"""The ACLs of a root, kept durably in its security store and read back at every change.

All ACLs are one value (key `acls`), so every change is one read-modify-write commit
(MetadataStore.update): two processes adding ACLs at once (a server answering CreateAcls,
an operator's `oncelog acls add`) both land, and a reader sees the set before a change or
after it, never half of it.

`current()` is what every request is decided against. It checks the store's generation
(a number every commit changes, read from LMDB's shared meta page without a value) and
reads the ACLs again only when it moved, so a change by any process takes effect at
each connection's next request.

The store also says whether the root has ever held an ACL (`ever_had_acls`): once it has,
authorization stays on even when the last ACL is removed (an empty list then denies
everyone but super users, as Kafka's authorizer does), so deleting ACLs never opens a
server that was closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final

import msgpack

from oncelog.server.acls import Acl, AclFilter, AclSet, InvalidAclError, check_acl
from oncelog.storage.fs import MetadataStore
from oncelog.storage.metadata_values import committing

ACLS_KEY: Final = "acls"
# The most ACLs a root holds: each request may read the whole set again after a change.
MAX_ACLS: Final = 10_000


class TooManyAclsError(InvalidAclError):
    """Adding these ACLs would pass MAX_ACLS."""


def _decode(raw: bytes | None) -> tuple[list[Acl], bool]:
    """The ACLs a stored value holds, and whether the root ever held one."""
    if raw is None:
        return [], False
    record = msgpack.unpackb(raw, raw=False, use_list=True)
    assert isinstance(record, dict) and isinstance(record.get("acls"), list), record
    return [Acl.from_row(row) for row in record["acls"]], bool(record.get("ever", True))


def _encode(acls: Iterable[Acl]) -> bytes:
    rows = [acl.as_row() for acl in sorted(set(acls))]
    return bytes(msgpack.packb({"acls": rows, "ever": True}, use_bin_type=True))


class AclStore:
    """The root's ACLs: changed in single commits, read through a cache the store's generation keys."""

    def __init__(self, store: MetadataStore):
        self._store = store
        self._lock = threading.Lock()
        self._cached: tuple[int, AclSet, bool] | None = None

    @property
    def path(self) -> str:
        return self._store.path

    def current(self) -> tuple[AclSet, bool]:
        """Every ACL now, and whether the root ever held one (then authorization is on)."""
        generation = self._store.generation()
        cached = self._cached
        if cached is not None and cached[0] == generation:
            return cached[1], cached[2]
        with self._lock:
            # Read after the generation: a commit between the two is seen at the next call.
            acls, ever = _decode(self._store.get(ACLS_KEY))
            self._cached = (generation, AclSet(acls), ever)
            return self._cached[1], ever

    def _change(self, what: str, change: Callable[[list[Acl]], list[Acl]]) -> None:
        def changed(raw: bytes | None) -> bytes | None:
            acls, _ = _decode(raw)
            after = change(acls)
            # Removing from a root that never held an ACL leaves it so (authorization off).
            return None if raw is None and not after else _encode(after)

        with committing(self._store, what):
            self._store.update(ACLS_KEY, changed)

    def add(self, new: Iterable[Acl]) -> list[Acl]:
        """Store `new` (each checked; one already there is kept once); the ACLs now stored."""
        adding = list(new)
        for acl in adding:
            check_acl(acl)
        stored: list[Acl] = []

        def with_new(acls: list[Acl]) -> list[Acl]:
            total = set(acls) | set(adding)
            if len(total) > MAX_ACLS:
                raise TooManyAclsError(f"a root holds at most {MAX_ACLS} ACLs; this would make {len(total)}")
            stored[:] = sorted(total)
            return stored

        self._change(f"storing {len(adding)} ACLs", with_new)
        return stored

    def remove(self, selectors: Iterable[AclFilter]) -> list[list[Acl]]:
        """Remove every ACL each filter matches, in one commit; what each filter removed."""
        filters = list(selectors)
        for selector in filters:
            selector.check()
        removed: list[list[Acl]] = []

        def without(acls: list[Acl]) -> list[Acl]:
            removed[:] = [[acl for acl in acls if selector.matches(acl)] for selector in filters]
            gone = {acl for matched in removed for acl in matched}
            return [acl for acl in acls if acl not in gone]

        self._change(f"removing the ACLs of {len(filters)} filters", without)
        return removed
