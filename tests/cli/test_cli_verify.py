"""`oncelog verify` (engine/cli_verify.py): every batch, index and snapshot checked, read-only.

Fixture partitions are real Kafka broker output. They are read in place; a test that
damages one copies it into tmp_path first. Positions and offsets expected here are
computed from the raw bytes with struct, independently of the engine's codec.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import crc32c
import lmdb
import pytest
from kafka_fixtures import kafka_fixtures_root

from oncelog.cli import main as cli
from oncelog.cli import verify as cli_verify
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments import encode_batch
from oncelog.segments.segment import SCAN_CHUNK_BYTES
from oncelog.storage.fs import DEFAULT_FS, FileHandle, MetadataStore

FIXTURES = kafka_fixtures_root()
FIXTURE_SETS = ["flink-on-prem", "LDI-POC", "apache-kafka-eda-study"]
PROMOTIONS = FIXTURES / "flink-on-prem" / "promotions-0"  # 19 multi-record batches
CHANGELOG = next(
    (FIXTURES / "flink-on-prem").glob("_confluent-controlcenter-*-changelog-0")
)  # 16 index entries
PATIENTS = FIXTURES / "LDI-POC" / "TestTopicPatient-0"  # 3 batches, pids 1, 2, 3
SEGMENT = "00000000000000000000.log"
T0 = 1_700_000_000_000
CRC_AT = 17  # the CRC covers bytes [21, end) of a batch


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = cli.main(["verify", *argv])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def raw_batches(path: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of each batch, by the length field alone."""
    data = path.read_bytes()
    out, position = [], 0
    while position + 17 <= len(data) and any(data[position : position + 17]):
        base, length = struct.unpack_from(">qi", data, position)
        (delta,) = struct.unpack_from(">i", data, position + 23)
        out.append((position, length + 12, base, base + delta))
        position += length + 12
    return out


def writable_copy(source: Path, target: Path) -> Path:
    """A copy of a (read-only) fixture directory that the test may damage."""
    shutil.copytree(source, target)
    for path in [target, *target.iterdir()]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root: (size, mtime in ns). Proves nothing was created or changed."""
    out = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        out[str(path.relative_to(root))] = (info.st_size if path.is_file() else 0, info.st_mtime_ns)
    return out


def oncelog_log(directory: Path, *, close: bool = True) -> Log:
    """Three segments of idempotent batches, index entries, an aborted transaction (a .txnindex entry)."""
    config = LogConfig(
        segment_bytes=2048,
        index_interval_bytes=300,
        segment_index_bytes=4096,  # small pre-allocated indexes: crash images copy quickly
    )
    log = Log.open(directory, config, clock=lambda: T0)
    for seq in range(30):
        batch = encode_batch(
            [(b"k", b"v" * 100)], producer_id=1, producer_epoch=0, base_sequence=seq, timestamp_ms=T0
        )
        log.append(batch)
    txn = encode_batch(
        [(b"t", b"x")],
        producer_id=2,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
        timestamp_ms=T0,
    )
    log.append(txn)
    log.write_txn_marker(2, 0, commit=False, coordinator_epoch=1)
    if close:
        log.close()
    return log


def summary(lines: list[str]) -> str:
    assert lines and lines[-1].startswith("verified "), lines
    return lines[-1]


# -- clean logs exit 0 ----------------------------------------------------------------------


def test_verify_clean_oncelog_log_exits_0_and_counts_every_segment_and_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    oncelog_log(directory)
    segments = sorted(directory.glob("*.log"))
    batches = sum(len(raw_batches(path)) for path in segments)
    assert len(segments) >= 3 and list(directory.glob("*.txnindex"))

    status, lines, err = run(capsys, "--no-progress", str(directory))

    assert (status, err) == (0, "")
    assert lines == [
        f"verified 1 partitions, {len(segments)} segments, {batches} batches, "
        f"{sum(p.stat().st_size for p in segments)} bytes: no problems"
    ]


def test_verify_a_live_log_open_in_another_process_exits_0_and_changes_nothing(tmp_path: Path) -> None:
    """The operator's case: the log is open (locked, LMDB open, pre-allocated zeros) elsewhere."""
    log = oncelog_log(tmp_path / "live-0", close=False)
    try:
        active = tmp_path / "live-0" / f"{log.active_segment.base_offset:020d}.log"
        assert active.stat().st_size > log.active_segment.size  # pre-allocated space past the data
        before = tree(tmp_path)
        script = shutil.which("oncelog", path=os.path.dirname(sys.executable))
        assert script is not None

        result = subprocess.run([script, "verify", str(tmp_path)], capture_output=True, text=True, timeout=60)

        assert tree(tmp_path) == before
    finally:
        log.close()
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("verified 1 partitions, ") and result.stdout.endswith("no problems\n")


