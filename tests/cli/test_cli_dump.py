"""`oncelog dump` and the command line (engine/cli/).

Fixture partitions are real Kafka broker output, read in place (never copied). Every
expectation about them is computed independently from the raw file bytes.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest

from oncelog.cli import demo as cli_demo
from oncelog.cli import dump as cli_dump
from oncelog.cli import main as cli
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments import RecordBatch, encode_batch, iter_batches
from oncelog.segments.records import Record
from oncelog.segments.segment import SCAN_CHUNK_BYTES
from oncelog.storage.fs import DEFAULT_FS, FileHandle

FIXTURES = Path(
    os.environ.get("ONCELOG_FIXTURES")
    or Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "kafka"
)
COMMAND_DIR = FIXTURES / "flink-on-prem" / "_confluent-command-0"  # lz4 batches
MONITORING_DIR = FIXTURES / "flink-on-prem" / "_confluent-monitoring-0"  # lz4 + LogAppendTime
PROMOTIONS_DIR = FIXTURES / "flink-on-prem" / "promotions-0"  # multi-record batches
BIG_DIR = FIXTURES / "flink-on-prem" / "customers_keyed-0"  # ~3 MB, 27482 records
METADATA_DIR = FIXTURES / "LDI-POC" / "__cluster_metadata-0"  # KRaft, one control batch
CONSUMER_OFFSETS_DIR = FIXTURES / "LDI-POC" / "__consumer_offsets-6"

# Header layout written out here, independently of segments/format.py.
CRC_AT = 17
ATTRIBUTES_AT = 21
RECORDS_COUNT_AT = 57
LOG_APPEND_TIME_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

SEGMENT_NAME = "00000000000000000000.log"


def needs(path: Path) -> Path:
    assert path.is_dir(), f"fixture {path} is missing"
    return path


def only_log(directory: Path) -> Path:
    (log,) = sorted(directory.glob("*.log"))
    return log


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def batch_lines(lines: list[str]) -> list[dict[str, str]]:
    """The batch lines as {field: value}; every batch field value is one token."""
    out = []
    for line in lines:
        if line.startswith("baseOffset: "):
            tokens = line.split()
            assert all(name.endswith(":") for name in tokens[::2]), line
            pairs = zip(tokens[::2], tokens[1::2], strict=True)
            out.append({name[:-1]: value for name, value in pairs})
    return out


def record_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("| offset: ")]


def raw_headers(data: bytes) -> list[tuple[int, int, int, int]]:
    """(position, baseOffset, lastOffset, attributes) of each batch, by struct alone."""
    out = []
    pos = 0
    while pos < len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        (attributes, last_delta) = struct.unpack_from(">hi", data, pos + ATTRIBUTES_AT)
        out.append((pos, base_offset, base_offset + last_delta, attributes))
        pos += 12 + length
    return out


def patch(batch: bytes, *, set_attributes: int = 0, records_count: int | None = None) -> bytes:
    """Set attribute bits and/or the record count, then recompute the CRC-32C."""
    buf = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", buf, ATTRIBUTES_AT)
    struct.pack_into(">h", buf, ATTRIBUTES_AT, attributes | set_attributes)
    if records_count is not None:
        struct.pack_into(">i", buf, RECORDS_COUNT_AT, records_count)
    struct.pack_into(">I", buf, CRC_AT, crc32c.crc32c(bytes(buf[ATTRIBUTES_AT:])))
    return bytes(buf)


def write_segment(directory: Path, *batches: bytes, name: str = SEGMENT_NAME) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"".join(batches))
    return path


# -- fixtures: real Kafka segments ---------------------------------------------------


def test_dump_partition_dir_matches_independent_scan(capsys: pytest.CaptureFixture[str]) -> None:
    directory = needs(COMMAND_DIR)
    data = only_log(directory).read_bytes()
    expected = list(iter_batches(data))

    status, lines, err = run(capsys, "dump", str(directory))

    assert status == 0, err
    assert err == ""
    assert lines[0] == f"Dumping {directory / SEGMENT_NAME}"
    assert lines[1] == "Log starting offset: 0"
    printed = batch_lines(lines)
    assert len(printed) == len(expected) > 0
    assert [(p["baseOffset"], p["lastOffset"]) for p in printed] == [
        (str(b.base_offset), str(b.last_offset)) for b in expected
    ]
    assert all(p["compresscodec"] == "lz4" for p in printed)
    assert all(p["isvalid"] == "true" and p["magic"] == "2" for p in printed)
    last = expected[-1].base_offset + expected[-1].last_offset_delta
    assert lines[-1] == f"Summary: {len(expected)} batches, {len(data)} bytes, last offset {last}"


@pytest.mark.parametrize(
    "directory", [PROMOTIONS_DIR, CONSUMER_OFFSETS_DIR, METADATA_DIR, BIG_DIR], ids=lambda p: p.name
)
def test_batch_fields_match_raw_bytes(capsys: pytest.CaptureFixture[str], directory: Path) -> None:
    data = only_log(needs(directory)).read_bytes()
    raw = raw_headers(data)

    status, lines, err = run(capsys, "dump", str(directory))

    assert status == 0, err
    printed = batch_lines(lines)
    assert len(printed) == len(raw)
    ends = [pos for pos, *_ in raw[1:]] + [len(data)]
    for fields, (pos, base, last, attributes), end in zip(printed, raw, ends, strict=True):
        assert fields["position"] == str(pos)
        assert fields["baseOffset"] == str(base)
        assert fields["lastOffset"] == str(last)
        assert fields["isControl"] == ("true" if attributes & CONTROL_BIT else "false")
        (crc,) = struct.unpack_from(">I", data, pos + CRC_AT)
        assert fields["crc"] == str(crc)  # unsigned, like Kafka
        assert fields["size"] == str(end - pos)


def test_records_one_line_per_record(capsys: pytest.CaptureFixture[str]) -> None:
    data = only_log(needs(PROMOTIONS_DIR)).read_bytes()
    expected = [r for batch in iter_batches(data) for r in batch.records()]
    assert len(expected) > len(list(iter_batches(data)))  # some batches hold several

    status, lines, err = run(capsys, "dump", "--records", str(PROMOTIONS_DIR))

    assert status == 0, err
    records = record_lines(lines)
    assert len(records) == len(expected)
    for line, record in zip(records, expected, strict=True):
        assert line.startswith(f"| offset: {record.offset} CreateTime: {record.timestamp_ms} ")
        value_size = -1 if record.value is None else len(record.value)
        assert f" valueSize: {value_size} " in line
    assert f"batches, {len(expected)} records, {len(data)} bytes" in lines[-1]


def test_records_follow_their_batch(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "dump", "--records", str(needs(PROMOTIONS_DIR)))

    assert status == 0
    current: tuple[int, int] | None = None
    for line in lines:
        if line.startswith("baseOffset: "):
            fields = batch_lines([line])[0]
            current = (int(fields["baseOffset"]), int(fields["lastOffset"]))
        elif line.startswith("| offset: "):
            assert current is not None
            offset = int(line.split()[2])
            assert current[0] <= offset <= current[1]


def test_log_append_time_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    data = only_log(needs(MONITORING_DIR)).read_bytes()
    append_time = [b for b in iter_batches(data) if b.attributes & LOG_APPEND_TIME_BIT]
    assert append_time

    status, lines, _ = run(capsys, "dump", str(MONITORING_DIR))

    assert status == 0
    printed = batch_lines(lines)
    with_append_time = [p for p in printed if "LogAppendTime" in p]
    assert len(with_append_time) == len(append_time)
    stamps = [str(b.max_timestamp) for b in append_time]
    assert [p["LogAppendTime"] for p in with_append_time] == stamps
    assert not any("CreateTime" in p for p in with_append_time)


def test_log_append_time_built_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    create = encode_batch([(b"k", b"v0")], timestamp_ms=1_000)
    append = patch(
        encode_batch([(b"k", b"v1"), (b"k", b"v2")], base_offset=1, timestamp_ms=2_000),
        set_attributes=LOG_APPEND_TIME_BIT,
    )
    assert RecordBatch(append).is_valid()
    path = write_segment(tmp_path, create, append)

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    first, second = batch_lines(lines)
    assert first["CreateTime"] == "1000" and "LogAppendTime" not in first
    assert second["LogAppendTime"] == "2000" and "CreateTime" not in second
    assert second["isvalid"] == "true"
    records = record_lines(lines)
    assert records[0].startswith("| offset: 0 CreateTime: 1000 ")
    assert records[1].startswith("| offset: 1 LogAppendTime: 2000 ")
    assert records[2].startswith("| offset: 2 LogAppendTime: 2000 ")


def test_kraft_control_batch(capsys: pytest.CaptureFixture[str]) -> None:
    data = only_log(needs(METADATA_DIR)).read_bytes()
    control = [b for b in iter_batches(data) if b.attributes & CONTROL_BIT]
    assert len(control) == 1

    status, lines, _ = run(capsys, "dump", "--records", str(METADATA_DIR))

    assert status == 0
    printed = [p for p in batch_lines(lines) if p["isControl"] == "true"]
    assert [p["baseOffset"] for p in printed] == [str(control[0].base_offset)]
    (control_type,) = struct.unpack_from(">h", next(control[0].records()).key or b"", 2)
    marked = [line for line in record_lines(lines) if "controlType:" in line]
    assert len(marked) == 1
    assert f" controlType: {control_type} " in marked[0]
    assert "endTxnMarker" not in marked[0]


@pytest.mark.parametrize(("kind", "name"), [(0, "ABORT"), (1, "COMMIT")])
def test_transaction_marker(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: int,
    name: str,
) -> None:
    data = encode_batch(
        [(b"a", b"x"), (b"b", b"y")],
        producer_id=7,
        producer_epoch=3,
        base_sequence=0,
        is_transactional=True,
    )
    marker = encode_batch(
        [(struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 42))],
        base_offset=2,
        producer_id=7,
        producer_epoch=3,
        is_transactional=True,
    )
    path = write_segment(tmp_path, data, patch(marker, set_attributes=CONTROL_BIT))

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    first, second = batch_lines(lines)
    assert first["isTransactional"] == "true" and first["isControl"] == "false"
    assert second["isTransactional"] == "true" and second["isControl"] == "true"
    records = record_lines(lines)
    assert len(records) == 3
    assert records[2].startswith("| offset: 2 CreateTime: ")
    assert records[2].endswith(f" endTxnMarker: {name} coordinatorEpoch: 42")
    assert "endTxnMarker" not in records[0]


def test_undecodable_control_record_is_printed_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A COMMIT key whose value is too short for a marker, and a key too short for a type.
    batch = encode_batch([(struct.pack(">hh", 0, 1), b"\x00"), (b"\x00", b"zz")])
    path = write_segment(tmp_path, patch(batch, set_attributes=CONTROL_BIT))

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    first, second = record_lines(lines)
    assert "endTxnMarker" not in first
    assert " controlType: 1 " in first and first.endswith("payload: \\x00")
    assert "controlType" not in second and second.endswith("key: \\x00 payload: zz")


# -- record formatting ---------------------------------------------------------------


def test_record_line_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [
        Record(10, 5_000, b"key-1", b"hello", (("a", b"1"), ("b", None))),
        Record(11, 5_001, None, None, ()),
        Record(12, 5_002, b"\xff\xfe", "line1\nline2\té".encode(), ()),
    ]
    batch = encode_batch(records, base_offset=10, producer_id=9, base_sequence=100)
    path = write_segment(tmp_path, batch)

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    (fields,) = batch_lines(lines)
    assert fields["baseSequence"] == "100" and fields["lastSequence"] == "102"
    assert record_lines(lines) == [
        "| offset: 10 CreateTime: 5000 keySize: 5 valueSize: 5 sequence: 100 headerKeys: [a, b]"
        " key: key-1 payload: hello",
        "| offset: 11 CreateTime: 5001 keySize: -1 valueSize: -1 sequence: 101 headerKeys: []"
        " key: null payload: null",
        "| offset: 12 CreateTime: 5002 keySize: 2 valueSize: 14 sequence: 102 headerKeys: []"
        " key: \\xff\\xfe payload: line1\\nline2\\té",
    ]


def test_no_sequence_and_long_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_segment(tmp_path, encode_batch([(None, b"x" * 10_000)], timestamp_ms=1))

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    (line,) = record_lines(lines)
    assert " sequence: -1 " in line and " valueSize: 10000 " in line
    payload = line.split(" payload: ", 1)[1]
    assert payload.startswith("x" * 150) and payload.endswith("...")
    assert len(payload) < 300


def test_corrupt_records_are_reported_and_dump_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One record but a count of 2 (with a good CRC): the second record runs off the end.
    bad = patch(encode_batch([(b"k", b"v" * 50)]), records_count=2)
    good = encode_batch([(b"k", b"after")], base_offset=1)
    path = write_segment(tmp_path, bad, good)

    status, lines, _ = run(capsys, "dump", "--records", str(path))

    assert status == 0
    assert len(batch_lines(lines)) == 2
    corrupt = [i for i, line in enumerate(lines) if line.startswith("| corrupt records: ")]
    assert len(corrupt) == 1
    assert lines[corrupt[0] + 1].startswith("baseOffset: 1 ")
    assert record_lines(lines)[-1].endswith("payload: after")


# -- damaged and wrong input ---------------------------------------------------------


def test_bit_flip_is_reported_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = encode_batch([(b"k", b"value-0")], timestamp_ms=1)
    second = bytearray(encode_batch([(b"k", b"value-1")], base_offset=1, timestamp_ms=1))
    second[-3] ^= 0x04  # inside the value: the header stays walkable
    path = write_segment(tmp_path, first, bytes(second))

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0, err
    assert [p["isvalid"] for p in batch_lines(lines)] == ["true", "false"]

    status, lines, _ = run(capsys, "dump", "--no-validate", str(path))

    assert status == 0
    assert [("isvalid" in p) for p in batch_lines(lines)] == [False, False]


def test_not_a_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("These are my notes, not a Kafka segment.\n" * 5)

    status, lines, err = run(capsys, "dump", str(notes))

    assert status == 2
    assert batch_lines(lines) == []
    assert lines[0] == f"Dumping {notes}"
    assert len(err.strip().splitlines()) == 1
    assert str(notes) in err and "position 0" in err
    assert "not a Kafka v2 segment" in err


def test_tiny_file_is_not_a_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tmp_path / "hostname"
    tiny.write_text("box\n")

    status, _, err = run(capsys, "dump", str(tiny))

    assert status == 2
    assert str(tiny) in err and "position 0" in err and "not a Kafka v2 segment" in err


def test_truncated_mid_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = encode_batch([(b"k", b"one")], timestamp_ms=1)
    second = encode_batch([(b"k", b"two"), (b"k", b"three")], base_offset=1, timestamp_ms=1)
    path = write_segment(tmp_path, first, second[:-10])

    status, lines, err = run(capsys, "dump", "--records", str(path))

    assert status == 2
    assert [p["baseOffset"] for p in batch_lines(lines)] == ["0"]
    assert record_lines(lines)[0].endswith("payload: one")
    assert lines[-1] == f"Summary: 1 batches, 1 records, {len(first)} bytes, last offset 0"
    assert len(err.strip().splitlines()) == 1
    assert str(path) in err and f"position {len(first)}" in err
    assert "middle of a batch" in err


def test_impossible_header_after_good_batch(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = encode_batch([(b"k", b"one")], timestamp_ms=1)
    path = write_segment(tmp_path, first, b"\x00" * 16 + b"\x07" + b"\x00" * 83)  # magic 7

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 2
    assert len(batch_lines(lines)) == 1
    assert str(path) in err and f"position {len(first)}" in err and "corrupt" in err


def test_zeros_to_the_end_are_unwritten_space_not_corruption(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A live log's active segment is pre-allocated: its data is followed by zeros.
    first = encode_batch([(b"k", b"one")], timestamp_ms=1)
    path = write_segment(tmp_path, first, b"\x00" * 4096)

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0 and err == ""
    assert len(batch_lines(lines)) == 1
    assert "4096 bytes of unwritten space follow the last batch" in lines


def test_zeros_followed_by_data_are_corruption(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = encode_batch([(b"k", b"one")], timestamp_ms=1)
    path = write_segment(tmp_path, first, b"\x00" * 4096, first)

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 2
    assert len(batch_lines(lines)) == 1
    assert f"position {len(first)}" in err and "unwritten space" in err


def test_a_live_logs_directory_dumps_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Log.open(tmp_path / "live-0", LogConfig(), clock=lambda: 1) as log:
        for n in range(3):
            log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=1))
        assert (tmp_path / "live-0" / "00000000000000000000.log").stat().st_size > log.active_segment.size

        status, lines, err = run(capsys, "dump", str(tmp_path / "live-0"))

    assert status == 0 and err == ""
    assert len(batch_lines(lines)) == 3


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / SEGMENT_NAME

    status, lines, err = run(capsys, "dump", str(missing))

    assert status == 2
    assert lines == []
    assert str(missing) in err


def test_directory_without_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "00000000000000000000.index").write_bytes(b"")

    status, lines, err = run(capsys, "dump", str(tmp_path))

    assert status == 2
    assert lines == []
    assert str(tmp_path) in err and ".log" in err


def test_empty_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_segment(tmp_path, name="00000000000000000042.log")

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0, err
    assert lines == [
        f"Dumping {path}",
        "Log starting offset: 42",
        "Summary: 0 batches, 0 bytes, last offset none",
    ]


def test_directory_dumps_segments_in_offset_order(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_segment(tmp_path, encode_batch([(b"k", b"v")], base_offset=5), name=f"{5:020d}.log")
    write_segment(tmp_path, encode_batch([(b"k", b"v")], base_offset=0), name=f"{0:020d}.log")
    bad = write_segment(tmp_path, b"\xff" * 30, name=f"{900:020d}.log")
    write_segment(tmp_path, encode_batch([(b"k", b"v")], base_offset=10), name=f"{10:020d}.log")
    (tmp_path / f"{0:020d}.index").write_bytes(b"\x00" * 8)

    status, lines, err = run(capsys, "dump", str(tmp_path))

    assert [line for line in lines if line.startswith("Log starting offset")] == [
        "Log starting offset: 0",
        "Log starting offset: 5",
        "Log starting offset: 10",
        "Log starting offset: 900",
    ]
    assert [p["baseOffset"] for p in batch_lines(lines)] == ["0", "5", "10"]
    assert sum(line.startswith("Summary: ") for line in lines) == 4
    # The bad segment is reported, but it does not hide the others.
    assert status == 2
    assert str(bad) in err and "position 0" in err


class RecordingHandle:
    def __init__(self, handle: FileHandle, reads: list[int]):
        self._handle = handle
        self._reads = reads
        self.path = handle.path

    def size(self) -> int:
        return self._handle.size()

    def pread(self, size: int, offset: int) -> bytes:
        self._reads.append(size)
        return self._handle.pread(size, offset)

    def close(self) -> None:
        self._handle.close()


class RecordingFs:
    """Passes opens and reads to the real filesystem and records them; nothing else."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, bool, bool]] = []
        self.reads: list[int] = []

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> RecordingHandle:
        self.opened.append((path, create, writable))
        return RecordingHandle(DEFAULT_FS.open(path, create=create, writable=writable), self.reads)

    def listdir(self, path: str) -> list[str]:
        return DEFAULT_FS.listdir(path)

    def exists(self, path: str) -> bool:
        return DEFAULT_FS.exists(path)


