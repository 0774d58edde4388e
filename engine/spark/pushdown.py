"""Which of Spark's filters narrow a read's planned offset ranges, and which stay with Spark.

Spark hands a batch read the conjuncts of its WHERE clause (`pushFilters`, pyspark
4.1+, with `spark.sql.python.filterPushdown.enabled`); the reader keeps what it can
apply while planning and returns the rest, which Spark then evaluates on every row.

| column      | operators                    | what planning does                     | exact |
|-------------|------------------------------|----------------------------------------|-------|
| `partition` | = <=> < <= > >= IN           | reads only the matching partitions     | yes   |
| `offset`    | = <=> < <= > >=              | cuts every range to [low, high)        | yes   |
| `offset`    | IN                           | cuts every range to [min, max]         | no    |
| `timestamp` | > >= = <=> IN                | starts each partition at the first     | no    |
|             |                              | batch whose max timestamp can match    |       |

Exact means every row of the narrowed ranges satisfies the filter: the readers drop
records outside [start, end) even inside a stored batch. `push_filters` returns the
inexact ones as Spark's to evaluate; the reader hands back every filter all the same
(readers.OncelogFilteringReader says why). Timestamps are not ordered
by offset (clients stamp them), so only a lower bound can be found, from the time
indexes as ListOffsets does; the filter stays with Spark. An upper timestamp bound
says nothing about offsets and is handed back untouched, as is anything else (other
columns, NOT, string filters, values of an unexpected type). Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_MICROSECOND = dt.timedelta(microseconds=1)
_EQUALS = (EqualTo, EqualNullSafe)


@dataclass(frozen=True)
class ScanBounds:
    """What the pushed filters allow, as the conjunction of all of them."""

    partitions: frozenset[int] | None = None  # None: every partition
    partition_low: int | None = None  # inclusive
    partition_high: int | None = None  # inclusive
    offset_low: int | None = None  # inclusive
    offset_high: int | None = None  # exclusive
    timestamp_low_ms: int | None = None  # no row below this can match (a lower bound, not exact)

    def wants_partition(self, partition: int) -> bool:
        if self.partitions is not None and partition not in self.partitions:
            return False
        if self.partition_low is not None and partition < self.partition_low:
            return False
        return self.partition_high is None or partition <= self.partition_high

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) cut to the offset bounds (empty when end <= start)."""
        if self.offset_low is not None:
            start = max(start, self.offset_low)
        if self.offset_high is not None:
            end = min(end, self.offset_high)
        return start, end

    @property
    def is_empty(self) -> bool:
        """No row can match: a contradiction among the pushed filters."""
        low, high = self.partition_low, self.partition_high
        return (
            (self.partitions is not None and not self.partitions)
            or (low is not None and high is not None and low > high)
            or (
                self.offset_low is not None
                and self.offset_high is not None
                and self.offset_low >= self.offset_high
            )
        )


def push_filters(filters: Sequence[Filter]) -> tuple[ScanBounds, list[Filter]]:
    """The bounds the filters allow, and the filters Spark must still evaluate (by reference)."""
    bounds = ScanBounds()
    left: list[Filter] = []
    for f in filters:
        narrowed, exact = _push_one(bounds, f)
        if narrowed is None or not exact:
            left.append(f)
        if narrowed is not None:
            bounds = narrowed
    return bounds, left


def _push_one(bounds: ScanBounds, f: Filter) -> tuple[ScanBounds | None, bool]:
    """(the narrowed bounds, whether the filter is applied exactly); None: not pushed."""
    attribute = getattr(f, "attribute", None)
    if attribute == ("partition",):
        return _push_partition(bounds, f), True
    if attribute == ("offset",):
        return _push_offset(bounds, f), not isinstance(f, In)
    if attribute == ("timestamp",):
        return _push_timestamp(bounds, f), False
    return None, False


def _ints(values: Iterable[Any]) -> list[int] | None:
    """The values as ints, nulls left out (a null never matches); None if any is not an int."""
    out = []
    for value in values:
        if value is None:
            continue
        if type(value) is not int:  # bool is an int subclass; a float or decimal is not pushed
            return None
        out.append(value)
    return out


def _int_bounds(f: Filter) -> tuple[int | None, int | None, frozenset[int] | None] | None:
    """(inclusive low, inclusive high, set) an int filter allows; None if it is not one we take."""
    if isinstance(f, In):
        values = _ints(f.value)
        return None if values is None else (None, None, frozenset(values))
    value = getattr(f, "value", None)
    if type(value) is not int:
        return None
    if isinstance(f, _EQUALS):
        return value, value, None
    if isinstance(f, GreaterThan):
        return value + 1, None, None
    if isinstance(f, GreaterThanOrEqual):
        return value, None, None
    if isinstance(f, LessThan):
        return None, value - 1, None
    if isinstance(f, LessThanOrEqual):
        return None, value, None
    return None


def _tighter(current: int | None, new: int | None, pick: Any) -> int | None:
    if new is None:
        return current
    return new if current is None else pick(current, new)


def _push_partition(bounds: ScanBounds, f: Filter) -> ScanBounds | None:
    found = _int_bounds(f)
    if found is None:
        return None
    low, high, values = found
    if values is not None:
        merged = values if bounds.partitions is None else bounds.partitions & values
        return replace(bounds, partitions=merged)
    return replace(
        bounds,
        partition_low=_tighter(bounds.partition_low, low, max),
        partition_high=_tighter(bounds.partition_high, high, min),
    )


def _push_offset(bounds: ScanBounds, f: Filter) -> ScanBounds | None:
    found = _int_bounds(f)
    if found is None:
        return None
    low, high, values = found
    if values is not None:
        if not values:
            return replace(bounds, offset_low=0, offset_high=0)
        low, high = min(values), max(values)
    return replace(
        bounds,
        offset_low=_tighter(bounds.offset_low, low, max),
        offset_high=_tighter(bounds.offset_high, None if high is None else high + 1, min),
    )


def _push_timestamp(bounds: ScanBounds, f: Filter) -> ScanBounds | None:
    if isinstance(f, In):
        stamps = [v for v in f.value if v is not None]
        if not stamps or not all(isinstance(v, dt.datetime) for v in stamps):
            return None
        lowest = min(_micros(v) for v in stamps)
    elif isinstance(f, (*_EQUALS, GreaterThan, GreaterThanOrEqual)) and isinstance(f.value, dt.datetime):
        lowest = _micros(f.value)
    else:
        return None  # an upper bound (<, <=) says nothing about offsets
    # Records carry milliseconds: a record at ms m matches `>= T` (µs) only if m * 1000 >= T,
    # so m >= floor(T / 1000); `>` and `=` need at least as much.
    return replace(bounds, timestamp_low_ms=_tighter(bounds.timestamp_low_ms, lowest // 1000, max))


def _micros(value: dt.datetime) -> int:
    """Microseconds since the epoch, exactly. A naive datetime is local time, as PySpark makes
    one from a timestamp (datetime.fromtimestamp), so it converts back the same way."""
    aware = value if value.tzinfo is not None else value.astimezone()
    return (aware - _EPOCH) // _ONE_MICROSECOND