@pytest.mark.parametrize("fixture_set", FIXTURE_SETS)
def test_verify_every_kafka_fixture_set_exits_0(fixture_set: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = FIXTURES / fixture_set
    segments = sorted(root.glob("*/*.log"))
    batches = sum(len(raw_batches(path)) for path in segments)

    status, lines, err = run(capsys, str(root))

    assert (status, err) == (0, "")
    partitions = len({path.parent for path in segments})
    assert summary(lines).startswith(
        f"verified {partitions} partitions, {len(segments)} segments, {batches} batches"
    )
    assert summary(lines).endswith("no problems")


def test_verify_skips_root_wide_entries_and_pending_deletes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oncelog_log(tmp_path / "orders-0")
    shutil.copytree(PATIENTS, tmp_path / "patients-3")
    # A LogManager's root store, holding the intent to delete orders-2 (committed before its files go).
    with lmdb.open(str(tmp_path / "meta.lmdb"), subdir=True) as env, env.begin(write=True) as txn:
        txn.put(b"delete/orders-2", b"")
        txn.put(b"topic-config/orders", b"")
    (tmp_path / "producer_ids.lmdb").mkdir()
    (tmp_path / ".lock").write_bytes(b"")
    (tmp_path / "producer_ids.lock").write_bytes(b"")
    for deleted in (tmp_path / "orders-1.0123abcd-delete", tmp_path / "orders-2"):
        deleted.mkdir()
        (deleted / SEGMENT).write_bytes(b"\xff" * 100)  # half-deleted garbage that must not be read

    status, lines, _ = run(capsys, str(tmp_path))

    assert status == 0
    assert summary(lines).startswith("verified 2 partitions, ")


# -- corruption exits 1 ---------------------------------------------------------------------


def test_verify_bit_flip_in_a_fixture_copy_names_the_batch_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(PROMOTIONS, tmp_path / "promotions-0")
    log_path = directory / SEGMENT
    batches = raw_batches(log_path)
    position, _, base_offset, _ = batches[7]
    data = bytearray(log_path.read_bytes())
    data[position + 40] ^= 0x10  # inside the CRC-covered header (maxTimestamp)
    log_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    (problem,) = [line for line in lines if line.startswith("CORRUPT")]
    assert problem.startswith(
        f"CORRUPT {log_path} position {position}: batch at offset {base_offset}: CRC mismatch"
    )
    # The bad batch does not hide the others: every batch was walked.
    assert summary(lines).startswith(f"verified 1 partitions, 1 segments, {len(batches)} batches")
    assert summary(lines).endswith("1 corrupt, 0 warnings")


def test_verify_impossible_header_mid_segment_is_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(PROMOTIONS, tmp_path / "promotions-0")
    log_path = directory / SEGMENT
    position = raw_batches(log_path)[4][0]
    data = bytearray(log_path.read_bytes())
    data[position + 16] = 7  # magic
    log_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert f"CORRUPT {log_path} position {position}: magic 7 is not 2 (record batch v2)" in lines


def test_verify_broken_index_entry_is_reported_with_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(CHANGELOG, tmp_path / "changelog-0")
    index_path = directory / "00000000000000000000.index"
    data = bytearray(index_path.read_bytes())
    relative, position = struct.unpack_from(">ii", data, 3 * 8)
    struct.pack_into(">ii", data, 3 * 8, relative, position + 1)  # entry 3 points inside a batch
    index_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert lines[:-1] == [
        f"CORRUPT {index_path} position 24: offset {relative} -> log position {position + 1}: "
        "no batch starts there"
    ]


def test_verify_kafka_index_entry_before_its_batch_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(CHANGELOG, tmp_path / "changelog-0")
    index_path = directory / "00000000000000000000.index"
    data = bytearray(index_path.read_bytes())
    _, position = struct.unpack_from(">ii", data, 8)
    (_, _, base, last) = next(b for b in raw_batches(directory / SEGMENT) if b[0] == position)
    struct.pack_into(">ii", data, 8, base - 1, position)  # a lookup of offset base - 1 would miss it
    index_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert lines[:-1] == [
        f"CORRUPT {index_path} position 8: offset {base - 1} -> log position {position}, "
        f"where the batch holds offsets {base}..{last}"
    ]


def test_verify_kafka_index_entry_for_a_multi_batch_append_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kafka up to 3.6 indexes a follower's append of many batches by its last offset at its first batch."""
    directory = tmp_path / "replica-0"
    directory.mkdir()
    batches = [encode_batch([(b"k", b"v" * 3000)], base_offset=n, timestamp_ms=T0) for n in range(4)]
    (directory / SEGMENT).write_bytes(b"".join(batches))
    (directory / "00000000000000000000.index").write_bytes(struct.pack(">ii", 3, len(batches[0])))

    status, lines, _ = run(capsys, str(directory))

    assert status == 0 and summary(lines).endswith("no problems")


def test_verify_oncelog_index_entry_must_name_its_batchs_last_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    oncelog_log(directory)
    index_path = sorted(directory.glob("*.index"))[0]
    base_offset = int(index_path.name[:20])
    data = bytearray(index_path.read_bytes())
    relative, position = struct.unpack_from(">ii", data, 0)
    (_, _, first, last) = next(b for b in raw_batches(index_path.with_suffix(".log")) if b[0] == position)
    struct.pack_into(
        ">ii", data, 0, relative + 1, position
    )  # past its batch: Kafka's leniency is not oncelog's
    index_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert lines[:-1] == [
        f"CORRUPT {index_path} position 0: offset {base_offset + relative + 1} -> log position {position}, "
        f"where the batch holds offsets {first}..{last}"
    ]


def test_verify_index_out_of_order_and_time_index_decreasing_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(CHANGELOG, tmp_path / "changelog-0")
    index_path = directory / "00000000000000000000.index"
    data = bytearray(index_path.read_bytes())
    data[16:24], data[24:32] = data[24:32], data[16:24]  # entries 2 and 3 swapped
    index_path.write_bytes(bytes(data))
    time_path = directory / "00000000000000000000.timeindex"
    times = bytearray(time_path.read_bytes())
    (timestamp,) = struct.unpack_from(">q", times, 12)
    struct.pack_into(">q", times, 24, timestamp - 1)  # entry 2 older than entry 1
    time_path.write_bytes(bytes(times))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert any(
        line.startswith(f"CORRUPT {index_path} position 24: entry ") and "out of order" in line
        for line in lines
    )
    assert any(
        line.startswith(f"CORRUPT {time_path} position 24: entry ") and "out of order" in line
        for line in lines
    )


def test_verify_zeros_then_entries_in_an_index_are_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(CHANGELOG, tmp_path / "changelog-0")
    index_path = directory / "00000000000000000000.index"
    data = bytearray(index_path.read_bytes())
    data[40:48] = bytes(8)
    index_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert (
        f"CORRUPT {index_path} position 40: zero-filled entries are followed by an entry at position 48"
        in lines
    )


def test_verify_a_first_time_index_entry_of_timestamp_0_at_the_base_offset_is_an_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(0, 0) is all zeros, yet a real entry: Kafka and oncelog index any timestamp above -1."""
    directory = tmp_path / "epoch-0"
    config = LogConfig(index_interval_bytes=300)
    log = Log.open(directory, config, clock=lambda: T0)
    for timestamp in (0, 0, 0, 0, 5, 6, 7):
        log.append(encode_batch([(b"k", b"v" * 100)], timestamp_ms=timestamp))
    log.close()
    time_path = directory / "00000000000000000000.timeindex"
    entries = list(struct.iter_unpack(">qi", time_path.read_bytes()))
    assert entries[0] == (0, 0) and len(entries) > 1  # what the engine wrote

    status, lines, _ = run(capsys, str(directory))
    assert (status, lines[:-1]) == (0, [])

    # More zeros after it make it part of a zero-filled run followed by an entry: damage.
    data = bytearray(time_path.read_bytes())
    struct.pack_into(">qi", data, 12, 0, 0)
    time_path.write_bytes(bytes(data))
    status, lines, _ = run(capsys, str(directory))
    assert status == 1
    expected = "position 0: zero-filled entries are followed by an entry at position 24"
    assert f"CORRUPT {time_path} {expected}" in lines


def test_verify_corrupt_snapshot_and_txn_index_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    oncelog_log(directory)
    snapshot = sorted(directory.glob("*.snapshot"))[-1]
    snapshot.write_bytes(snapshot.read_bytes()[:-1] + b"\x01")
    (txn_index,) = directory.glob("*.txnindex")
    txn_index.write_bytes(b"\x00\x07" + txn_index.read_bytes()[2:])  # version 7

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert any(line.startswith(f"CORRUPT {snapshot}: CRC mismatch (stored ") for line in lines)
    assert any(line.startswith(f"CORRUPT {txn_index} position 0: transaction index entry") for line in lines)


def test_verify_corrupt_kafka_snapshot_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(FIXTURES / "flink-on-prem" / "_confluent-command-0", tmp_path / "command-0")
    (snapshot,) = directory.glob("*.snapshot")
    data = bytearray(snapshot.read_bytes())
    data[-1] ^= 0x01
    snapshot.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert [line.split(" (")[0] for line in lines[:-1]] == [f"CORRUPT {snapshot}: CRC mismatch"]


def test_verify_batch_below_its_segments_base_offset_is_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    oncelog_log(directory)
    second = sorted(directory.glob("*.log"))[1]
    data = bytearray(second.read_bytes())
    struct.pack_into(">q", data, 0, 0)  # baseOffset: outside the CRC
    second.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    expected = (
        f"CORRUPT {second} position 0: batch at offset 0: base offset is below the segment's base offset"
    )
    assert any(line.startswith(expected) for line in lines)


def test_verify_offsets_that_do_not_increase_are_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "kafka-0"
    directory.mkdir()
    first = encode_batch([(b"k", b"v"), (b"k", b"w")], timestamp_ms=T0)
    again = encode_batch([(b"k", b"x")], base_offset=1, timestamp_ms=T0)
    (directory / SEGMENT).write_bytes(first + again)

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    expected = "batch at offset 1: offsets 1..1 do not follow the previous batch's 1"
    assert f"CORRUPT {directory / SEGMENT} position {len(first)}: {expected}" in lines


# -- poison batches: a right CRC over records that do not decode (issue 15) ---------------------


def poison(data: bytearray, position: int, size: int, body: bytes | None = None) -> None:
    """Replace the records of the batch at `position` (zeros by default) and make its CRC right again."""
    data[position + 61 : position + size] = bytes(size - 61) if body is None else body
    struct.pack_into(
        ">I", data, position + CRC_AT, crc32c.crc32c(bytes(data[position + 21 : position + size]))
    )


def test_verify_reports_a_poison_batch_written_into_a_segment_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    oncelog_log(directory)
    sealed = sorted(directory.glob("*.log"))[1]
    batches = raw_batches(sealed)
    position, size, base_offset, _ = batches[3]
    data = bytearray(sealed.read_bytes())
    poison(data, position, size)
    sealed.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    (problem,) = [line for line in lines if line.startswith(("CORRUPT", "WARNING"))]
    assert problem.startswith(
        f"CORRUPT {sealed} position {position}: batch at offset {base_offset}: "
        "records do not decode: record 0"
    )
    assert summary(lines).endswith("1 corrupt, 0 warnings")


def test_verify_a_poison_batch_past_the_recovery_point_is_corruption_not_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recovery checks headers and CRCs only: it would keep and serve this batch, so no cut is promised."""
    log = oncelog_log(tmp_path / "orders-0", close=False)
    try:
        active = tmp_path / "orders-0" / f"{log.active_segment.base_offset:020d}.log"
        image = tmp_path / "image" / "orders-0"
        shutil.copytree(tmp_path / "orders-0", image)  # what a kill -9 leaves
    finally:
        log.close()
    damaged = image / active.name
    position, size, base_offset, _ = raw_batches(damaged)[-1]
    data = bytearray(damaged.read_bytes())
    # recordsCount 2^31-1 (lastOffsetDelta to match) over the one record there is.
    struct.pack_into(">i", data, position + 23, 2**31 - 2)
    struct.pack_into(">i", data, position + 57, 2**31 - 1)
    poison(data, position, size, body=bytes(data[position + 61 : position + size]))
    damaged.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(image))

    assert status == 1
    assert [line for line in lines if line.startswith(("CORRUPT", "WARNING"))] == [
        f"CORRUPT {damaged} position {position}: batch at offset {base_offset}: records do not decode: "
        f"recordsCount 2147483647 cannot fit {size - 61} bytes of records"
    ]


