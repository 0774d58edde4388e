"""Poison batches (issue 15, section 3): a right header and CRC over a body that does not decode.

Such a batch used to be accepted: it took the offsets its header claimed (2 billion
for recordsCount 2^31-1), and every reader after it failed with CorruptRecordError.
Each scenario here is refused on both append paths (Log.append's single-batch route and
Log.append_batches' request path) with the error the brief names (bad bytes:
CorruptRecordError; a broken rule: InvalidRecordError), and the log's files stay
byte for byte as they were.

Batches are forged here from raw bytes with struct and an independent zigzag
encoder, so the checks are not tested against the engine's own codec.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import lz4.frame
import pytest
import zstandard
from kafka.record.default_records import DefaultRecordBatch

from oncelog.bench.references import Headers, ReferenceRecord, kafka_python_batch
from oncelog.config import LogConfig
from oncelog.errors import CorruptRecordError, InvalidRecordError
from oncelog.log import Log
from oncelog.segments import RecordBatch, encode_batch
from oncelog.segments.records import Record
from oncelog.storage.fs import OsFileSystem
from oncelog.tools.partition_dirs import read_partition_meta

T0 = 1_700_000_000_000
HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte v2 header, written out independently
GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CONFIG = LogConfig(segment_index_bytes=4096)  # small pre-allocated indexes: cheap to hash


# -- forging batches ---------------------------------------------------------------------------
def zigzag(value: int) -> bytes:
    """Protobuf zigzag varint, written out without the engine's encoder."""
    zz = value * 2 if value >= 0 else -value * 2 - 1
    out = bytearray()
    while zz >= 0x80:
        out.append(zz & 0x7F | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def length_prefixed(data: bytes | None) -> bytes:
    return zigzag(-1) if data is None else zigzag(len(data)) + data


def record_body(
    offset_delta: int,
    key: bytes | None = b"k",
    value: bytes | None = b"value",
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
    *,
    timestamp_delta: bytes | None = None,
    header_count: bytes | None = None,
) -> bytes:
    """A record without its length prefix; `timestamp_delta` / `header_count` override the encoding."""
    out = b"\x00"  # attributes
    out += zigzag(0) if timestamp_delta is None else timestamp_delta
    out += zigzag(offset_delta) + length_prefixed(key) + length_prefixed(value)
    out += zigzag(len(headers)) if header_count is None else header_count
    for hkey, hvalue in headers:
        out += length_prefixed(hkey) + length_prefixed(hvalue)
    return out


def record(offset_delta: int, **fields: object) -> bytes:
    body = record_body(offset_delta, **fields)  # type: ignore[arg-type]
    return zigzag(len(body)) + body


def forge(
    body: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    codec: int = 0,
    base_offset: int = 0,
    producer_id: int = -1,
) -> bytes:
    """A batch with these header fields over `body` (already compressed if `codec`), with a right CRC."""
    header = HEADER.pack(
        base_offset,
        49 + len(body),  # batchLength: everything after itself
        -1,
        2,
        0,
        codec,
        count - 1 if last_offset_delta is None else last_offset_delta,
        T0,
        T0,
        producer_id,
        0 if producer_id >= 0 else -1,
        0 if producer_id >= 0 else -1,
        count,
    )
    data = bytearray(header + body)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


TWO_RECORDS = record(0) + record(1)
GOOD = forge(TWO_RECORDS, 2)


def dir_digest(directory: Path) -> dict[str, str]:
    """Every file under the partition, the metadata store's data included (not its reader lock)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "lock.mdb"
    }


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topic-0"


@pytest.fixture
def log(log_dir: Path) -> Iterator[Log]:
    opened = Log.open(log_dir, CONFIG)
    opened.append_batches([GOOD, GOOD])  # something in the log to keep unchanged
    yield opened
    opened.close()


# -- the scenarios -------------------------------------------------------------------------------
def _records_count_int32_max_over_2_records() -> bytes:
    return forge(TWO_RECORDS, 2**31 - 1)  # lastOffsetDelta 2^31-2: the header is consistent


def _garbage_gzip_body() -> bytes:
    return forge(bytes(range(7, 250, 3)), 2, codec=GZIP)


def _garbage_zstd_body() -> bytes:
    # zstd's magic number, then garbage: a client bug, not a random byte string.
    return forge(b"\x28\xb5\x2f\xfd" + bytes(range(40, 140)), 2, codec=ZSTD)


def _zero_filled_body() -> bytes:
    return forge(bytes(len(TWO_RECORDS)), 2)


def _short_body() -> bytes:
    return forge(TWO_RECORDS[:-4], 2)  # batchLength and CRC say the short body is the whole batch


def _offset_deltas_out_of_order() -> bytes:
    return forge(record(1) + record(0), 2)


def _offset_deltas_repeated() -> bytes:
    return forge(record(0) + record(0), 2)


def _record_length_past_the_batch() -> bytes:
    body = record_body(0)
    return forge(zigzag(len(body) + 200) + body, 1)


def _header_count_that_does_not_fit() -> bytes:
    return forge(record(0, header_count=zigzag(1000)), 1)


def _varint_longer_than_10_bytes() -> bytes:
    # An 11-byte timestamp delta (a varlong has at most 10), the record's length counting it.
    return forge(record(0, timestamp_delta=b"\x80" * 10 + b"\x00"), 1)


def _offset_delta_varint_longer_than_5_bytes() -> bytes:
    body = b"\x00" + zigzag(0) + b"\x80\x80\x80\x80\x80\x00" + zigzag(-1) + zigzag(-1) + zigzag(0)
    return forge(zigzag(len(body)) + body, 1)


def _negative_value_length() -> bytes:
    body = b"\x00" + zigzag(0) + zigzag(0) + zigzag(-1) + zigzag(-7) + zigzag(0)
    return forge(zigzag(len(body)) + body, 1)


def _null_header_key() -> bytes:
    body = record_body(0, header_count=zigzag(1)) + zigzag(-1) + zigzag(-1)
    return forge(zigzag(len(body)) + body, 1)


def _header_key_not_utf8() -> bytes:
    return forge(record(0, headers=((b"\xff\xfe", b"v"),)), 1)


def _bytes_after_the_last_record() -> bytes:
    return forge(TWO_RECORDS + b"\x00\x00", 2)


def _fewer_records_than_counted() -> bytes:
    return forge(TWO_RECORDS, 3)  # 3 counted, 2 there (3 minimal records would still fit)


Scenario = tuple[str, Callable[[], bytes], type[Exception], str]
SCENARIOS: list[Scenario] = [
    ("records-count-2^31-1-over-2-records", _records_count_int32_max_over_2_records, CorruptRecordError,
     "recordsCount 2147483647 cannot fit"),
    ("garbage-gzip-body", _garbage_gzip_body, CorruptRecordError, "gzip body does not decompress"),
    ("garbage-zstd-body", _garbage_zstd_body, CorruptRecordError, "zstd body does not decompress"),
    ("zero-filled-body", _zero_filled_body, CorruptRecordError, "record 0"),
    ("short-body", _short_body, CorruptRecordError, "record 1"),
    ("offset-deltas-out-of-order", _offset_deltas_out_of_order, InvalidRecordError, "offset delta 1"),
    ("offset-deltas-repeated", _offset_deltas_repeated, InvalidRecordError, "record 1 has offset delta 0"),
    ("record-length-past-the-batch", _record_length_past_the_batch, CorruptRecordError,
     "length runs 200 bytes past"),
    ("header-count-that-does-not-fit", _header_count_that_does_not_fit, CorruptRecordError,
     "header count 1000"),
    ("varint-longer-than-10-bytes", _varint_longer_than_10_bytes, CorruptRecordError,
     "varint longer than 10 bytes"),
    ("offset-delta-varint-longer-than-5-bytes", _offset_delta_varint_longer_than_5_bytes, CorruptRecordError,
     "varint longer than 5 bytes"),
    ("negative-value-length", _negative_value_length, CorruptRecordError, "negative value length -7"),
    ("null-header-key", _null_header_key, CorruptRecordError, "null header key"),
    ("header-key-not-utf8", _header_key_not_utf8, CorruptRecordError, "not UTF-8"),
    ("bytes-after-the-last-record", _bytes_after_the_last_record, CorruptRecordError, "2 bytes after"),
    ("fewer-records-than-counted", _fewer_records_than_counted, CorruptRecordError,
     "end inside record 2 of recordsCount 3"),
]  # fmt: skip
SCENARIO_PARAMS = [pytest.param(make, error, match, id=name) for name, make, error, match in SCENARIOS]


def _append_one(log: Log, batch: bytes) -> object:
    return log.append(batch)


def _append_in_a_request(log: Log, batch: bytes) -> object:
    return log.append_batches([GOOD, batch, GOOD])  # the good ones around it are not written either


APPENDS = [pytest.param(_append_one, id="append"), pytest.param(_append_in_a_request, id="append_batches")]


@pytest.mark.parametrize("append", APPENDS)
@pytest.mark.parametrize(("make", "error", "match"), SCENARIO_PARAMS)
def test_a_poison_batch_is_refused_and_the_log_is_byte_for_byte_unchanged(
    log: Log,
    log_dir: Path,
    make: Callable[[], bytes],
    error: type[Exception],
    match: str,
    append: Callable[[Log, bytes], object],
) -> None:
    before, end = dir_digest(log_dir), log.log_end_offset
    with pytest.raises(error, match=match):
        append(log, make())
    assert dir_digest(log_dir) == before
    assert log.log_end_offset == end == 4
    # Nothing was half-done: the log takes the next batch at the next offset.
    assert log.append(GOOD).first_offset == 4
    assert [r.offset for b in log.read(0).batches for r in b.records()] == list(range(6))


@pytest.mark.parametrize("make", [s[1] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_the_scenarios_are_poison_only_in_their_bodies(make: Callable[[], bytes]) -> None:
    """Each forged batch passes every header check (length, magic, CRC, count = delta + 1)."""
    batch = make()
    fields = HEADER.unpack_from(batch)
    assert fields[1] + 12 == len(batch) and fields[3] == 2
    assert fields[4] == crc32c.crc32c(batch[21:])
    assert fields[12] == fields[6] + 1 > 0


def test_a_poison_batch_from_a_producer_leaves_its_sequence_unused(log: Log, log_dir: Path) -> None:
    poison = forge(record(1) + record(0), 2, producer_id=5)
    with pytest.raises(InvalidRecordError):
        log.append(poison)
    assert log.producer_state(5) is None
    # The producer's first batch is still its first: sequence 0 goes in at the log end.
    assert log.append(forge(TWO_RECORDS, 2, producer_id=5)).first_offset == 4


# -- decompression bombs ---------------------------------------------------------------------------
BOMB_VALUE_BYTES = 8 * 1024 * 1024  # one record: compresses to a few KiB in every codec


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    value = bytes(BOMB_VALUE_BYTES)
    return {codec: encode_batch([(None, value)], timestamp_ms=T0, compression=codec) for codec in CODECS}


CODECS = ["gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("append", APPENDS)
@pytest.mark.parametrize("codec", CODECS)
def test_a_decompression_bomb_is_refused_past_max_decompressed_batch_bytes(
    tmp_path: Path, bombs: dict[str, bytes], codec: str, append: Callable[[Log, bytes], object]
) -> None:
    bomb = bombs[codec]
    assert len(bomb) < 600_000  # small on the wire: its body inflates 14x or more
    config = LogConfig(segment_index_bytes=4096, max_decompressed_batch_bytes=1024 * 1024)
    with Log.open(tmp_path / "bombed-0", config) as bombed:
        bombed.append(GOOD)
        before = dir_digest(tmp_path / "bombed-0")
        with pytest.raises(CorruptRecordError, match="inflates past 1048576 bytes"):
            append(bombed, bomb)
        assert dir_digest(tmp_path / "bombed-0") == before
    # The same batch is valid: under a bound it fits, it goes in and reads back whole.
    roomy = LogConfig(segment_index_bytes=4096, max_decompressed_batch_bytes=16 * 1024 * 1024)
    with Log.open(tmp_path / "roomy-0", roomy) as log:
        assert log.append(bomb).first_offset == 0
        (value,) = [r.value for r in log.read(0).records()]
        assert value == bytes(BOMB_VALUE_BYTES)


def gigabyte_bomb(codec: str) -> bytes:
    """A batch whose body inflates to 1 GiB of zeros, made without holding that gigabyte.

    gzip: after a full flush deflate forgets its history, so every further 1 MiB of
    zeros compresses to the same bytes, repeated here (the stream has no trailer: it is
    refused long before its end). lz4 and zstd: their streaming compressors.
    """
    chunk = bytes(1 << 20)
    if codec == "gzip":
        deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
        first = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
        again = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
        return forge(first + again * 1023, 1, codec=GZIP)
    if codec == "lz4":
        frame = lz4.frame.LZ4FrameCompressor()
        body = b"".join([frame.begin(), *(frame.compress(chunk) for _ in range(1024)), frame.flush()])
        return forge(body, 1, codec=LZ4)
    stream = zstandard.ZstdCompressor(level=1).compressobj()
    return forge(b"".join([*(stream.compress(chunk) for _ in range(1024)), stream.flush()]), 1, codec=ZSTD)


PEAK_MEMORY_SCRIPT = """
import resource, sys, tempfile
from oncelog.bench.references import Headers, ReferenceRecord, kafka_python_batch
from oncelog.config import LogConfig
from oncelog.errors import CorruptRecordError
from oncelog.log import Log
from oncelog.tools.partition_dirs import read_partition_meta
from oncelog.storage.fs import OsFileSystem
bomb = open(sys.argv[1], "rb").read()
with tempfile.TemporaryDirectory() as directory:
    log = Log.open(directory + "/bombed-0", LogConfig(max_batch_bytes=len(bomb), segment_index_bytes=4096))
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        log.append(bomb)
        print("accepted")
    except CorruptRecordError as exc:
        print("refused:", exc)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib)
    log.close()
