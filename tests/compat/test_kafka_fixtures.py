"""Real Kafka partition directories open and read identically to kafka-python (issue 2).

The fixtures are Kafka 3.x broker output (see PROVENANCE.txt next to them). Each
partition directory is copied to a temp dir, since the originals are read-only
and shared, opened with `Log.open` and read to the end. The raw `.log` bytes are
walked here by their length fields and decoded with kafka-python's
DefaultRecordBatch, an independent codec; both decodings must agree record by
record.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

from oncelog.log import Log
from oncelog.segments.batch import RecordBatch


def fixtures_root() -> Path:
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    # tests/compat/<this file> -> repo -> its parent holds shared/fixtures/kafka.
    return Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"


ROOT = fixtures_root()


def partition_dirs() -> list[Path]:
    if not ROOT.is_dir():
        return []
    return sorted({log.parent for log in ROOT.glob("*/*/*.log")})


PARTITIONS = partition_dirs()
MISSING = (
    f"no Kafka fixtures under {ROOT}: set ONCELOG_FIXTURES to the directory holding "
    "<cluster>/<topic-partition>/*.log (../shared/fixtures/kafka from the repo)"
)


def partition_params() -> list[object]:
    if not PARTITIONS:
        # An empty parametrisation would be skipped silently; make it fail instead.
        return [pytest.param(None, id="fixtures-missing")]
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in PARTITIONS]


def copy_partition(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


# -- the independent walk ------------------------------------------------------------
@dataclass
class KafkaRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass
class KafkaBatch:
    base_offset: int
    last_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    raw: bytes
    records: list[KafkaRecord] = field(default_factory=list)


@cache
def kafka_python_walk(directory: Path) -> list[KafkaBatch]:
    """Every batch of every segment, in base-offset order, decoded by kafka-python.

    Reads the shared fixture itself (never writes it); cached, as several tests
    compare against the same walk.
    """
    out: list[KafkaBatch] = []
    for segment in sorted(directory.glob("*.log"), key=lambda p: int(p.stem)):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            raw = data[pos : pos + size]
            assert len(raw) == size, f"{segment} ends inside a batch at {pos}"
            batch = DefaultRecordBatch(raw)
            assert batch.magic == 2
            assert batch.validate_crc(), f"{segment} at {pos}: kafka-python says the CRC is bad"
            decoded = KafkaBatch(
                base_offset=batch.base_offset,
                last_offset=batch.base_offset + batch.last_offset_delta,
                attributes=batch.attributes,
                producer_id=batch.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence,
                records_count=batch.records_count,
                raw=raw,
            )
            decoded.records = [
                KafkaRecord(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch
            ]
            out.append(decoded)
            pos += size
    return out


def read_everything(log: Log) -> list[RecordBatch]:
    batches: list[RecordBatch] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        assert fetched.batches, f"read({offset}) returned nothing below {log.log_end_offset}"
        assert fetched.log_end_offset == log.log_end_offset
        assert fetched.next_offset > offset
        batches.extend(fetched.batches)
        offset = fetched.next_offset
    return batches


# -- tests ---------------------------------------------------------------------------
def test_the_fixture_directory_exists_and_holds_partitions() -> None:
    assert ROOT.is_dir(), MISSING
    assert len(PARTITIONS) >= 10, f"expected the Kafka fixtures under {ROOT}, found {PARTITIONS}"


@pytest.mark.parametrize("source", partition_params())
class TestEveryFixturePartition:
    def test_every_batch_and_record_reads_like_kafka_python_decodes_it(
        self,
        source: Path | None,
        tmp_path: Path,
    ) -> None:
        assert source is not None, MISSING
        directory = copy_partition(source, tmp_path)
        expected = kafka_python_walk(source)
        assert expected, f"{source} holds no batches"
        with Log.open(directory) as log:
            assert log.log_end_offset == expected[-1].last_offset + 1
            got = read_everything(log)
            assert len(got) == len(expected)
            for ours, theirs in zip(got, expected, strict=True):
                ours.validate()
                assert bytes(ours.buffer) == theirs.raw
                assert (ours.base_offset, ours.last_offset) == (
                    theirs.base_offset,
                    theirs.last_offset,
                )
                assert ours.attributes == theirs.attributes
                assert ours.producer_id == theirs.producer_id
                assert ours.producer_epoch == theirs.producer_epoch
                assert ours.base_sequence == theirs.base_sequence
                assert ours.records_count == theirs.records_count
                records = [
                    (r.offset, r.timestamp_ms, r.key, r.value, list(r.headers))  # one record
                    for r in ours.records()
                ]
                assert records == [
                    (r.offset, r.timestamp, r.key, r.value, r.headers) for r in theirs.records
                ], f"batch at {ours.base_offset}"

    def test_fetch_records_from_every_batch_start_match_kafka_python(
        self,
        source: Path | None,
        tmp_path: Path,
    ) -> None:
        assert source is not None, MISSING
        directory = copy_partition(source, tmp_path)
        expected = kafka_python_walk(source)
        # records() yields data only: control records (transaction markers, KRaft's
        # leader changes) stay in `batches`, as a Kafka consumer never returns them.
        data_batches = [b for b in expected if not b.attributes & 0x20]
        all_records = [(r.offset, r.key, r.value) for b in data_batches for r in b.records]
        with Log.open(directory) as log:
            got: list[tuple[int, bytes | None, bytes | None]] = []
            offset = log.log_start_offset
            while offset < log.log_end_offset:
                fetched = log.read(offset, max_bytes=1)
                assert len(fetched.batches) == 1
                got.extend((r.offset, r.key, r.value) for r in fetched.records())
                offset = fetched.next_offset
            assert got == all_records

    def test_log_start_offset_is_the_first_segments_base_offset(
        self,
        source: Path | None,
        tmp_path: Path,
    ) -> None:
        assert source is not None, MISSING
        directory = copy_partition(source, tmp_path)
        first_base = min(int(p.stem) for p in directory.glob("*.log"))
        with Log.open(directory) as log:
            assert log.log_start_offset == first_base
            assert log.segments[0].base_offset == first_base

    def test_reopen_after_close_gives_the_same_log(
        self,
        source: Path | None,
        tmp_path: Path,
    ) -> None:
        assert source is not None, MISSING
        directory = copy_partition(source, tmp_path)
        with Log.open(directory) as log:
            end = log.log_end_offset
            before = [bytes(b.buffer) for b in read_everything(log)]
        with Log.open(directory) as log:
            assert log.log_end_offset == end
            assert [bytes(b.buffer) for b in read_everything(log)] == before
            # The log takes new appends after Kafka's data.
            assert log.append_records([(b"k", b"v")]).first_offset == end

    def test_the_copy_leaves_the_shared_fixture_untouched(
        self,
        source: Path | None,
        tmp_path: Path,
    ) -> None:
        assert source is not None, MISSING
        before = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
        directory = copy_partition(source, tmp_path)
        with Log.open(directory) as log:
            read_everything(log)
            log.append_records([(b"k", b"v")])
        after = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
        assert after == before


def test_a_known_partition_starts_at_its_segments_base(tmp_path: Path) -> None:
    source = ROOT / "apache-kafka-eda-study" / "__cluster_metadata-0"
    assert source.is_dir(), MISSING
    with Log.open(copy_partition(source, tmp_path)) as log:
        assert log.log_start_offset == 14667
        assert log.read(14667).batches[0].base_offset == 14667


def test_the_fixtures_cover_every_real_data_quirk(tmp_path: Path) -> None:
    """Across all fixtures, oncelog loads each kind of batch the brief names."""
    assert PARTITIONS, MISSING
    seen: dict[str, list[str]] = {
        "lz4": [],
        "control": [],
        "log-append-time": [],
        "pid -1 with baseSequence 0": [],
        "idempotent (pid >= 0)": [],
        "multi-record": [],
    }
    for n, source in enumerate(PARTITIONS):
        name = str(source.relative_to(ROOT))
        with Log.open(copy_partition(source, tmp_path / str(n))) as log:
            for batch in read_everything(log):
                batch.validate()
                pid_and_sequence = (batch.producer_id, batch.base_sequence)
                kinds = {
                    "lz4": batch.compression == 3,
                    "control": batch.is_control,
                    "log-append-time": bool(batch.attributes & 0x08),
                    "pid -1 with baseSequence 0": pid_and_sequence == (-1, 0),
                    "idempotent (pid >= 0)": batch.producer_id >= 0,
                    "multi-record": batch.records_count > 1,
                }
                for kind, present in kinds.items():
                    if present and name not in seen[kind]:
                        seen[kind].append(name)
                        # Decoding must work on exactly these batches too.
                        assert len(list(batch.records())) == batch.records_count
    missing = [kind for kind, where in seen.items() if not where]
    assert not missing, f"no fixture batch of kind {missing}; seen {seen}"