def test_verify_reports_offset_deltas_out_of_order_in_a_log_of_client_appends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    with Log.open(directory, LogConfig(segment_index_bytes=4096)) as log:
        log.append(encode_batch([(b"a", b"1"), (b"b", b"2")], timestamp_ms=T0))
    (position, size, base_offset, _) = raw_batches(directory / SEGMENT)[0]
    data = bytearray((directory / SEGMENT).read_bytes())
    records = bytearray(data[position + 61 : position + size])
    # Two records of the same size: the offset delta is the record's fourth byte (length, attributes,
    # timestamp delta, offset delta), one record later for the second.
    half = len(records) // 2
    records[3], records[half + 3] = records[half + 3], records[3]
    poison(data, position, size, body=bytes(records))
    (directory / SEGMENT).write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert (
        f"CORRUPT {directory / SEGMENT} position {position}: batch at offset {base_offset}: records break "
        "the offset rule: record 0 has offset delta 1: a batch of 2 records has 0..1"
    ) in lines


def test_verify_a_poison_batch_in_a_kafka_fixture_copy_is_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(PROMOTIONS, tmp_path / "promotions-0")
    log_path = directory / SEGMENT
    batches = raw_batches(log_path)
    position, size, base_offset, _ = batches[5]
    data = bytearray(log_path.read_bytes())
    poison(data, position, size, body=b"\x28\xb5\x2f\xfd" + bytes(size - 65))  # zstd's magic, then zeros
    struct.pack_into(">h", data, position + 21, 4)  # the batch now says zstd
    poison(data, position, size, body=bytes(data[position + 61 : position + size]))
    log_path.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    (problem,) = [line for line in lines if line.startswith("CORRUPT")]
    assert problem.startswith(
        f"CORRUPT {log_path} position {position}: batch at offset {base_offset}: records do not decode: "
        "zstd body"
    )
    assert summary(lines).startswith(f"verified 1 partitions, 1 segments, {len(batches)} batches")