"""


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_a_gigabyte_bomb_is_refused_with_the_default_config_in_bounded_memory(
    tmp_path: Path, codec: str
) -> None:
    """A hostile client: a small batch that inflates to 1 GiB. The default bound (64 MiB) refuses
    it, and the process's peak memory grows by a small multiple of the bound, not by a gigabyte."""
    bomb = gigabyte_bomb(codec)
    assert len(bomb) < 5 * 1024 * 1024
    (tmp_path / "bomb").write_bytes(bomb)
    done = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY_SCRIPT, str(tmp_path / "bomb")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    verdict, grown_kib = done.stdout.splitlines()
    assert verdict == f"refused: {codec} body inflates past {64 * 1024 * 1024} bytes"
    assert int(grown_kib) < 3 * 64 * 1024, f"peak memory grew by {int(grown_kib) // 1024} MiB"


def test_max_decompressed_batch_bytes_may_not_exceed_what_readers_inflate() -> None:
    with pytest.raises(ValueError, match="max_decompressed_batch_bytes"):
        LogConfig(max_decompressed_batch_bytes=256 * 1024 * 1024 + 1)
    with pytest.raises(ValueError, match="max_decompressed_batch_bytes"):
        LogConfig(max_decompressed_batch_bytes=0)


# -- replication ---------------------------------------------------------------------------------
def test_replication_accepts_a_compacted_batch_with_gaps_and_reads_its_offsets(log_dir: Path) -> None:
    # Kafka's cleaner keeps lastOffsetDelta and a subset of the records, deltas and all.
    compacted = forge(record(0) + record(3) + record(7), 3, last_offset_delta=9, base_offset=10)
    empty = forge(b"", 0, last_offset_delta=4, base_offset=20)  # every record compacted away
    with Log.open(log_dir, CONFIG) as replica:
        assert replica.append(compacted, origin="replication").last_offset == 19
        assert replica.append(empty, origin="replication").last_offset == 24
        assert [r.offset for r in replica.read(10).records()] == [10, 13, 17]
        assert replica.log_end_offset == 25


