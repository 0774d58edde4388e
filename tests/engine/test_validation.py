"""validate_batch: the checks of a client batch, made in C when the compiled append is built.

The compiled check (compiled_append.client_batch_passes) is the compiled append's own,
used by validate_batch for batches the compiled append leaves to Python (a transaction's
first batch in a partition, say). It may refuse what the Python checks accept (it leaves
compressed batches and record headers to them), never the reverse: mutated batches,
their CRC made right again so that the record walk is what decides, are accepted by
the C checks only if the Python checks accept them too.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog import compiled_append
from oncelog.errors import OncelogError
from oncelog.segments.batch import encode_batch
from oncelog.validation import validate_batch

MAX_BATCH_BYTES = 1 << 20
MAX_DECOMPRESSED_BYTES = 1 << 24
CRC_AT, CRC_FROM = 17, 21

needs_compiled = pytest.mark.skipif(
    not compiled_append.enabled(), reason="the compiled append is off (not built, or ONCELOG_PURE=1)"
)


def with_crc_fixed(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, CRC_AT, crc32c.crc32c(bytes(batch[CRC_FROM:])))
    return bytes(batch)


def python_accepts(batch: bytes) -> bool:
    with compiled_append.forced_pure():
        try:
            validate_batch(batch, "client", MAX_BATCH_BYTES, MAX_DECOMPRESSED_BYTES)
        except OncelogError:
            return False
    return True


records = st.lists(
    st.tuples(st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=200)),
    min_size=1,
    max_size=30,
)


@needs_compiled
@given(records, st.integers(-1, 2**40), st.booleans())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_a_sound_batch_passes_the_compiled_checks_and_validates_to_the_same_view(
    pairs: list[tuple[bytes | None, bytes | None]], timestamp_ms: int, idempotent: bool
) -> None:
    ids = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 3} if idempotent else {}
    batch = encode_batch(pairs, timestamp_ms=timestamp_ms, **ids)  # type: ignore[arg-type]
    assert compiled_append.client_batch_passes(batch, MAX_BATCH_BYTES)
    view = validate_batch(batch, "client", MAX_BATCH_BYTES, MAX_DECOMPRESSED_BYTES)
    assert bytes(view.buffer) == batch and view.records_count == len(pairs)
    assert python_accepts(batch)


@needs_compiled
@given(records, st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_compiled_checks_never_pass_a_batch_the_python_checks_refuse(
    pairs: list[tuple[bytes | None, bytes | None]], data: st.DataObject
) -> None:
    batch = bytearray(
        encode_batch(pairs, timestamp_ms=1_700_000_000_000, producer_id=5, producer_epoch=1, base_sequence=0)
    )
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        batch = batch[: data.draw(st.integers(0, len(batch)))]
    mutated = with_crc_fixed(batch) if len(batch) > CRC_FROM and data.draw(st.booleans()) else bytes(batch)
    if compiled_append.client_batch_passes(mutated, MAX_BATCH_BYTES):
        assert python_accepts(mutated)
        assert validate_batch(mutated, "client", MAX_BATCH_BYTES, MAX_DECOMPRESSED_BYTES).size == len(mutated)
    else:  # the Python checks decide, as without the compiled module
        try:
            validate_batch(mutated, "client", MAX_BATCH_BYTES, MAX_DECOMPRESSED_BYTES)
            accepted = True
        except OncelogError:
            accepted = False
        assert accepted == python_accepts(mutated)


def test_a_batch_past_max_batch_bytes_is_refused_by_size_on_both_paths() -> None:
    batch = encode_batch([(None, b"x" * 500)], timestamp_ms=0)
    assert not compiled_append.client_batch_passes(batch, 100)
    for pure in (True, False):
        with compiled_append.forced_pure(pure), pytest.raises(OncelogError, match="max_batch_bytes"):
            validate_batch(batch, "client", 100, MAX_DECOMPRESSED_BYTES)