def test_dump_is_read_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = [encode_batch([(b"k", b"v")]), encode_batch([(b"k", b"w")], base_offset=1)]
    path = write_segment(tmp_path, *batches)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    fs = RecordingFs()
    monkeypatch.setattr(cli_dump, "DEFAULT_FS", fs)

    status, lines, _ = run(capsys, "dump", "--records", str(tmp_path))

    assert status == 0
    assert len(batch_lines(lines)) == 2
    assert fs.opened == [(str(path), False, False)]
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert after == before


def test_streams_in_bounded_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment larger than the scan chunk is read piecewise, never whole."""
    value = bytes(range(256)) * 400  # ~100 KiB, incompressible enough not to matter
    count = SCAN_CHUNK_BYTES // len(value) + 10
    batches = [encode_batch([(b"k", value)], base_offset=i) for i in range(count)]
    path = write_segment(tmp_path, *batches)
    size = path.stat().st_size
    assert size > SCAN_CHUNK_BYTES
    fs = RecordingFs()
    monkeypatch.setattr(cli_dump, "DEFAULT_FS", fs)

    status, lines, _ = run(capsys, "dump", str(path))

    assert status == 0
    assert [p["baseOffset"] for p in batch_lines(lines)] == [str(i) for i in range(count)]
    assert lines[-1] == f"Summary: {count} batches, {size} bytes, last offset {count - 1}"
    assert len(fs.reads) >= 2
    assert max(fs.reads) <= SCAN_CHUNK_BYTES < size


# -- help, exit codes, pipes, demo ---------------------------------------------------


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "--help")

    text = "\n".join(lines)
    assert status == 0
    assert "dump" in text and "demo" in text
    assert "example" in text and "oncelog dump " in text


def test_dump_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "dump", "--help")

    text = "\n".join(lines)
    assert status == 0
    assert text.startswith("usage: oncelog dump")
    assert "--records" in text and "--no-validate" in text
    assert "example" in text and "oncelog dump " in text


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["dump"]) == 2
    assert cli.main(["frobnicate"]) == 2
    assert "usage: oncelog" in capsys.readouterr().err


def test_console_script_help() -> None:
    script = shutil.which("oncelog", path=os.path.dirname(sys.executable))
    assert script is not None, "the oncelog console script is not installed next to python"

    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert "dump" in result.stdout and "example" in result.stdout


def test_console_script_into_closed_pipe_exits_quietly() -> None:
    """`oncelog dump --records BIG | head -1`: the reader leaves early; no traceback, status 0."""
    needs(BIG_DIR)
    script = shutil.which("oncelog", path=os.path.dirname(sys.executable))
    assert script is not None

    proc = subprocess.Popen(
        [script, "dump", "--records", str(BIG_DIR)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    status = proc.wait(timeout=120)

    assert first.startswith(b"Dumping ")
    assert stderr == b""
    assert status == 0


def test_broken_pipe_returns_zero(tmp_path: Path) -> None:
    class ClosingPipe(io.StringIO):
        def write(self, text: str) -> int:
            if self.tell() > 200:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(text)

    batches = [encode_batch([(b"k", b"v")], base_offset=i) for i in range(50)]
    path = write_segment(tmp_path, *batches)
    out = ClosingPipe()
    err = io.StringIO()

    status = cli.main(["dump", str(path)], out=out, err=err)

    assert status == 0
    assert out.getvalue().startswith(f"Dumping {path}")
    assert err.getvalue() == ""


def test_demo_runs_run_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []

    def run_demo(data_dir: str) -> int:
        calls.append(data_dir)
        return 7

    monkeypatch.setattr(cli_demo, "run_demo", run_demo)
    monkeypatch.setattr(cli_demo, "unusable_data_dir", lambda data_dir: None)

    assert cli.main(["demo", "--data-dir", str(tmp_path / "d")]) == 7
    assert cli.main(["demo"]) == 7
    assert calls == [str(tmp_path / "d"), os.path.join(".", "data", "demo")]


# -- transactions: markers and the transaction index ---------------------------------

# Kafka's AbortedTxn entry, written out here independently of segments/txn_index.py:
# version i16, producerId i64, firstOffset i64, lastOffset i64, lastStableOffset i64.
TXN_ENTRY = struct.Struct(">hqqqq")
TXN_INDEX_NAME = "00000000000000000000.txnindex"
# The log's clock (which stamps the markers) and the batches' timestamp: equal, so
# that no segment rolls on segment_ms between a batch and its marker.
T0 = 1_700_000_000_000


def txn_entry(pid: int, first: int, last: int, lso: int, version: int = 0) -> bytes:
    return TXN_ENTRY.pack(version, pid, first, last, lso)


def txn_line(pid: int, first: int, last: int, lso: int) -> str:
    """Kafka's DumpLogSegments line for one aborted transaction."""
    return f"version: 0 producerId: {pid} firstOffset: {first} lastOffset: {last} lastStableOffset: {lso}"


