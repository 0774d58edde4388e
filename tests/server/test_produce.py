"""Produce's request-level rules on their own: one batch per partition, where validation runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from oncelog import LogConfig
from oncelog.segments import encode_batch
from oncelog.server.handlers.produce import (
    INLINE_BYTES,
    INLINE_RECORDS,
    _cheap_to_validate,
    _Outcome,
    is_transactional,
    one_batch_error,
)


def _pending(*batches: bytes, topic: str = "t") -> list[tuple[str, _Outcome]]:
    return [(topic, _Outcome(n, 0, records)) for n, records in enumerate(batches)]  # type: ignore[arg-type]


class _Topics:
    """What _cheap_to_validate asks the broker: each topic's log config."""

    def __init__(self, **compression_types: str) -> None:
        self._configs = {topic: LogConfig(compression_type=kind) for topic, kind in compression_types.items()}  # type: ignore[arg-type]

    def log(self, topic: str, partition: int) -> Any:
        return SimpleNamespace(config=self._configs.get(topic, LogConfig()))


def test_small_uncompressed_requests_are_validated_on_the_loop_and_the_rest_in_a_thread() -> None:
    broker: Any = _Topics(gz="gzip")
    small = encode_batch([(b"k", b"v")] * 100)
    assert _cheap_to_validate(broker, _pending(small, small))
    assert not _cheap_to_validate(broker, _pending(encode_batch([(b"k", b"v")] * 10, compression="zstd")))
    many = encode_batch([(None, b"")] * (INLINE_RECORDS // 2 + 1))
    assert not _cheap_to_validate(broker, _pending(many, many))  # more records in all than the loop takes
    large = encode_batch([(None, b"x" * (INLINE_BYTES // 4))] * 3)
    assert not _cheap_to_validate(broker, _pending(large, large))  # more bytes in all (a CRC and a copy each)
    assert not _cheap_to_validate(broker, _pending(small, topic="gz"))  # compressed again on append
    assert not _cheap_to_validate(
        broker, _pending(b"\x00" * 20)
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
