"""Values read back from a metadata store: one that does not decode is damage, and named.

Every value in a store was written by oncelog, so one that does not decode (a wrong
size, garbage msgpack, fields this version cannot take) means the store is damaged
or was written by something else. That is CorruptMetadataError naming the store and
the key, never struct.error or a decoder's own exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from oncelog.errors import CorruptMetadataError
from oncelog.recovery.fs import MetadataStore

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
