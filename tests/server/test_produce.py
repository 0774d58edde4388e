"""Produce's request-level rules on their own: one batch per partition, where validation runs."""

from __future__ import annotations

from oncelog.segments import encode_batch
from oncelog.server.handlers.produce import (
    INLINE_RECORDS,
    _cheap_to_validate,
    _Outcome,
    is_transactional,
    one_batch_error,
)


def _pending(*batches: bytes) -> list[tuple[str, _Outcome]]:
    return [("t", _Outcome(n, 0, records)) for n, records in enumerate(batches)]  # type: ignore[arg-type]


def test_small_uncompressed_requests_are_validated_on_the_loop_and_the_rest_in_a_thread() -> None:
    small = encode_batch([(b"k", b"v")] * 100)
    assert _cheap_to_validate(_pending(small, small))
    assert not _cheap_to_validate(_pending(encode_batch([(b"k", b"v")] * 10, compression="zstd")))
    many = encode_batch([(None, b"")] * (INLINE_RECORDS // 2 + 1))
    assert not _cheap_to_validate(_pending(many, many))  # more records in all than the loop takes
    assert not _cheap_to_validate(
        _pending(b"\x00" * 20)
    )  # too short to judge: the thread (and the engine) say


def test_exactly_one_batch_per_partition_and_the_transactional_bit_is_read_from_the_header() -> None:
    batch = encode_batch([(b"k", b"v")])
    assert one_batch_error(batch) is None
    assert one_batch_error(batch + batch) is not None
    assert one_batch_error(batch[:-1]) is not None
    assert one_batch_error(b"") == "no record batch"
    assert not is_transactional(batch)
    assert is_transactional(
        encode_batch([(b"k", b"v")], producer_id=1, producer_epoch=0, base_sequence=0, is_transactional=True)
    )
