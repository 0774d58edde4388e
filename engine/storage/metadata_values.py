"""Values read back from and committed to a metadata store, with the failures named.

A commit that fails (a full disk, an I/O error) leaves the store as it was (LMDB
commits are atomic): MetadataWriteError naming the store and what was being done.

Every value in a store was written by oncelog, so one that does not decode (a wrong
size, garbage msgpack, fields this version cannot take) means the store is damaged
or was written by something else. That is CorruptMetadataError naming the store and
the key, never struct.error or a decoder's own exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from oncelog.errors import CorruptMetadataError, MetadataWriteError, OncelogError
from oncelog.storage.fs import MetadataStore

T = TypeVar("T")


def read_value(store: MetadataStore, key: str, decode: Callable[[bytes], T]) -> T | None:
    """`decode(store[key])`, or None if the key is absent."""
    raw = store.get(key)
    return None if raw is None else decode_value(store, key, raw, decode)


def decode_value(store: MetadataStore, key: str, raw: bytes, decode: Callable[[bytes], T]) -> T:
    """`decode(raw)` of the value stored at `key`; CorruptMetadataError if it does not decode."""
    try:
        return decode(raw)
    except Exception as exc:  # whatever the decoder raises, the bytes are what is wrong
        raise CorruptMetadataError(
            f"the value of {key!r} ({len(raw)} bytes) does not decode: {type(exc).__name__}: {exc}",
            path=store.path,
        ) from exc


@contextlib.contextmanager
def committing(store: MetadataStore, what: str) -> Iterator[None]:
    """Run the store's writes inside; an OSError from them is MetadataWriteError(`what`)."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, OncelogError):
            raise
        raise MetadataWriteError(
            f"{what} failed: {exc.strerror or exc}", path=store.path, errno=exc.errno
        ) from exc