def txn_batch(pid: int, seq: int, *keys: bytes) -> bytes:
    return encode_batch(
        [(key, b"v") for key in keys],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=True,
        timestamp_ms=T0,
    )


def write_transactional_log(directory: Path) -> None:
    """Offsets: 0 plain; 1 pid 8 opens; 2-4 pid 7 aborted (ABORT at 5); roll at 6;
    6-7 pid 7 committed (COMMIT at 8); COMMIT for pid 8 at 9."""
    with Log.open(directory, clock=lambda: T0) as log:
        log.append(encode_batch([(b"plain", b"v")], timestamp_ms=T0))
        log.append(txn_batch(8, 0, b"other"))
        log.append(txn_batch(7, 0, b"a0", b"a1", b"a2"))
        assert log.write_txn_marker(7, 0, commit=False, coordinator_epoch=5).first_offset == 5
        log.roll()
        log.append(txn_batch(7, 3, b"c0", b"c1"))
        assert log.write_txn_marker(7, 0, commit=True, coordinator_epoch=5).first_offset == 8
        assert log.write_txn_marker(8, 0, commit=True, coordinator_epoch=2).first_offset == 9


def test_dump_log_with_an_aborted_and_a_committed_transaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    write_transactional_log(directory)
    index_path = directory / TXN_INDEX_NAME
    # Kafka's rule, by hand: the entry's LSO is the oldest other open transaction (pid 8's, at 1).
    assert index_path.read_bytes() == txn_entry(7, 2, 5, 1)
    assert not (directory / "00000000000000000006.txnindex").exists()

    status, lines, err = run(capsys, "dump", "--records", str(directory))

    assert status == 0, err
    assert err == ""
    fields = {int(p["baseOffset"]): p for p in batch_lines(lines)}
    assert sorted(fields) == [0, 1, 2, 5, 6, 8, 9]
    assert [fields[o]["isTransactional"] for o in sorted(fields)] == ["false"] + ["true"] * 6
    assert [o for o in sorted(fields) if fields[o]["isControl"] == "true"] == [5, 8, 9]
    assert fields[5]["producerId"] == "7" and fields[9]["producerId"] == "8"
    markers = {int(line.split()[2]): line for line in record_lines(lines) if "endTxnMarker" in line}
    assert sorted(markers) == [5, 8, 9]
    assert markers[5].endswith(" endTxnMarker: ABORT coordinatorEpoch: 5")
    assert markers[8].endswith(" endTxnMarker: COMMIT coordinatorEpoch: 5")
    assert markers[9].endswith(" endTxnMarker: COMMIT coordinatorEpoch: 2")
    # The index follows its own segment's batches and summary, before the next segment.
    heading = lines.index(f"Dumping {index_path}")
    assert lines[heading - 1].startswith("Summary: 4 batches, 6 records, ")
    assert lines[heading + 1 : heading + 4] == [
        txn_line(7, 2, 5, 1),
        "Summary: 1 aborted transactions, 34 bytes",
        f"Dumping {directory / '00000000000000000006.log'}",
    ]
    assert sum(line.startswith("Dumping ") for line in lines) == 3


