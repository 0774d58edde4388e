"""Options and offset-range planning (pure: no Spark session)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.spark.options import EARLIEST, LATEST, OptionError, parse_offsets, read_options, write_options
from oncelog.spark.planning import OffsetRange, PartitionBounds, resolve, split_ranges
from oncelog.spark.readers import cap_rows


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
