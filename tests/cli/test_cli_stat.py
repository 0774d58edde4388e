"""`oncelog stat` (engine/cli_stat.py): one row per partition, read-only.

Expected end offsets and producer counts are computed from the raw bytes with struct
(batch headers, Kafka v1 snapshot entries), independently of the engine's codec and
snapshot reader. Fixture partitions are read in place, never written.
"""

from __future__ import annotations

import io
import json
import shutil
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_fixtures import kafka_fixtures_root

from oncelog.cli import main as cli
from oncelog.cli import stat as cli_stat
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments import encode_batch
from oncelog.storage.fs import DEFAULT_FS, FileHandle, MetadataStore

FIXTURES = kafka_fixtures_root()
FLINK = FIXTURES / "flink-on-prem"
LDI = FIXTURES / "LDI-POC"
PATIENTS = LDI / "TestTopicPatient-0"  # 3 batches from pids 1, 2, 3; no snapshot
T0 = 1_700_000_000_000
COLUMNS = [
    "topic",
    "partition",
    "segments",
    "bytes",
    "start",
    "end",
    "producers",
    "open_txns",
    "clean",
    "dirty",
    "cleaned_to",
]
CONTROL_BIT = 0x20


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = cli.main(["stat", *argv])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def table(lines: list[str]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The plain table: {topic-partition: {column: cell}}, and the total row's cells.

    The compaction columns (dirty, cleaned to) are there only when some partition is compacted.
    """
    header = lines[0].split()
    compaction = header[-3:] == ["dirty", "cleaned", "to"]
    assert header[: -3 if compaction else None] == [
        "topic",
        "partition",
        "segments",
        "bytes",
        "start",
        "end",
        "producers",
        "open",
        "txns",
        "clean",
    ]
    columns = COLUMNS if compaction else COLUMNS[:-2]
    rows = {}
    for line in lines[1:-1]:
        cells = dict(zip(columns, line.split(), strict=True))
        rows[f"{cells['topic']}-{cells['partition']}"] = cells
    return rows, lines[-1].split()


def raw_headers(path: Path) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, producer id, attributes) of each batch, by struct alone."""
    data = path.read_bytes()
    out, position = [], 0
    while position + 61 <= len(data) and any(data[position : position + 17]):
        base, length = struct.unpack_from(">qi", data, position)
        attributes, delta = struct.unpack_from(">hi", data, position + 21)
        (pid,) = struct.unpack_from(">q", data, position + 43)
        out.append((base, base + delta, pid, attributes))
        position += length + 12
    return out


def kafka_snapshot_pids(path: Path) -> set[int]:
    """Producer ids in a Kafka v1 snapshot: i16 version, u32 crc, i32 count, 46-byte entries."""
    data = path.read_bytes()
    version, _, count = struct.unpack_from(">hIi", data)
    assert version == 1 and len(data) == 10 + 46 * count
    return {struct.unpack_from(">q", data, 10 + 46 * n)[0] for n in range(count)}


def expected_kafka_row(directory: Path) -> tuple[int, int]:
    """(end offset, producers): the newest snapshot's producers plus those of data batches after it."""
    (segment,) = directory.glob("*.log")
    headers = raw_headers(segment)
    end = headers[-1][1] + 1 if headers else int(segment.name[:20])
    snapshots = sorted(directory.glob("*.snapshot"))
    pids = kafka_snapshot_pids(snapshots[-1]) if snapshots else set()
    start = int(snapshots[-1].name[:20]) if snapshots else 0
    pids |= {pid for base, _, pid, attrs in headers if base >= start and pid >= 0 and not attrs & CONTROL_BIT}
    return end, len(pids)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root: (size, mtime in ns)."""
    return {
        str(p.relative_to(root)): (p.lstat().st_size if p.is_file() else 0, p.lstat().st_mtime_ns)
        for p in [root, *root.rglob("*")]
    }


def data(pid: int, seq: int, *, transactional: bool = False, count: int = 1) -> bytes:
    records = [(b"k", b"v" * 40)] * count
    return encode_batch(
        records,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=transactional,
        timestamp_ms=T0,
    )


def config(**overrides: int) -> LogConfig:
    return LogConfig(segment_index_bytes=4096, **overrides)


@pytest.fixture
def oncelog_root(tmp_path: Path) -> Path:
    """Two topics. orders-0: idempotent, rolled, start moved, closed cleanly. payments-0 (offsets
    0-8): a crash image with transactions: pid 5 open, 6 aborted, 7 committed, 8 opened before the
    roll (so the snapshot holds it open) and committed after it."""
    root = tmp_path / "root"
    with Log.open(root / "orders-0", config(segment_bytes=2048), clock=lambda: T0) as log:
        for seq in range(20):
            log.append(data(1, seq))
        assert log.delete_records(5) == 5
    log = Log.open(tmp_path / "live" / "payments-0", config(), clock=lambda: T0)
    try:
        assert log.append(data(5, 0, transactional=True, count=2)).first_offset == 0
        log.append(data(6, 0, transactional=True))
        log.write_txn_marker(6, 0, commit=False, coordinator_epoch=1)
        log.append(data(8, 0, transactional=True))
        log.roll()
        log.append(data(7, 0, transactional=True))
        log.write_txn_marker(7, 0, commit=True, coordinator_epoch=1)
        log.write_txn_marker(8, 0, commit=True, coordinator_epoch=1)
        assert log.append(encode_batch([(b"k", b"plain")], timestamp_ms=T0)).first_offset == 8
        shutil.copytree(tmp_path / "live" / "payments-0", root / "payments-0")  # what a kill -9 leaves
    finally:
        log.close()
    (root / "meta.lmdb").mkdir()  # root-wide entries are skipped
    (root / ".lock").write_bytes(b"")
    (root / "payments-1.00ff-delete").mkdir()
    return root


# -- Kafka fixtures ------------------------------------------------------------------------


def test_stat_flink_fixture_rows_match_the_batches_and_the_snapshots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, lines, err = run(capsys, str(FLINK))

    assert (status, err) == (0, "")
    rows, total = table(lines)
    directories = sorted(p for p in FLINK.iterdir() if p.is_dir())
    assert sorted(rows) == sorted(p.name for p in directories)
    for directory in directories:
        end, producers = expected_kafka_row(directory)
        row = rows[directory.name]
        assert (row["segments"], row["start"], row["end"]) == ("1", "0", str(end)), directory.name
        assert (row["producers"], row["open_txns"], row["clean"]) == (str(producers), "0", "no"), (
            directory.name
        )
        assert row["bytes"] == str(sum(p.stat().st_size for p in directory.glob("*.log")))
    # PROVENANCE: producer snapshots with 1, 2 and 5 entries.
    assert {
        rows[name]["producers"]
        for name in ("loyalty_levels-0", "_confluent-command-0", "_confluent-monitoring-0")
    } == {
        "1",
        "2",
        "5",
    }
    assert total == ["total", str(len(rows)), str(sum(int(r["bytes"]) for r in rows.values())), "17", "0"]


def test_stat_ldi_fixture_replays_the_batches_when_there_is_no_snapshot(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, lines, _ = run(capsys, str(LDI))

    assert status == 0
    rows, _ = table(lines)
    assert {pid for _, _, pid, _ in raw_headers(PATIENTS / "00000000000000000000.log")} == {1, 2, 3}
    assert (rows["TestTopicPatient-0"]["end"], rows["TestTopicPatient-0"]["producers"]) == ("3", "3")
    for name in ("__cluster_metadata-0", "__consumer_offsets-6"):
        end, producers = expected_kafka_row(LDI / name)
        assert (rows[name]["end"], rows[name]["producers"]) == (str(end), str(producers))


def test_stat_honours_kafkas_log_start_checkpoint_and_clean_shutdown_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(PATIENTS, tmp_path / "TestTopicPatient-0")
    (tmp_path / "log-start-offset-checkpoint").write_text("0\n2\nTestTopicPatient 0 2\nother 3 9\n")
    (tmp_path / ".kafka_cleanshutdown").write_bytes(b"")

    status, lines, _ = run(capsys, str(tmp_path / "TestTopicPatient-0"))

    assert status == 0
    rows, _ = table(lines)
    assert (rows["TestTopicPatient-0"]["start"], rows["TestTopicPatient-0"]["clean"]) == ("2", "yes")


def test_stat_torn_tail_ends_the_scan_and_is_noted_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "TestTopicPatient-0"
    shutil.copytree(PATIENTS, directory)
    segment = directory / "00000000000000000000.log"
    segment.chmod(segment.stat().st_mode | stat.S_IWUSR)
    segment.write_bytes(segment.read_bytes()[:-10])

    status, lines, err = run(capsys, str(directory))

    assert status == 0
    rows, _ = table(lines)
    assert (rows["TestTopicPatient-0"]["end"], rows["TestTopicPatient-0"]["producers"]) == ("2", "2")
    assert err.startswith(f"oncelog stat: TestTopicPatient-0: {segment} at position ")


# -- oncelog roots ---------------------------------------------------------------------------


def test_stat_oncelog_root_with_two_topics_counts_producers_and_open_transactions(
    oncelog_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines, err = run(capsys, str(oncelog_root))

    assert (status, err) == (0, "")
    rows, total = table(lines)
    orders_segments = len(list((oncelog_root / "orders-0").glob("*.log")))
    assert orders_segments >= 2
    assert rows["orders-0"] == dict(
        zip(
            COLUMNS[:-2],
            ["orders", "0", str(orders_segments), rows["orders-0"]["bytes"], "5", "20", "1", "0", "yes"],
            strict=True,
        )
    )
    # pid 8's transaction is open in the snapshot at the roll and closed by a marker replayed after it.
    assert rows["payments-0"] == dict(
        zip(
            COLUMNS[:-2],
            ["payments", "0", "2", rows["payments-0"]["bytes"], "0", "9", "4", "1", "no"],
            strict=True,
        )
    )
    assert total == [
        "total",
        str(orders_segments + 2),
        str(int(rows["orders-0"]["bytes"]) + int(rows["payments-0"]["bytes"])),
        "5",
        "1",
    ]


def test_stat_json_is_a_list_of_objects(oncelog_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "--json", str(oncelog_root))

    assert status == 0
    rows = json.loads("\n".join(lines))
    assert [(r["topic"], r["partition"]) for r in rows] == [("orders", 0), ("payments", 0)]
    payments = rows[1]
    assert payments["producers"] == 4 and payments["open_transactions"] == 1
    assert payments["last_stable_offset"] == 0 and payments["log_end_offset"] == 9
    assert payments["clean_shutdown"] is False and payments["format"] == "oncelog" and payments["notes"] == []
    assert rows[0]["log_start_offset"] == 5 and rows[0]["clean_shutdown"] is True


class RecordingFs:
    """The real filesystem, recording every open; it offers nothing that writes."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, bool, bool]] = []

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        self.opened.append((path, create, writable))
        return DEFAULT_FS.open(path, create=create, writable=writable)

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
    monkeypatch.setattr(cli_stat, "DEFAULT_FS", fs)
    yield fs
    assert fs.opened and all(not create and not writable for _, create, writable in fs.opened)


def test_stat_creates_and_changes_nothing(
    oncelog_root: Path, capsys: pytest.CaptureFixture[str], recording_fs: RecordingFs
) -> None:
    before, fixtures_before = tree(oncelog_root), tree(FIXTURES)

    assert run(capsys, str(oncelog_root))[0] == 0
    assert run(capsys, "--json", str(FLINK))[0] == 0
    assert run(capsys, str(PATIENTS))[0] == 0

    assert tree(oncelog_root) == before
    assert tree(FIXTURES) == fixtures_before


# -- output and input --------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stat_draws_a_rich_table_on_a_terminal(oncelog_root: Path) -> None:
    out = Terminal()
    assert cli.main(["stat", str(oncelog_root)], out=out, err=io.StringIO()) == 0
    text = out.getvalue()
    assert "orders" in text and "payments" in text and "open txns" in text and "total" in text


def test_stat_missing_path_and_empty_directory_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for target in ("missing", "empty"):
        status, lines, err = run(capsys, str(tmp_path / target))
        assert (status, lines) == (2, [])
        assert err.startswith("oncelog stat: ") and str(tmp_path / target) in err


def test_stat_help_explains_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = run(capsys, "--help")

    text = "\n".join(lines)
    assert status == 0 and text.startswith("usage: oncelog stat")
    for words in (
        "--json",
        "log-start-offset-checkpoint",
        "snapshot",
        "open transaction",
        "Exit status",
        "oncelog stat ",
    ):
        assert words in text
