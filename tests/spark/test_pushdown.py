"""pushdown: which filters narrow the planned ranges, and that narrowing never changes a result.

Two properties over random conjunctions of Spark's filters and random rows:
- sound: every row that satisfies all the filters is still read;
- exact: every row read satisfies each filter that was not handed back to Spark.
(Pure: no Spark session; the filters are pyspark's own classes.)
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from oncelog.spark.pushdown import ScanBounds, push_filters

UTC = dt.UTC
T0_US = 1_700_000_000_000_000
COMPARISONS: dict[type[Filter], Callable[[Any, Any], bool]] = {
    EqualTo: operator.eq,
    EqualNullSafe: operator.eq,
    GreaterThan: operator.gt,
    GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt,
    LessThanOrEqual: operator.le,
}
Row = tuple[int, int, int]  # partition, offset, timestamp in microseconds (a whole millisecond)


def _stamp(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=us)


def holds(f: Filter, row: Row) -> bool:
    """What Spark would decide for this row (the reference)."""
    if isinstance(f, Not):
        return not holds(f.child, row)
    column = {"partition": row[0], "offset": row[1], "timestamp": _stamp(row[2])}[f.attribute[0]]
    if isinstance(f, In):
        return any(v is not None and column == v for v in f.value)
    return COMPARISONS[type(f)](column, f.value)


def kept(bounds: ScanBounds, row: Row) -> bool:
    """Whether planning reads the row: the timestamp bound is where the time-index search
    may start, so a row below it is skipped."""
    partition, offset, us = row
    if bounds.is_empty or not bounds.wants_partition(partition):
        return False
    start, end = bounds.narrow(offset, offset + 1)
    if end <= start:
        return False
    return bounds.timestamp_low_ms is None or us // 1000 >= bounds.timestamp_low_ms


ints = st.integers(-2, 12)
stamps = st.integers(-3, 12).map(lambda ms: _stamp(T0_US + ms * 1000 + (ms % 3) * 250))


@st.composite
def filters(draw: st.DrawFn) -> Filter:
    column = draw(st.sampled_from(["partition", "offset", "timestamp"]))
    values = stamps if column == "timestamp" else ints
    kind = draw(st.sampled_from([*COMPARISONS, In]))
    if kind is In:
        return In((column,), tuple(draw(st.lists(st.one_of(values, st.none()), max_size=4))))
    return kind((column,), draw(values))


rows = st.tuples(
    st.integers(0, 10), st.integers(0, 10), st.integers(-3, 12).map(lambda ms: T0_US + ms * 1000)
)


@given(conjunction=st.lists(filters(), max_size=5), table=st.lists(rows, max_size=40))
def test_narrowing_keeps_every_matching_row_and_exact_filters_hold_on_every_kept_row(
    conjunction: list[Filter], table: list[Row]
) -> None:
    bounds, left = push_filters(conjunction)
    assert all(any(f is g for g in conjunction) for f in left)  # by reference, as Spark checks
    pushed_exactly = [f for f in conjunction if not any(f is g for g in left)]
    for row in table:
        if all(holds(f, row) for f in conjunction):
            assert kept(bounds, row), (row, bounds)
        if kept(bounds, row):
            assert all(holds(f, row) for f in pushed_exactly), (row, pushed_exactly)


def test_partition_and_offset_comparisons_are_taken_whole() -> None:
    conjunction: list[Filter] = [
        EqualTo(("partition",), 3),
        GreaterThanOrEqual(("offset",), 10),
        LessThan(("offset",), 20),
    ]
    bounds, left = push_filters(conjunction)
    assert left == []
    assert [p for p in range(8) if bounds.wants_partition(p)] == [3]
    assert bounds.narrow(0, 100) == (10, 20)


def test_timestamp_lower_bounds_narrow_but_stay_with_spark() -> None:
    at = _stamp(T0_US + 1500)  # 1.5 ms past T0: a record at T0 + 1 ms is older
    conjunction: list[Filter] = [GreaterThanOrEqual(("timestamp",), at), LessThan(("timestamp",), at)]
    bounds, left = push_filters(conjunction)
    assert left == conjunction
    assert bounds.timestamp_low_ms == T0_US // 1000 + 1


def test_a_naive_datetime_is_local_time_as_pyspark_makes_it() -> None:
    local = dt.datetime.fromtimestamp((T0_US + 7000) / 1e6)  # how PySpark hands a timestamp over
    bounds, _ = push_filters([GreaterThan(("timestamp",), local)])
    assert bounds.timestamp_low_ms == T0_US // 1000 + 7


def test_what_is_not_understood_is_handed_back_untouched() -> None:
    conjunction: list[Filter] = [
        EqualTo(("partition",), 2.5),
        EqualTo(("partition",), True),
        GreaterThan(("offset",), "7"),
        In(("offset",), (1, "x")),
        Not(EqualTo(("partition",), 1)),
        IsNotNull(("key",)),
        StringStartsWith(("topic",), "a"),
        EqualTo(("value",), b"x"),
        LessThanOrEqual(("timestamp",), _stamp(T0_US)),
    ]
    bounds, left = push_filters(conjunction)
    assert left == conjunction and bounds == ScanBounds()


def test_contradictions_read_nothing() -> None:
    for conjunction in (
        [EqualTo(("partition",), 1), EqualTo(("partition",), 2)],
        [In(("partition",), ())],
        [GreaterThan(("offset",), 5), LessThan(("offset",), 6)],
        [In(("offset",), (None,))],
    ):
        bounds, _ = push_filters(conjunction)
        assert bounds.is_empty or not any(bounds.wants_partition(p) for p in range(10)), conjunction
