"""A log's compression_type (Kafka's compression.type): client batches stored recompressed.

Kafka's broker stores a batch in the topic's codec when the producer used another one,
keeping every record and every header field but the codec bits, the length and the
CRC. Checked against kafka-python's independent decoder, and through the append rules:
a retried batch is still a duplicate, a batch too large once recompressed is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from log_helpers import read_all

from oncelog import Log, LogConfig, RecordTooLargeError
from oncelog.config import COMPRESSION_TYPES
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.validation import recompressed, stored_codec

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TARGETS = [name for name in COMPRESSION_TYPES if name != "producer"]

nullable_bytes = st.none() | st.binary(max_size=40)
records = st.lists(
    st.tuples(
        nullable_bytes, nullable_bytes, st.lists(st.tuples(st.text(max_size=4), nullable_bytes), max_size=2)
    ),
    min_size=1,
    max_size=12,
)


def _decoded(raw: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    records,
    st.sampled_from(CODECS),
    st.sampled_from(TARGETS),
    st.integers(-1, 2**40),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_a_recompressed_batch_keeps_every_record_and_header_field_but_codec_length_and_crc(
    specs: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    source: str,
    target: str,
    producer_id: int,
    base_sequence: int,
    transactional: bool,
) -> None:
    sent = encode_batch(
        specs,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence if producer_id >= 0 else -1,
        is_transactional=transactional and producer_id >= 0,
        timestamp_ms=1_700_000_000_000,
        compression=None if source == "none" else source,
    )
    codec = stored_codec(target)  # type: ignore[arg-type]
    assert codec is not None
    stored = recompressed(RecordBatch(sent), codec, 1 << 26)
    stored.validate()  # CRC, length, magic
    assert stored.compression == codec
    assert _decoded(bytes(stored.buffer)) == _decoded(sent)
    before, after = RecordBatch(sent), stored
    for field in ("base_offset", "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id"):
        assert getattr(after, field) == getattr(before, field), field
    assert (after.producer_epoch, after.base_sequence, after.records_count) == (
        before.producer_epoch,
        before.base_sequence,
        before.records_count,
    )
    assert after.attributes & ~fmt.COMPRESSION_MASK == before.attributes & ~fmt.COMPRESSION_MASK


@pytest.mark.parametrize("target", ["lz4", "zstd", "gzip", "snappy", "uncompressed"])
def test_a_log_stores_client_batches_in_its_codec_and_still_answers_retries_as_duplicates(
    tmp_path: Path, target: str
) -> None:
    config = LogConfig(compression_type=target)  # type: ignore[arg-type]
    codec = stored_codec(config.compression_type)
    log = Log.open(tmp_path / "p", config)
    try:
        sent = [
            encode_batch(
                [(b"k%d" % n, b"value %d " % n * 20)],
                producer_id=9,
                producer_epoch=0,
                base_sequence=n,
                compression="gzip" if n % 2 else None,
                timestamp_ms=1_000 + n,
            )
            for n in range(6)
        ]
        for n, batch in enumerate(sent):
            assert (log.append(batch) if n % 3 else log.append_batches([batch])[0]).first_offset == n
        stored = read_all(log)
        assert [RecordBatch(raw).compression for _, raw in stored] == [codec] * 6
        assert [_decoded(raw)[0][2:4] for _, raw in stored] == [_decoded(b)[0][2:4] for b in sent]
        retry = log.append(sent[-1])
        assert retry.duplicate and retry.first_offset == 5
    finally:
        log.close()


def test_replication_keeps_the_leaders_bytes(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "p", LogConfig(compression_type="lz4"))
    try:
        batch = encode_batch([(b"k", b"v")], timestamp_ms=1_000)
        log.append(batch, origin="replication")
        ((_, stored),) = read_all(log)
        assert stored[12:] == batch[12:]  # (the base offset is the log's)
    finally:
        log.close()


def test_a_batch_too_large_once_recompressed_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    config = LogConfig(compression_type="uncompressed", max_batch_bytes=2_000)
    log = Log.open(tmp_path / "p", config)
    try:
        compressible = encode_batch([(None, b"a" * 10_000)], compression="zstd", timestamp_ms=1_000)
        assert len(compressible) < 2_000
        with pytest.raises(RecordTooLargeError, match="once stored none"):
            log.append(compressible)
        assert log.log_end_offset == 0
    finally:
        log.close()


def test_a_log_reconfigured_back_to_producer_stores_batches_as_sent(tmp_path: Path) -> None:
    config = LogConfig(compression_type="lz4")
    log = Log.open(tmp_path / "p", config)
    try:
        batch = encode_batch(
            [(b"k", b"v" * 100)], producer_id=3, producer_epoch=0, base_sequence=0, timestamp_ms=1
        )
        log.append(batch)
        log.reconfigure(dataclasses.replace(config, compression_type="producer"))
        log.append(
            encode_batch(
                [(b"k", b"v" * 100)], producer_id=3, producer_epoch=0, base_sequence=1, timestamp_ms=1
            )
        )
        assert [RecordBatch(raw).compression for _, raw in read_all(log)] == [fmt.COMPRESSION_LZ4, 0]
    finally:
        log.close()


def test_an_uncompressed_batch_past_the_inflate_limit_is_recompressed_not_called_corrupt(
    tmp_path: Path,
) -> None:
    """The inflate limit bounds decompression; an uncompressed body is held to max_batch_bytes alone."""
    config = LogConfig(
        compression_type="gzip", max_batch_bytes=4 * 1024 * 1024, max_decompressed_batch_bytes=1024 * 1024
    )
    log = Log.open(tmp_path / "p", config)
    try:
        batch = encode_batch([(None, bytes(range(256)) * 8192)], timestamp_ms=1_000)  # 2 MiB of records
        log.append(batch)
        ((_, stored),) = read_all(log)
        assert RecordBatch(stored).compression == fmt.COMPRESSION_GZIP
        assert _decoded(stored)[0][3] == _decoded(batch)[0][3]
    finally:
        log.close()


def test_lz4_batches_are_stored_as_frames_of_independent_blocks_as_kafkas_reader_requires(
    tmp_path: Path,
) -> None:
    """Kafka's Lz4BlockInputStream (and so every Java consumer) refuses a frame whose blocks
    are linked: its FLG byte must have the block-independence bit."""
    log = Log.open(tmp_path / "p", LogConfig(compression_type="lz4"))
    try:
        records = [(None, bytes([n]) * 50_000) for n in range(6)]  # past one 64 KiB block
        log.append(encode_batch(records, compression="gzip", timestamp_ms=1_000))
        ((_, stored),) = read_all(log)
        frame = stored[fmt.HEADER_SIZE :]
        assert frame[:4] == b"\x04\x22\x4d\x18"  # the LZ4 frame magic
        assert frame[4] & 0x20, f"FLG {frame[4]:#x}: blocks are linked"
        assert [value for *_, value, _ in _decoded(stored)] == [value for _, value in records]
    finally:
        log.close()