def _at(batch: bytes, base_offset: int) -> bytes:
    """The batch at another base offset (not covered by the CRC)."""
    return struct.pack(">q", base_offset) + batch[8:]


# Each at offset 10, past the replica's end: what refuses it is the body, not the offset.
REPLICATION_POISON: list[tuple[str, bytes, type[Exception], str]] = [
    ("records-count-2^31-1-over-2-records", _records_count_int32_max_over_2_records(), CorruptRecordError,
     "recordsCount 2147483647 cannot fit"),
    ("fewer-records-than-counted", forge(TWO_RECORDS, 3, last_offset_delta=9), CorruptRecordError,
     "end inside record 2 of recordsCount 3"),
    ("more-records-than-counted", forge(TWO_RECORDS + record(2), 2, last_offset_delta=9), CorruptRecordError,
     "bytes after the last of recordsCount 2"),
    ("garbage-zstd-body", _garbage_zstd_body(), CorruptRecordError, "zstd body does not decompress"),
    ("zero-filled-body", _zero_filled_body(), CorruptRecordError, "record 0"),
    ("offset-deltas-decreasing", forge(record(3) + record(1), 2, last_offset_delta=9), InvalidRecordError,
     "record 1 has offset delta 1: deltas must increase"),
    ("offset-delta-past-last-offset-delta", forge(record(0) + record(12), 2, last_offset_delta=9),
     InvalidRecordError, "within lastOffsetDelta 9"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "error", "match"), [pytest.param(b, e, m, id=name) for name, b, e, m in REPLICATION_POISON]
)
def test_replication_refuses_a_batch_whose_framing_or_count_is_wrong(
    log_dir: Path, batch: bytes, error: type[Exception], match: str
) -> None:
    poison = _at(batch, 10)
    with Log.open(log_dir, CONFIG) as replica:
        replica.append(GOOD, origin="replication")
        before = dir_digest(log_dir)
        with pytest.raises(error, match=match):
            replica.append(poison, origin="replication")
        with pytest.raises(error, match=match):
            replica.append_batches([_at(GOOD, 2), poison], origin="replication")
        assert dir_digest(log_dir) == before
        assert replica.log_end_offset == 2
        # What refused it was the body: the same offsets with a good body go in.
        assert (
            replica.append_batches([_at(GOOD, 2), _at(GOOD, 10)], origin="replication")[1].first_offset == 10
        )


