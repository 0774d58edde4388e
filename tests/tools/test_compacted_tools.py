"""`oncelog dump`, `verify` and `stat` on compacted logs (issue 33, "Tools").

Logs are compacted by the engine's own cleaner (`Log.clean`); what the tools should
print is computed here from the raw segment bytes with struct (batch headers) and the
codec's record iterator, not from the tools' code. Kafka-format directories (no
metadata store; Kafka's checkpoint files in the log.dir) are written by hand where a
test needs data a cleaner never leaves (an aborted transaction below the cleaned point).
"""

from __future__ import annotations

import io
import json
import random
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.cli import main as cli
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.log_manager import LogManager
from oncelog.segment_cleaning import AbortedRanges
from oncelog.segments import RecordBatch, encode_batch, iter_batches
from oncelog.segments.control import encode_txn_marker
from oncelog.segments.txn_index import AbortedTxn
from oncelog.tools.verify_keys import LiveKeyCheck

T0 = 1_700_000_000_000
CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=1024, delete_retention_ms=5_000)
KEYS = 7
HORIZON_BIT = 0x40
GAP = re.compile(
    r"(?P<inside>\| )?gap: offsets (?P<first>\d+)\.\.(?P<last>\d+) \((?P<count>\d+) offsets?\)"
    r" (?P<what>are in no batch|have no record)"
)
TXN_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first offset, last offset, last stable offset


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def updates(log: Log, first: int, count: int) -> None:
    """Batches `first`..`first + count - 1`: three updates each, of keys k0..k6 in turn."""
    for n in range(first, first + count):
        records = [(b"k%d" % ((n * 3 + j) % KEYS), b"v%d-%d" % (n, j)) for j in range(3)]
        log.append(encode_batch(records, timestamp_ms=T0 + n))


def compacted_log(directory: Path) -> int:
    """Several segments of updates to 7 keys, cleaned once, then more updates (the dirty part)
    in sealed segments and the active one. Returns the cleaner checkpoint."""
    with Log.open(directory, CONFIG, clock=lambda: T0) as log:
        updates(log, 0, 40)
        log.flush()
        cleaned_to = log.clean(now_ms=T0 + 100).cleaned_to
        updates(log, 40, 25)
        log.roll()
        updates(log, 65, 2)
        log.flush()
    return cleaned_to


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


class RawBatch:
    """A batch header read with struct alone (the layout of the brief, §3)."""

    def __init__(self, data: bytes, position: int):
        self.position = position
        self.base, length = struct.unpack_from(">qi", data, position)
        self.size = length + 12
        self.attributes, delta, self.base_timestamp = struct.unpack_from(">hiq", data, position + 21)
        (self.count,) = struct.unpack_from(">i", data, position + 57)
        self.last = self.base + delta


def raw_batches(path: Path) -> list[RawBatch]:
    data = path.read_bytes()
    out: list[RawBatch] = []
    position = 0
    while position + 61 <= len(data) and any(data[position : position + 17]):
        out.append(RawBatch(data, position))
        position += out[-1].size
    return out


def live_records(directory: Path) -> Iterator[tuple[Path, int, int, bytes | None, bytes | None]]:
    """(segment, batch position, offset, key, value) of every data record, in offset order."""
    for path in segments(directory):
        position = 0
        for batch in iter_batches(path.read_bytes()):
            if not batch.is_control:
                for record in batch.records():
                    yield path, position, record.offset, record.key, record.value
            position += batch.size


def fields(line: str) -> dict[str, str]:
    tokens = line.split()
    return dict(zip((name[:-1] for name in tokens[::2]), tokens[1::2], strict=True))


# -- dump ---------------------------------------------------------------------------------------