def test_dump_txn_index_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    path.write_bytes(txn_entry(1, 100, 129, 108) + txn_entry(2, 90, 140, 140))

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0, err
    assert lines == [
        f"Dumping {path}",
        "version: 0 producerId: 1 firstOffset: 100 lastOffset: 129 lastStableOffset: 108",
        "version: 0 producerId: 2 firstOffset: 90 lastOffset: 140 lastStableOffset: 140",
        "Summary: 2 aborted transactions, 68 bytes",
    ]


def test_dump_empty_txn_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / TXN_INDEX_NAME
    path.write_bytes(b"")

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0, err
    assert lines == [f"Dumping {path}", "Summary: 0 aborted transactions, 0 bytes"]


@pytest.mark.parametrize(
    ("name", "data", "position"),
    [
        ("bad version", txn_entry(1, 0, 5, 6) + txn_entry(2, 3, 9, 10, version=1), 34),
        ("out of order", txn_entry(1, 0, 5, 6) + txn_entry(2, 3, 5, 10), 34),
        ("first after last", txn_entry(1, 0, 5, 6) + txn_entry(2, 9, 8, 10), 34),
        ("garbage", txn_entry(1, 0, 5, 6) + b"\xa7" * 40, 34),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_corrupt_txn_index_exits_2_naming_file_and_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, position: int
) -> None:
    path = tmp_path / TXN_INDEX_NAME
    path.write_bytes(data)

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 2, name
    # What was readable comes first.
    assert lines == [f"Dumping {path}", txn_line(1, 0, 5, 6), "Summary: 1 aborted transactions, 34 bytes"]
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("oncelog dump: corrupt transaction index: ")
    assert f"{path} at position {position}: " in err


def test_txn_index_entry_below_its_segment_base_is_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    path.write_bytes(txn_entry(1, 10, 50, 51))

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 2
    assert lines == [f"Dumping {path}", "Summary: 0 aborted transactions, 0 bytes"]
    assert f"{path} at position 0: " in err and "base offset 100" in err


def test_corrupt_txn_index_in_a_directory_does_not_hide_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_segment(tmp_path, encode_batch([(b"k", b"v")]))
    write_segment(tmp_path, encode_batch([(b"k", b"v")], base_offset=7), name=f"{7:020d}.log")
    index_path = tmp_path / TXN_INDEX_NAME
    index_path.write_bytes(txn_entry(1, 0, 5, 6, version=3))

    status, lines, err = run(capsys, "dump", str(tmp_path))

    assert status == 2
    assert [p["baseOffset"] for p in batch_lines(lines)] == ["0", "7"]
    assert lines.index(f"Dumping {index_path}") < lines.index(f"Dumping {tmp_path / f'{7:020d}.log'}")
    assert f"{index_path} at position 0: " in err and "version 3" in err


@pytest.mark.parametrize("partial", [1, 20, 33])
def test_partial_trailing_txn_index_entry_is_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], partial: int
) -> None:
    """A crash mid-append leaves part of an entry: end of file, not corruption."""
    path = tmp_path / TXN_INDEX_NAME
    torn = txn_entry(3, 11, 20, 21)[:partial]
    path.write_bytes(txn_entry(1, 0, 5, 6) + txn_entry(2, 3, 9, 10) + torn)

    status, lines, err = run(capsys, "dump", str(path))

    assert status == 0, err
    assert err == ""
    assert lines[1:3] == [txn_line(1, 0, 5, 6), txn_line(2, 3, 9, 10)]
    assert lines[3] == (
        f"Summary: 2 aborted transactions, 68 bytes (a partial entry of {partial} bytes"
        " at the end is ignored, as a crash mid-append leaves)"
    )
    assert len(lines) == 4


