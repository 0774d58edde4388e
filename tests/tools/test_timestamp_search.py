"""timestamp_search: where records at or after a timestamp can start, from the time indexes.

The oracle walks every stored batch of the range (read_batches) and finds the first
whose max timestamp reaches the target. The search must give that batch's offset:
never later (a row would be lost to a Spark `timestamp >= T` filter) and never
earlier than the first batch that can match (the pushdown would not narrow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.config import LogConfig
from oncelog.layout import parse_partition_dir_name
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.segments.records import Record
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_reader import read_batches
from oncelog.tools.partition_stat import stat_partition
from oncelog.tools.timestamp_search import first_offset_at_timestamp
from tests.kafka_fixtures import kafka_fixtures_root

T0 = 1_700_000_000_000
# Small segments and a dense index: searches cross sealed segments and start from entries.
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=200)


def _oracle(directory: Path, timestamp_ms: int, start: int, end: int) -> int:
    for batch in read_batches(None, str(directory), start, end):
        if batch.header.max_timestamp >= timestamp_ms:
            return max(start, batch.header.base_offset)
    return end


def _batch(stamps: list[int], value: bytes = b"v" * 40) -> bytes:
    return encode_batch([Record(i, ts, None, value) for i, ts in enumerate(stamps)])


def _write(directory: Path, stamps: list[list[int]]) -> int:
    with Log.open(directory, CONFIG) as log:
        for batch_stamps in stamps:
            log.append(_batch(batch_stamps))
        return log.log_end_offset


def test_rising_timestamps_start_at_the_first_batch_that_reaches_the_target(tmp_path: Path) -> None:
    stamps = [[T0 + 10 * b + i for i in range(3)] for b in range(200)]
    end = _write(tmp_path / "t-0", stamps)
    assert len(list((tmp_path / "t-0").glob("*.log"))) > 5  # sealed segments to skip
    for target in (T0 - 1, T0, T0 + 2, T0 + 3, T0 + 1000, T0 + 1992, T0 + 1993, T0 + 5000):
        found = first_offset_at_timestamp(None, str(tmp_path / "t-0"), target, 0, end)
        assert found == _oracle(tmp_path / "t-0", target, 0, end), target
    assert first_offset_at_timestamp(None, str(tmp_path / "t-0"), T0 + 1000, 0, end) == 300
    assert first_offset_at_timestamp(None, str(tmp_path / "t-0"), T0 + 5000, 0, end) == end


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stamps=st.lists(
        st.lists(st.integers(0, 500), min_size=1, max_size=4).map(lambda ds: [T0 + d for d in ds]),
        min_size=1,
        max_size=80,
    ),
    target=st.integers(-5, 505).map(lambda d: T0 + d),
    cut=st.tuples(st.integers(0, 400), st.integers(0, 400)),
)
def test_clients_clocks_in_any_order_never_start_past_a_matching_record(
    tmp_path_factory: pytest.TempPathFactory, stamps: list[list[int]], target: int, cut: tuple[int, int]
) -> None:
    directory = tmp_path_factory.mktemp("ts") / "t-0"
    end = _write(directory, stamps)
    start, stop = sorted((min(cut[0], end), min(cut[1], end)))
    found = first_offset_at_timestamp(None, str(directory), target, start, stop)
    assert found == _oracle(directory, target, start, stop)
    every = [ts for batch in stamps for ts in batch]  # by offset
    assert all(ts < target for ts in every[start:found])  # nothing skipped could match


def test_an_empty_range_or_log_is_its_end(tmp_path: Path) -> None:
    end = _write(tmp_path / "t-0", [[T0]])
    assert first_offset_at_timestamp(None, str(tmp_path / "t-0"), T0, 1, 1) == 1
    assert end == 1
    (tmp_path / "e-0").mkdir()
    assert first_offset_at_timestamp(None, str(tmp_path / "e-0"), T0, 0, 5) == 5


def test_a_live_writers_active_segment_is_searched_while_it_appends(tmp_path: Path) -> None:
    with Log.open(tmp_path / "t-0", CONFIG) as log:
        for b in range(30):
            log.append(_batch([T0 + b]))
        end = log.log_end_offset
        found = first_offset_at_timestamp(None, str(tmp_path / "t-0"), T0 + 29, 0, end)
        log.append(_batch([T0 + 99]))
    assert found == 29


def test_real_kafka_partitions_agree_with_a_full_scan() -> None:
    fixtures = kafka_fixtures_root()
    directories = sorted(p.parent for p in fixtures.glob("*/*/*.timeindex"))
    assert directories, f"no Kafka fixtures under {fixtures}"
    checked = 0
    for directory in directories:
        batches = list(read_batches(None, str(directory), *_extent(directory)))
        if not batches:
            continue
        start, end = _extent(directory)
        stamps = sorted({b.header.max_timestamp for b in batches})
        for target in {stamps[0], stamps[len(stamps) // 2], stamps[-1], stamps[-1] + 1}:
            assert first_offset_at_timestamp(None, str(directory), target, start, end) == _oracle(
                directory, target, start, end
            ), (directory, target)
            checked += 1
    assert checked > 10


def _extent(directory: Path) -> tuple[int, int]:
    tp = parse_partition_dir_name(directory.name)
    assert tp is not None
    partition = Partition(str(directory), tp, str(directory.parent))
    stat = stat_partition(ReadOnlyFileSystem(DEFAULT_FS), partition, {})
    return stat.log_start_offset, stat.log_end_offset
