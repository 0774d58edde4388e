"""roll_needed: Kafka's roll rules, the one function both append paths call."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog import InvalidRecordError, Log, LogConfig, encode_batch
from oncelog.log import roll_needed
from oncelog.segments import format as fmt

LIMIT = 10 + fmt.INT32_MAX  # a segment based at offset 10 with room in its indexes
MAX_BYTES, SEGMENT_MS = 1000, 60_000


@pytest.mark.parametrize(
    ("segment_bytes", "first_ts", "incoming", "max_ts", "last", "limit", "rolls", "why"),
    [
        (0, None, 5000, 0, 20, LIMIT, False, "an empty segment takes any batch, however large"),
        (0, None, 10, 0, LIMIT + 1, LIMIT, True, "even an empty segment: offsets past the i32 range"),
        (900, 0, 100, 0, 20, LIMIT, False, "exactly full is not over"),
        (900, 0, 101, 0, 20, LIMIT, True, "over segment_bytes"),
        (10, 0, 10, SEGMENT_MS, 20, LIMIT, False, "exactly segment_ms after the first batch"),
        (10, 0, 10, SEGMENT_MS + 1, 20, LIMIT, True, "past segment_ms after the first batch"),
        (10, 5_000, 10, 0, 20, LIMIT, False, "an older timestamp never rolls"),
        (10, 0, 10, 0, 20, -1, True, "full indexes (the limit drops to -1)"),
        (10, 0, 10, 0, fmt.MAX_OFFSET + 1, fmt.MAX_OFFSET, True, "past the largest i64 log end"),
    ],
)
def test_the_roll_rule(
    segment_bytes: int,
    first_ts: int | None,
    incoming: int,
    max_ts: int,
    last: int,
    limit: int,
    rolls: bool,
    why: str,
) -> None:
    assert (
        roll_needed(segment_bytes, first_ts, incoming, max_ts, last, limit, MAX_BYTES, SEGMENT_MS) is rolls
    ), why


def test_a_client_batch_into_an_empty_segment_at_the_top_of_the_offset_range_is_refused(
    tmp_path: Path,
) -> None:
    # The fast path once skipped the roll rule for an empty segment and took offsets past 2**63-1.
    log = Log.open(tmp_path / "p-0", LogConfig(), clock=lambda: 1_700_000_000_000)
    try:
        log.append(
            encode_batch([(b"k", b"v")], base_offset=fmt.MAX_OFFSET - 3, timestamp_ms=1), origin="replication"
        )
        log.roll()
        assert log.active_segment.size == 0
        with pytest.raises(InvalidRecordError, match="past the largest"):
            log.append(encode_batch([(b"k", b"v")] * 5, timestamp_ms=1))
        assert log.log_end_offset == fmt.MAX_OFFSET - 2
        assert log.append(encode_batch([(b"k", b"v")] * 3, timestamp_ms=1)).last_offset == fmt.MAX_OFFSET
    finally:
        log.close()