def test_txn_index_of_only_a_partial_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / TXN_INDEX_NAME
    path.write_bytes(txn_entry(1, 0, 5, 6)[:10])

    status, lines, _ = run(capsys, "dump", str(path))

    assert status == 0
    assert lines[1].startswith("Summary: 0 aborted transactions, 0 bytes (a partial entry of 10 bytes")


def test_dump_of_txn_index_is_read_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_transactional_log(tmp_path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir() if p.is_file()}
    fs = RecordingFs()
    monkeypatch.setattr(cli_dump, "DEFAULT_FS", fs)

    status, lines, err = run(capsys, "dump", str(tmp_path))

    assert status == 0, err
    assert txn_line(7, 2, 5, 1) in lines
    opened = {path for path, *_ in fs.opened}
    assert str(tmp_path / TXN_INDEX_NAME) in opened
    assert all(not create and not writable for _, create, writable in fs.opened)
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir() if p.is_file()}
    assert after == before


def test_dump_help_mentions_txn_index(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "dump", "--help")

    text = "\n".join(lines)
    assert status == 0
    assert ".txnindex" in text and "lastStableOffset" in text and "endTxnMarker" in text


# -- snapshots, --producers, --indexes ---------------------------------------------------

SNAPSHOT_FIXTURE = PROMOTIONS_DIR / "00000000000000000029.snapshot"