@pytest.mark.parametrize(
    ("offset", "match"),
    [
        pytest.param(0, "below the log end", id="below-the-log-end"),
        pytest.param(2**63 - 2, "past the largest", id="past-the-largest-offset"),
    ],
)
def test_a_refused_replicated_batch_leaves_a_client_only_log_client_only(
    log: Log, log_dir: Path, offset: int, match: str
) -> None:
    # A client-only log checks that offsets are contiguous and leader epochs unset;
    # a replicated batch turns that off durably, but only once one is written.
    before = dir_digest(log_dir)
    with pytest.raises(InvalidRecordError, match=match):
        log.append(_at(GOOD, offset), origin="replication")
    assert dir_digest(log_dir) == before
    log.close()
    assert read_partition_meta(OsFileSystem(), str(log_dir)).client_only


# -- outside the model: real clients, threads ----------------------------------------------------
@pytest.mark.parametrize("codec", [0, GZIP, SNAPPY, LZ4, ZSTD])
def test_kafka_python_batches_of_every_codec_pass_the_record_check(log_dir: Path, codec: int) -> None:
    """A real client's bytes (kafka-python's builder): the checks must not refuse what clients send."""
    records: list[ReferenceRecord] = []
    for delta in range(300):
        headers: Headers = [("trace", b"t" * (delta % 5)), ("none", None)] if delta % 4 == 0 else []
        key = None if delta % 3 == 0 else b"key-%d" % delta
        records.append((key, b"v" * (delta % 200), headers))
    sent = kafka_python_batch(records, [T0 + delta * 1000 for delta in range(300)], compression=codec)
    with Log.open(log_dir, CONFIG) as log:
        assert (log.append(sent).first_offset, log.append_batches([sent])[0].first_offset) == (0, 300)
        ours = [(r.offset % 300, r.timestamp_ms, r.key, r.value, r.headers) for r in log.read(0).records()]
    theirs = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(sent)]
    assert ours == theirs * 2