def test_dump_marks_every_offset_a_cleaning_left_without_a_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    compacted_log(directory)
    files = segments(directory)
    raw = {path: raw_batches(path) for path in files}
    assert any(b.count == 0 for batches in raw.values() for b in batches), "the cleaner left an empty batch"

    status, lines, err = run(capsys, "dump", "--records", str(directory))

    assert (status, err) == (0, "")
    # Between "Dumping X" lines: every offset of a segment's range is shown exactly once, as a
    # record, as a gap inside a batch, or as a gap between batches.
    starts = [n for n, line in enumerate(lines) if line.startswith("Dumping ")]
    for n, start in enumerate(starts):
        path = Path(lines[start].removeprefix("Dumping "))
        if path.suffix != ".log":
            continue
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        shown: list[int] = []
        batch_gaps = 0
        for line in lines[start:end]:
            if line.startswith("| offset: "):
                shown.append(int(line.split()[2]))
            elif gap := GAP.fullmatch(line):
                first, last, count = int(gap["first"]), int(gap["last"]), int(gap["count"])
                assert count == last - first + 1 and (gap["inside"] == "| ") == (
                    gap["what"] == "have no record"
                )
                shown += range(first, last + 1)
                batch_gaps += 0 if gap["inside"] else count
        following = files.index(path) + 1
        range_end = int(files[following].name[:20]) if following < len(files) else raw[path][-1].last + 1
        assert shown == list(range(int(path.name[:20]), range_end)), path
        summary = (
            lines[end - 1]
            if path != files[-1]
            else next(line for line in lines[start:end] if line.startswith("Summary: "))
        )
        assert summary.endswith(f", {batch_gaps} offsets in no batch") == (batch_gaps > 0), summary
    # Each batch line counts the offsets without a record, and marks an empty batch.
    batch_fields = [fields(line) for line in lines if line.startswith("baseOffset: ")]
    expected = [b for path in files for b in raw[path]]
    assert [int(f["baseOffset"]) for f in batch_fields] == [b.base for b in expected]
    for got, batch in zip(batch_fields, expected, strict=True):
        without = batch.last - batch.base + 1 - batch.count
        assert got.get("offsetsWithoutRecord") == (str(without) if without else None)
        assert got.get("emptyBatch") == ("true" if batch.count == 0 else None)


def test_dump_shows_the_delete_horizon_of_a_batch_keeping_a_tombstone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "users-0"
    with Log.open(directory, CONFIG, clock=lambda: T0) as log:
        log.append(encode_batch([(b"alice", b"1"), (b"bob", b"1")], timestamp_ms=T0))
        log.append(encode_batch([(b"alice", None)], timestamp_ms=T0 + 7))  # alice's tombstone
        log.append(encode_batch([(b"carol", b"1")], timestamp_ms=T0 + 8))
        log.roll()
        log.append(encode_batch([(b"dave", b"1")], timestamp_ms=T0 + 9))
        log.flush()
        log.clean(now_ms=T0 + 1_000)
    horizon = T0 + 1_000 + CONFIG.delete_retention_ms
    raw = raw_batches(segments(directory)[0])
    assert [(b.base, b.attributes & HORIZON_BIT, b.base_timestamp) for b in raw] == [
        (0, 0, T0),  # bob's update stays; alice's older one is gone
        (2, HORIZON_BIT, horizon),
        (3, 0, T0 + 8),
    ]

    status, lines, _ = run(capsys, "dump", "--records", str(directory))

    assert status == 0
    batch_fields = {
        int(f["baseOffset"]): f for f in (fields(x) for x in lines if x.startswith("baseOffset: "))
    }
    assert batch_fields[2]["deleteHorizonMs"] == str(horizon)
    assert all("deleteHorizonMs" not in f for offset, f in batch_fields.items() if offset != 2)
    # The tombstone keeps its own timestamp: its delta was rewritten against the horizon.
    (tombstone,) = [line for line in lines if line.startswith("| offset: 2 ")]
    assert f"CreateTime: {T0 + 7} " in tombstone and tombstone.endswith("key: alice payload: null")
    assert "| gap: offsets 0..0 (1 offset) have no record" in lines  # alice's older record


# -- verify -------------------------------------------------------------------------------------


def test_verify_accepts_the_gaps_empty_batches_and_dirty_repeats_of_a_compacted_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    cleaned_to = compacted_log(directory)
    records = list(live_records(directory))
    below = [key for _, _, offset, key, _ in records if offset < cleaned_to]
    above = [key for _, _, offset, key, _ in records if offset >= cleaned_to]
    offsets = [offset for _, _, offset, _, _ in records]
    assert len(set(below)) == len(below) == KEYS  # one record per key below the cleaned point
    assert len(above) > len(set(above))  # keys repeat in the dirty part
    assert len(offsets) < offsets[-1] + 1  # gaps
    assert any(b.count == 0 for path in segments(directory) for b in raw_batches(path))

    status, lines, _ = run(capsys, "verify", str(directory))

    assert status == 0
    assert lines[-1].endswith(": no problems")