def producer_lines(lines: list[str]) -> dict[int, dict[str, str]]:
    out = {}
    for line in lines:
        if line.startswith("producerId: "):
            tokens = line.split()
            fields = dict(zip((t[:-1] for t in tokens[::2]), tokens[1::2], strict=True))
            out[int(fields["producerId"])] = fields
    return out


def test_dump_kafka_fixture_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    needs(PROMOTIONS_DIR)
    status, lines, err = run(capsys, "dump", str(SNAPSHOT_FIXTURE))
    assert status == 0, err
    producers = producer_lines(lines)
    assert sorted(producers) == [45, 46]
    assert producers[45]["lastSequence"] == "2" and producers[45]["lastOffset"] == "26"
    assert producers[46]["lastSequence"] == "25" and producers[46]["lastOffset"] == "28"
    assert producers[45]["producerEpoch"] == "0" and producers[45]["coordinatorEpoch"] == "-1"
    assert producers[45]["currentTxnFirstOffset"] == "-1"
    assert not any(line.startswith("    batch: ") for line in lines)  # Kafka keeps one batch
    # --snapshot FILE prints the same.
    status2, lines2, _ = run(capsys, "dump", "--snapshot", str(SNAPSHOT_FIXTURE))
    assert status2 == 0 and lines2 == lines