def test_threads_appending_compressed_and_poison_batches_at_once_get_each_its_own_answer(
    log_dir: Path,
) -> None:
    """Each thread inflates with its own zstd decompressor: none sees another's stream."""
    good = {
        codec: encode_batch([(b"k", b"%s-%d" % (codec.encode(), i)) for i in range(50)], compression=codec)
        for codec in ("zstd", "lz4", "gzip")
    }
    poison = forge(b"\x28\xb5\x2f\xfd" + bytes(range(200)), 50, codec=ZSTD)
    errors: list[BaseException] = []
    refused: list[int] = []  # list.append is atomic: one entry per refusal

    def work(codec: str) -> None:
        try:
            for _ in range(150):
                log.append(good[codec])
                try:
                    log.append(poison)
                except CorruptRecordError:
                    refused.append(1)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    with Log.open(log_dir, CONFIG) as log:
        threads = [threading.Thread(target=work, args=(codec,)) for codec in ("zstd", "zstd", "lz4", "gzip")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(refused) == 4 * 150
        records: list[Record] = [r for b in _all_batches(log) for r in b.records()]
    assert len(records) == 4 * 150 * 50
    assert [r.offset for r in records] == list(range(len(records)))


def _all_batches(log: Log) -> Iterator[RecordBatch]:
    offset = 0
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        yield from fetched.batches
        offset = fetched.next_offset


def test_forged_good_batches_are_accepted(log_dir: Path) -> None:
    """The forging helpers themselves make batches the log takes: the refusals above are the poison."""
    with Log.open(log_dir, CONFIG) as log:
        log.append(forge(record(0, headers=((b"h", None), (b"", b"x"))) + record(1, key=None), 2))
        log.append(forge(gzip.compress(TWO_RECORDS), 2, codec=GZIP))
        log.append(forge(zstandard.ZstdCompressor().compress(TWO_RECORDS), 2, codec=ZSTD))
        log.append(forge(lz4.frame.compress(TWO_RECORDS), 2, codec=LZ4))
        assert len(list(log.read(0).records())) == 8