# -- torn tails are warnings ------------------------------------------------------------------


def test_verify_torn_tail_in_the_last_segment_is_a_warning_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = writable_copy(PATIENTS, tmp_path / "patients-0")
    log_path = directory / SEGMENT
    position, size, _, _ = raw_batches(log_path)[-1]
    log_path.write_bytes(log_path.read_bytes()[: position + size // 2])

    status, lines, _ = run(capsys, str(directory))

    assert status == 0
    cut = size // 2
    (warning,) = [line for line in lines if line.startswith("WARNING")]
    torn = f"torn tail: recovery will cut {cut} bytes at position {position}"
    assert warning.startswith(f"WARNING {log_path} position {position}: {torn}")
    assert summary(lines).endswith("0 corrupt, 1 warnings")


def test_verify_torn_batch_in_a_sealed_segment_is_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "kafka-0"
    directory.mkdir()
    (directory / SEGMENT).write_bytes(encode_batch([(b"k", b"v")], timestamp_ms=T0)[:-5])
    (directory / f"{1:020d}.log").write_bytes(encode_batch([(b"k", b"w")], base_offset=1, timestamp_ms=T0))

    status, lines, _ = run(capsys, str(directory))

    assert status == 1
    assert any(line.startswith(f"CORRUPT {directory / SEGMENT} position 0: ") for line in lines)


def test_verify_oncelog_crash_damage_past_the_recovery_point_is_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = oncelog_log(tmp_path / "orders-0", close=False)
    try:
        active = tmp_path / "orders-0" / f"{log.active_segment.base_offset:020d}.log"
        data_end = log.active_segment.size
        image = tmp_path / "image" / "orders-0"
        shutil.copytree(tmp_path / "orders-0", image)  # what a kill -9 leaves
    finally:
        log.close()
    damaged = image / active.name
    data = bytearray(damaged.read_bytes())
    data[data_end : data_end + 40] = b"\xab" * 40  # garbage where the next batch would go
    damaged.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(image))

    assert status == 0
    assert [line for line in lines if line.startswith(("WARNING", "CORRUPT"))] == [
        f"WARNING {damaged} position {data_end}: torn tail: recovery will cut {len(data) - data_end} "
        f"bytes at position {data_end} (magic -85 is not 2 (record batch v2))"
    ]


def test_verify_oncelog_damage_below_the_recovery_point_is_corruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = oncelog_log(tmp_path / "orders-0", close=False)
    try:
        log.flush()
        assert log.checkpoint()  # the recovery point moves to the end: every batch is vouched for
        active = tmp_path / "orders-0" / f"{log.active_segment.base_offset:020d}.log"
        image = tmp_path / "image" / "orders-0"
        shutil.copytree(tmp_path / "orders-0", image)
    finally:
        log.close()
    damaged = image / active.name
    position, _, base_offset, _ = raw_batches(damaged)[-1]
    data = bytearray(damaged.read_bytes())
    data[position + 30] ^= 1
    damaged.write_bytes(bytes(data))

    status, lines, _ = run(capsys, str(image))

    assert status == 1
    assert any(
        line.startswith(f"CORRUPT {damaged} position {position}: batch at offset {base_offset}: CRC")
        for line in lines
    )


def test_verify_broken_index_of_a_segment_recovery_rebuilds_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = oncelog_log(tmp_path / "orders-0", close=False)
    try:
        index = tmp_path / "orders-0" / f"{log.active_segment.base_offset:020d}.index"
        image = tmp_path / "image" / "orders-0"
        shutil.copytree(tmp_path / "orders-0", image)  # unclean: no .clean_shutdown
    finally:
        log.close()
    (image / index.name).write_bytes(struct.pack(">ii", 5, 3))

    status, lines, _ = run(capsys, str(image))

    assert status == 0
    (warning,) = [line for line in lines if line.startswith("WARNING")]
    assert warning.startswith(f"WARNING {image / index.name} position 0: ") and warning.endswith(
        "(recovery rebuilds this index)"
    )


# -- bad input exits 2 -------------------------------------------------------------------------


def test_verify_missing_path_empty_directory_and_a_file_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    for target in ("missing", "empty", "file"):
        status, lines, err = run(capsys, str(tmp_path / target))
        assert (status, lines) == (2, [])
        assert err.startswith("oncelog verify: ") and str(tmp_path / target) in err


# -- read-only, bounded, output -------------------------------------------------------------------


class RecordingFs:
    """The real filesystem, recording every open and read; it offers nothing that writes."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, bool, bool]] = []
        self.reads: list[int] = []

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        self.opened.append((path, create, writable))
        handle = DEFAULT_FS.open(path, create=create, writable=writable)
        reads = self.reads
        original = handle.pread

        def pread(size: int, offset: int) -> bytes:
            reads.append(size)
            return original(size, offset)

        handle.pread = pread  # type: ignore[method-assign]
        return handle

    def listdir(self, path: str) -> list[str]:
        return DEFAULT_FS.listdir(path)

    def exists(self, path: str) -> bool:
        return DEFAULT_FS.exists(path)

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        self.opened.append((path, False, not readonly))  # a store opened read-write fails the fixture
        return DEFAULT_FS.open_store(path, readonly=readonly)


@pytest.fixture
def recording_fs(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingFs]:
    fs = RecordingFs()
    monkeypatch.setattr(cli_verify, "DEFAULT_FS", fs)
    yield fs
    assert fs.opened and all(not create and not writable for _, create, writable in fs.opened)


def test_verify_creates_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recording_fs: RecordingFs
) -> None:
    oncelog_log(tmp_path / "orders-0")
    log = oncelog_log(tmp_path / "live-0", close=False)
    try:
        shutil.copytree(tmp_path / "live-0", tmp_path / "crashed-0")  # what a kill -9 leaves
    finally:
        log.close()
    shutil.copytree(PATIENTS, tmp_path / "patients-0")
    before = tree(tmp_path)
    fixtures_before = tree(FIXTURES)

    status, lines, _ = run(capsys, str(tmp_path))
    assert run(capsys, str(FIXTURES / "flink-on-prem"))[0] == 0

    assert status == 0, lines
    assert tree(tmp_path) == before
    assert tree(FIXTURES) == fixtures_before


def test_verify_streams_segments_in_bounded_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recording_fs: RecordingFs
) -> None:
    value = bytes(range(256)) * 400
    count = SCAN_CHUNK_BYTES // len(value) + 10
    segment = tmp_path / "big-0" / SEGMENT
    segment.parent.mkdir()
    segment.write_bytes(
        b"".join(encode_batch([(b"k", value)], base_offset=i, timestamp_ms=T0) for i in range(count))
    )

    status, lines, _ = run(capsys, str(segment.parent))

    assert status == 0 and summary(lines).startswith(f"verified 1 partitions, 1 segments, {count} batches")
    assert max(recording_fs.reads) <= SCAN_CHUNK_BYTES < segment.stat().st_size


def test_verify_quiet_prints_only_corruption(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torn = writable_copy(PATIENTS, tmp_path / "patients-0") / SEGMENT
    torn.write_bytes(torn.read_bytes()[:-3])
    bad = writable_copy(PROMOTIONS, tmp_path / "promotions-0") / SEGMENT
    data = bytearray(bad.read_bytes())
    data[raw_batches(bad)[2][0] + 30] ^= 1
    bad.write_bytes(bytes(data))

    status, lines, _ = run(capsys, "--quiet", str(tmp_path))

    assert status == 1
    assert len(lines) == 1 and lines[0].startswith(f"CORRUPT {bad} position ")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_verify_draws_a_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    out, err = io.StringIO(), Terminal()
    assert cli.main(["verify", str(PROMOTIONS)], out=out, err=err) == 0
    assert "partitions" in err.getvalue()  # rich's bar
    assert out.getvalue().startswith("verified 1 partitions")

    out, err = io.StringIO(), Terminal()
    assert cli.main(["verify", "--no-progress", str(PROMOTIONS)], out=out, err=err) == 0
    assert err.getvalue() == ""


def test_verify_help_explains_the_checks_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "--help")

    text = "\n".join(lines)
    assert status == 0 and text.startswith("usage: oncelog verify")
    for words in (
        "CRC-32C",
        ".index",
        ".timeindex",
        ".txnindex",
        "snapshot",
        "torn tail",
        "read-only",
        "Exit status",
    ):
        assert words in text
    assert "--quiet" in text and "--no-progress" in text and "oncelog verify " in text


# -- fsynced data that is gone ------------------------------------------------------------------
def test_verify_reports_a_recovery_point_past_the_data_when_the_newest_segment_is_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "t-0"
    oncelog_log(directory)
    newest = sorted(directory.glob("*.log"))[-1]
    newest.unlink()
    code, lines, _ = run(capsys, "--no-progress", str(directory))
    assert code == 1
    problems = [line for line in lines if line.startswith("CORRUPT")]
    assert len(problems) == 1 and str(newest) in problems[0], lines
    assert "are missing" in problems[0]


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_verify_reports_a_lost_first_segment_as_open_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    directory = tmp_path / "t-0"
    oncelog_log(directory)
    first = sorted(directory.glob("*.log"))[0]
    if damage == "deleted":
        first.unlink()
    else:
        first.write_bytes(b"")
    code, lines, _ = run(capsys, "--no-progress", str(directory))
    assert code == 1
    # (An emptied file's indexes point past its end: those are reported too.)
    reason = "are missing" if damage == "deleted" else "no batches"
    problems = [line for line in lines if line.startswith("CORRUPT") and reason in line]
    assert len(problems) == 1 and str(first) in problems[0], lines


def test_verify_reports_a_lost_segment_between_two_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "t-0"
    oncelog_log(directory)
    segments = sorted(directory.glob("*.log"))
    assert len(segments) >= 3
    segments[1].unlink()
    code, lines, _ = run(capsys, "--no-progress", str(directory))
    assert code == 1
    gap = [line for line in lines if "a lost segment" in line]
    assert len(gap) == 1 and str(segments[2]) in gap[0], lines