def write_idempotent_log(directory: Path, config: LogConfig | None = None, batches: int = 3) -> None:
    with Log.open(directory, config, clock=lambda: T0) as log:
        for seq in range(batches):
            batch = encode_batch(
                [(b"k%d" % seq, b"v" * 100), (b"x", b"y")],
                producer_id=77,
                producer_epoch=3,
                base_sequence=2 * seq,
                timestamp_ms=T0 + seq,
            )
            log.append(batch)


def test_dump_oncelog_snapshot_written_by_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "p-0"
    write_idempotent_log(directory)
    snapshot = directory / "00000000000000000006.snapshot"
    assert snapshot.exists()
    status, lines, err = run(capsys, "dump", str(snapshot))
    assert status == 0, err
    producers = producer_lines(lines)
    assert list(producers) == [77]
    fields = producers[77]
    assert (fields["producerEpoch"], fields["firstSequence"], fields["lastSequence"]) == ("3", "4", "5")
    assert (fields["lastOffset"], fields["offsetDelta"]) == ("5", "1")
    windows = [line for line in lines if line.startswith("    batch: ")]
    assert [line.split()[7] for line in windows] == ["1", "3", "5"]  # lastOffset of each kept batch


def test_corrupt_snapshot_exits_2_naming_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    needs(PROMOTIONS_DIR)
    bad = tmp_path / SNAPSHOT_FIXTURE.name
    data = bytearray(SNAPSHOT_FIXTURE.read_bytes())
    data[-3] ^= 0x10
    bad.write_bytes(bytes(data))
    status, _, err = run(capsys, "dump", str(bad))
    assert status == 2
    assert str(bad) in err and "CRC" in err