def plant_stale_record(directory: Path, cleaned_to: int) -> tuple[bytes, int, Path, int, int]:
    """Rewrite the first segment's only batch (an emptied one) to hold records again, the
    last of them an older record of a key that is live below the cleaned point.
    Returns (key, its planted offset, file, batch position and offset of its live record)."""
    first = segments(directory)[0]
    (batch,) = raw_batches(first)
    assert batch.count == 0
    path, position, offset, key, _ = next(r for r in live_records(directory) if r[2] < cleaned_to)
    assert key is not None and offset > batch.last
    fresh = [(b"fresh-%d" % n, b"x") for n in range(batch.last - batch.base)]
    first.write_bytes(encode_batch([*fresh, (key, b"stale")], base_offset=batch.base, timestamp_ms=T0))
    live_batch = next(b for b in raw_batches(path) if b.position == position)
    return key, batch.last, path, position, live_batch.base


def test_verify_reports_two_live_records_of_a_key_below_the_cleaned_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    cleaned_to = compacted_log(directory)
    key, stale, path, position, batch_offset = plant_stale_record(directory, cleaned_to)
    live = next(offset for _, _, offset, k, _ in live_records(directory) if k == key and offset > stale)

    status, lines, _ = run(capsys, "verify", str(directory))

    assert status == 1
    assert lines[:-1] == [
        f"CORRUPT {path} position {position}: batch at offset {batch_offset}: key {key!r} has two live "
        f"records below the cleaned point {cleaned_to}, at offsets {stale} and {live}: a cleaning keeps "
        "only a key's newest record there"
    ]
    assert lines[-1].endswith(": 1 corrupt, 0 warnings")


def test_verify_warns_of_the_files_a_crash_mid_swap_leaves_and_open_settles_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    compacted_log(directory)
    first = segments(directory)[0]
    leftover = first.with_name(first.name + ".cleaned")  # step 1 of a swap, cut short
    leftover.write_bytes(first.read_bytes()[:30])

    status, lines, _ = run(capsys, "verify", str(directory))

    assert status == 0
    assert lines[:-1] == [
        f"WARNING {leftover}: left by a cleaning a crash interrupted: "
        "the next open finishes or undoes its swap"
    ]
    Log.open(directory, CONFIG, clock=lambda: T0).close()
    assert not leftover.exists()


def test_verify_still_reports_a_lost_segment_of_a_log_never_cleaned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    with Log.open(directory, CONFIG, clock=lambda: T0) as log:
        updates(log, 0, 40)
        log.flush()
    middle = segments(directory)[1]
    middle.unlink()

    status, lines, _ = run(capsys, "verify", str(directory))

    assert status == 1
    assert any(line.startswith("CORRUPT ") and "(a lost segment)" in line for line in lines), lines


def test_verify_counts_no_transaction_marker_and_no_aborted_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "payments-0"
    with Log.open(directory, CONFIG, clock=lambda: T0) as log:
        for pid, commit in ((5, False), (6, True), (7, True)):  # two COMMIT markers: the same key bytes
            batch = encode_batch(
                [(b"shared", b"%d" % pid)],
                producer_id=pid,
                producer_epoch=0,
                base_sequence=0,
                is_transactional=True,
                timestamp_ms=T0,
            )
            log.append(batch)
            log.write_txn_marker(pid, 0, commit=commit, coordinator_epoch=0)
        log.append(encode_batch([(b"other", b"1")], timestamp_ms=T0))
        log.roll()
        log.flush()
        cleaned_to = log.clean(now_ms=T0 + 100).cleaned_to
    markers = [b for path in segments(directory) for b in raw_batches(path) if b.attributes & 0x20]
    assert len(markers) >= 2 and all(b.last < cleaned_to for b in markers)

    status, lines, _ = run(capsys, "verify", str(directory))

    assert status == 0, lines
    assert lines[-1].endswith(": no problems")


