"""Options and offset-range planning (pure: no Spark session)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable

from oncelog import LogConfig, LogManager
from oncelog.segments.batch import encode_batch
from oncelog.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    parse_offsets,
    read_options,
    write_options,
)
from oncelog.spark.planning import (
    DataLossError,
    OffsetRange,
    PartitionBounds,
    batch_ranges,
    partition_bounds,
    resolve,
    split_ranges,
)
from oncelog.spark.readers import (
    PACK_RECORDS,
    OncelogStreamReader,
    PackedRanges,
    RangePartition,
    cap_rows,
    pack_ranges,
    range_partitions,
    read_range,
)


def test_offsets_are_earliest_latest_or_kafkas_json() -> None:
    assert parse_offsets("earliest", "startingOffsets", "t", LATEST) == EARLIEST
    assert parse_offsets(" Latest ", "startingOffsets", "t", EARLIEST) == LATEST
    assert parse_offsets('{"t": {"0": 5, "3": -2}}', "startingOffsets", "t", EARLIEST) == {0: 5, 3: EARLIEST}
    assert parse_offsets(None, "startingOffsets", "t", EARLIEST) == EARLIEST


@pytest.mark.parametrize(
    "raw", ["soon", '{"other": {"0": 1}}', '{"t": {"x": 1}}', '{"t": {"0": -3}}', '{"t": [1]}', "[]"]
)
def test_malformed_offsets_name_the_option(raw: str) -> None:
    with pytest.raises(OptionError, match="startingOffsets"):
        parse_offsets(raw, "startingOffsets", "t", EARLIEST)


def test_read_options_defaults_and_checks() -> None:
    options = read_options({"path": "/r", "topic": "t"})
    assert (options.starting, options.ending, options.isolation, options.fail_on_data_loss) == (
        EARLIEST,
        LATEST,
        "read_committed",
        True,
    )
    assert read_options({"path": "/r", "topic": "t"}, streaming=True).starting == LATEST
    for bad, name in (
        ({"path": "/r"}, "topic"),
        ({"topic": "t"}, "path"),
        ({"path": "/r", "topic": "t", "failondataloss": "maybe"}, "failOnDataLoss"),
        ({"path": "/r", "topic": "t", "minpartitions": "0"}, "minPartitions"),
        ({"path": "/r", "topic": "t", "startingoffsets": "latest"}, "latest"),
    ):
        with pytest.raises(OptionError, match=name):
            read_options(bad)


def test_write_options_make_up_a_write_id_unless_given() -> None:
    made = write_options({"path": "/r", "topic": "t"})
    assert made.write_id.startswith("job-") and not made.user_write_id
    given_id = write_options({"path": "/r", "topic": "t", "writeid": "nightly-2026-11-22"})
    assert given_id.write_id == "nightly-2026-11-22" and given_id.user_write_id
    with pytest.raises(OptionError, match="writeId"):
        write_options({"path": "/r", "topic": "t", "writeid": "has space"})


def test_resolve_uses_the_partitions_bounds() -> None:
    bound = PartitionBounds(2, earliest=10, latest=50)
    assert resolve(EARLIEST, bound, LATEST) == 10
    assert resolve(LATEST, bound, EARLIEST) == 50
    assert resolve({2: 17}, bound, EARLIEST) == 17
    assert resolve({0: 17}, bound, LATEST) == 50


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1, max_size=6),
    st.integers(1, 20),
    st.integers(1, 3000),
)
def test_split_ranges_cover_every_offset_once_within_the_limits(
    spans: list[tuple[int, int]], min_partitions: int, max_records: int
) -> None:
    ranges = [OffsetRange(p, start, start + size) for p, (start, size) in enumerate(spans) if size]
    split = split_ranges(ranges, min_partitions, max_records)
    for whole in ranges:
        parts = [r for r in split if r.partition == whole.partition]
        assert parts[0].start == whole.start and parts[-1].end == whole.end
        assert all(a.end == b.start for a, b in itertools.pairwise(parts))
        assert all(0 < r.size <= max_records for r in parts)
    total = sum(r.size for r in ranges)
    if total >= min_partitions and ranges:
        assert len(split) >= min(min_partitions, total) - len(ranges)


def test_cap_rows_shares_the_cap_by_backlog() -> None:
    assert cap_rows({0: 0, 1: 0}, {0: 10, 1: 10}, 100) == {0: 10, 1: 10}
    assert cap_rows({0: 0, 1: 0}, {0: 300, 1: 100}, 100) == {0: 75, 1: 25}
    assert cap_rows({0: 5, 1: 7}, {0: 5, 1: 1007}, 10) == {0: 5, 1: 17}


# -- against a real root (no Spark session: the readers' methods are called directly) -------------
def _root_with_an_abort(tmp_path: Path, *, crashed: bool = False) -> Path:
    """A root whose t-0 holds before, an aborted transaction, after; `crashed`: a copy
    taken while the log was open, as a kill -9 leaves it (no snapshot at the end)."""
    root = tmp_path / "root"
    with LogManager.open(root, LogConfig(), progress=False) as manager:
        log = manager.log("t", 0)
        log.append(encode_batch([(None, b"before")]))
        txn = encode_batch(
            [(None, b"aborted")], producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True
        )
        log.append(txn)
        log.write_txn_marker(5, 0, commit=False, coordinator_epoch=0)
        log.append(encode_batch([(None, b"after")]))
        if crashed:
            shutil.copytree(root, tmp_path / "crashed")
    return tmp_path / "crashed" if crashed else root


def _values(options: ReadOptions, parts: list[RangePartition]) -> list[bytes]:
    return [v for part in parts for batch in read_range(options, part) for v in batch.column(1).to_pylist()]


def test_an_abort_whose_index_entry_is_missing_is_still_filtered(tmp_path: Path) -> None:
    # The writer appends the ABORT marker, then its .txnindex entry: a reader can find the
    # marker without the entry (a crash or a read in between). Planning saw the marker.
    root = _root_with_an_abort(tmp_path, crashed=True)
    for index in (root / "t-0").glob("*.txnindex"):
        index.write_bytes(b"")  # killed after the marker, before its index entry
    options = read_options({"path": str(root), "topic": "t"})
    bounds = partition_bounds(str(root), "t", "read_committed")
    parts = range_partitions(batch_ranges(options, bounds), {b.partition: b for b in bounds})
    assert _values(options, parts) == [b"before", b"after"]
    unplanned = [RangePartition(p.partition, p.start, p.end) for p in parts]
    assert b"aborted" in _values(options, unplanned)  # what the planner's list prevents


def test_a_stream_ahead_of_a_truncated_log_is_data_loss(tmp_path: Path) -> None:
    root = _root_with_an_abort(tmp_path)
    strict = OncelogStreamReader(read_options({"path": str(root), "topic": "t"}, streaming=True))
    with pytest.raises(DataLossError, match="log ends at 4"):
        strict.latestOffset({"t": {"0": 100}}, ReadAllAvailable())
    lenient = OncelogStreamReader(
        read_options({"path": str(root), "topic": "t", "failondataloss": "false"}, streaming=True)
    )
    assert lenient.latestOffset({"t": {"0": 100}}, ReadAllAvailable()) == {"t": {"0": 4}}
    assert [p.start for p in lenient.partitions({"t": {"0": 100}}, {"t": {"0": 4}})] == [0]


def test_offsets_lost_after_planning_are_skipped_only_when_allowed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LogManager.open(root, LogConfig(segment_bytes=1024), progress=False) as manager:
        log = manager.log("t", 0)
        for n in range(60):
            log.append(encode_batch([(None, b"v%d" % n)]))
        planned = RangePartition(0, 0, 60)
        log.delete_records(30)  # after planning, before the task reads
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        _values(read_options({"path": str(root), "topic": "t"}), [planned])
    lenient = read_options({"path": str(root), "topic": "t", "failondataloss": "false"})
    assert _values(lenient, [planned]) == [b"v%d" % n for n in range(30, 60)]


def test_small_ranges_are_read_several_to_a_task_large_ones_alone() -> None:
    parts = [
        RangePartition(p, 0, size) for p, size in enumerate([10, 20, PACK_RECORDS, 30, PACK_RECORDS - 40])
    ]
    tasks = pack_ranges(parts, 1_000_000, 1)
    assert tasks == [parts[2], PackedRanges((parts[0], parts[1], parts[3])), parts[4]]
    covered = sorted(
        (r.partition, r.start, r.end)
        for t in tasks
        for r in (t.ranges if isinstance(t, PackedRanges) else (t,))
    )
    assert covered == sorted((r.partition, r.start, r.end) for r in parts)
    assert all(
        sum(r.end - r.start for r in t.ranges) <= PACK_RECORDS for t in tasks if isinstance(t, PackedRanges)
    )
    assert sorted(map(repr, pack_ranges(parts, 15, 1))) == sorted(map(repr, parts))  # 15 bounds a pack
    assert pack_ranges(parts, 1_000_000, 5) == parts  # minPartitions wins over packing


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"t": {"0": true}}', "offset True of partition 0"),
        ('{"t": {"+1": 5}}', "partition '\\+1' is not a partition number"),
        ('{"t": {"01": 5}}', "partition '01' is not a partition number"),
        ('{"t": {" 1": 5}}', "partition ' 1' is not a partition number"),
        ('{"t": {"1": 5, "1": 6}}', "'1' is given twice"),
    ],
)
def test_json_offsets_are_read_strictly(raw: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_offsets(raw, "startingOffsets", "t", EARLIEST)


def test_sentinels_that_read_nothing_are_refused_per_partition_too() -> None:
    with pytest.raises(OptionError, match=r"startingOffsets \"latest\" \(-1\).*partitions \[1\]"):
        read_options({"path": "/r", "topic": "t", "startingoffsets": '{"t": {"0": 0, "1": -1}}'})
    with pytest.raises(OptionError, match="endingOffsets cannot be"):
        read_options({"path": "/r", "topic": "t", "endingoffsets": '{"t": {"0": -2}}'})
    streaming = read_options(
        {"path": "/r", "topic": "t", "startingoffsets": '{"t": {"0": -1}}'}, streaming=True
    )
    assert streaming.starting == {0: LATEST}


def test_integer_options_take_ascii_digits_only() -> None:
    with pytest.raises(OptionError, match="minPartitions must be an integer"):
        read_options({"path": "/r", "topic": "t", "minpartitions": "\u0967"})  # a Devanagari 1
    assert read_options({"path": "/r", "topic": "t", "minpartitions": " 3 "}).min_partitions == 3