def test_producers_on_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    needs(PROMOTIONS_DIR)
    status, lines, err = run(capsys, "dump", "--producers", str(PROMOTIONS_DIR))
    assert status == 0, err
    heading = lines.index(f"Dumping {SNAPSHOT_FIXTURE}")
    assert lines[heading - 1].startswith("Summary: 19 batches")
    assert sorted(producer_lines(lines[heading:])) == [45, 46]
    # A live oncelog directory: no lock taken, no Log opened, newest snapshot shown.
    directory = tmp_path / "p-0"
    write_idempotent_log(directory)
    status, lines, err = run(capsys, "dump", "--producers", str(directory))
    assert status == 0, err
    assert list(producer_lines(lines)) == [77]


def test_indexes_on_a_directory_with_several_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "p-0"
    config = LogConfig(segment_bytes=1024, index_interval_bytes=1)
    write_idempotent_log(directory, config, batches=30)
    status, lines, err = run(capsys, "dump", "--indexes", str(directory))
    assert status == 0, err
    with Log.open(directory, config) as log:
        segments = log.segments
        assert len(segments) >= 3
        for segment in segments[:-1]:
            base = segment.base_offset
            heading = lines.index(f"Dumping {directory / f'{base:020d}.index'}")
            entries = []
            for line in lines[heading + 1 :]:
                if not line.startswith("offset: "):
                    break
                _, offset, _, position = line.split()
                entries.append((int(offset), int(position)))
            assert entries
            for offset, position in entries[:3] + entries[-1:]:
                assert tuple(segment.offset_index.lookup(offset)) == (offset, position)
            assert f"Dumping {directory / f'{base:020d}.timeindex'}" in lines


def test_dump_help_mentions_snapshot_options(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "dump", "--help")
    text = "\n".join(lines)
    assert status == 0
    for option in ("--snapshot", "--producers", "--indexes", "producerId:", "timestamp: T offset: N"):
        assert option in text