def kafka_partition(root: Path, *, txn_index: bool, log_start: int | None = None) -> Path:
    """A Kafka log.dir whose cleaner-offset-checkpoint says orders-0 is cleaned up to 4.
    orders-0: 0 pid 7's record of `k` (its transaction aborted), 1 the ABORT marker,
    2 `x`, 3 `k` again: the live one."""
    directory = root / "orders-0"
    directory.mkdir(parents=True)
    aborted = encode_batch(
        [(b"k", b"aborted")], producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    marker = encode_txn_marker(7, 0, commit=False, coordinator_epoch=0, timestamp_ms=T0, base_offset=1)
    plain = [encode_batch([(key, b"v")], base_offset=offset) for offset, key in ((2, b"x"), (3, b"k"))]
    (directory / f"{0:020d}.log").write_bytes(b"".join([aborted, marker, *plain]))
    if txn_index:
        (directory / f"{0:020d}.txnindex").write_bytes(TXN_ENTRY.pack(0, 7, 0, 1, 0))
    (root / "cleaner-offset-checkpoint").write_text("0\n1\norders 0 4\n")
    if log_start is not None:
        (root / "log-start-offset-checkpoint").write_text(f"0\n1\norders 0 {log_start}\n")
    return directory


@pytest.mark.parametrize(
    ("txn_index", "log_start", "reported"),
    [(True, None, False), (False, None, True), (False, 1, False)],
    ids=["aborted-by-its-index", "index-lost", "below-the-log-start"],
)
def test_verify_reads_kafkas_cleaner_checkpoint_and_skips_records_no_reader_sees(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    txn_index: bool,
    log_start: int | None,
    reported: bool,
) -> None:
    directory = kafka_partition(tmp_path, txn_index=txn_index, log_start=log_start)

    status, lines, _ = run(capsys, "verify", str(tmp_path))

    corrupt = [line for line in lines if line.startswith("CORRUPT ")]
    if reported:
        position = sum(len(b) for b in kafka_batches(directory)[:3])
        assert status == 1
        assert corrupt == [
            f"CORRUPT {directory / f'{0:020d}.log'} position {position}: "
            "batch at offset 3: key b'k' has two live records below the cleaned point 4, at offsets 0 and 3: "
            "a cleaning keeps only a key's newest record there"
        ]
    else:
        assert (status, corrupt) == (0, [])


def kafka_batches(directory: Path) -> list[bytes]:
    data = (directory / f"{0:020d}.log").read_bytes()
    return [bytes(batch.buffer) for batch in iter_batches(data)]


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=5), min_size=1, max_size=30),
    chunk=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_live_key_check_reports_what_a_dict_of_keys_finds_whatever_the_chunking(
    batches: list[list[int]], chunk: int, seed: int
) -> None:
    """Records below the cleaned point, in runs merged as they grow: each repeat of a key is
    reported once, naming the key's previous offset, as a plain dict of keys says."""
    rng = random.Random(seed)
    encoded, offset = [], 0
    for keys in batches:
        records = [(b"key-%d" % key, None if rng.random() < 0.2 else b"v") for key in keys]
        if records:
            encoded.append(RecordBatch(encode_batch(records, base_offset=offset)))
        offset += max(len(records), 1) + rng.randrange(3)  # gaps between batches
    cleaned_to = rng.randrange(offset + 1)
    found: list[tuple[int, str]] = []
    check = LiveKeyCheck(
        cleaned_to,
        0,
        AbortedRanges(()),
        lambda _p, _q, _o, reason: found.append((0, reason)),
        chunk_records=chunk,
    )
    for batch in encoded:
        check.add(batch, "segment", 0)
    check.flush()

    newest: dict[bytes, int] = {}
    expected = []
    for batch in encoded:
        for record in batch.records():
            if record.offset >= cleaned_to:
                continue
            assert record.key is not None
            if record.key in newest:
                expected.append(f"at offsets {newest[record.key]} and {record.offset}:")
            newest[record.key] = record.offset
    assert len(found) == len(expected)
    for (_, reason), offsets in zip(found, expected, strict=True):
        assert offsets in reason


def test_live_key_check_skips_aborted_transactions_and_markers() -> None:
    found: list[str] = []
    check = LiveKeyCheck(100, 0, AbortedRanges([AbortedTxn(7, 0, 1, 0)]), lambda *a: found.append(a[3]))
    aborted = encode_batch(
        [(b"k", b"1")], producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    for data in (
        aborted,
        encode_txn_marker(7, 0, commit=False, coordinator_epoch=0, timestamp_ms=T0, base_offset=1),
        encode_txn_marker(8, 0, commit=True, coordinator_epoch=0, timestamp_ms=T0, base_offset=2),
        encode_batch([(b"k", b"2")], base_offset=3),
    ):
        check.add(RecordBatch(data), "segment", 0)
    check.flush()
    assert found == []
    check.add(RecordBatch(encode_batch([(b"k", b"3")], base_offset=4)), "segment", 0)
    check.flush()
    assert len(found) == 1 and "at offsets 3 and 4" in found[0]


# -- stat ---------------------------------------------------------------------------------------


def test_stat_reports_the_dirty_ratio_and_checkpoint_the_cleaner_would_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "orders-0"
    cleaned_to = compacted_log(directory)
    files = segments(directory)
    sealed = {int(path.name[:20]): path.stat().st_size for path in files[:-1]}
    dirty = sum(size for base, size in sealed.items() if base >= cleaned_to)
    assert 0 < dirty < sum(sealed.values())

    status, lines, _ = run(capsys, "stat", "--json", str(directory))

    assert status == 0
    (row,) = json.loads("\n".join(lines))
    assert row["cleaner_checkpoint"] == cleaned_to and row["compacted"] is True
    assert (row["cleanable_bytes"], row["dirty_bytes"]) == (sum(sealed.values()), dirty)
    assert row["dirty_ratio"] == pytest.approx(dirty / sum(sealed.values()))
    with Log.open(directory, CONFIG, clock=lambda: T0) as log:
        part = log.cleanable_part(now_ms=T0)
    assert (part.cleanable_bytes, part.dirty_bytes, part.first_dirty) == (
        row["cleanable_bytes"],
        row["dirty_bytes"],
        cleaned_to,
    )

    status, lines, _ = run(capsys, "stat", str(directory))

    assert lines[0].split()[-3:] == ["dirty", "cleaned", "to"]
    assert lines[1].split()[-2:] == [f"{dirty / sum(sealed.values()):.2f}", str(cleaned_to)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stat_on_a_narrow_terminal_prints_every_figure_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "orders-0"
    cleaned_to = compacted_log(directory)
    end = raw_batches(segments(directory)[-1])[-1].last + 1
    monkeypatch.setenv("COLUMNS", "80")  # too narrow for eleven columns, even with the topic folded
    out = Terminal()

    assert cli.main(["stat", str(directory)], out=out, err=io.StringIO()) == 0

    (row,) = [line.split() for line in out.getvalue().splitlines() if line.startswith("orders ")]
    assert row[5] == str(end) and row[-1] == str(cleaned_to)


def test_stat_shows_a_compact_topic_dirty_before_its_first_cleaning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    with LogManager.open(root, LogConfig(segment_bytes=1024), clock=lambda: T0) as manager:
        manager.set_topic_config("users", cleanup_policy="compact")
        for topic in ("users", "events"):
            log = manager.log(topic, 0)
            updates(log, 0, 20)
            log.flush()

    status, lines, _ = run(capsys, "stat", "--json", str(root))

    assert status == 0
    rows = {row["topic"]: row for row in json.loads("\n".join(lines))}
    assert (rows["users"]["cleanup_policy"], rows["users"]["compacted"]) == ("compact", True)
    assert (rows["events"]["cleanup_policy"], rows["events"]["compacted"]) == ("delete", False)
    assert rows["users"]["cleaner_checkpoint"] is None and rows["users"]["dirty_ratio"] == 1.0

    status, lines, _ = run(capsys, "stat", str(root))

    table = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert table["users"][-2:] == ["1.00", "-"]
    assert table["events"][-2:] == ["-", "-"]


def test_stat_reads_kafkas_cleaner_offset_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kafka_partition(tmp_path, txn_index=True)

    status, lines, _ = run(capsys, "stat", "--json", str(tmp_path))

    assert status == 0
    (row,) = json.loads("\n".join(lines))
    assert (row["cleaner_checkpoint"], row["compacted"], row["format"]) == (4, True, "kafka")
