"""The single-batch route of Log.append equals the request route (issue 6).

`append(b)` skips the request machinery that `append_batches([b])` runs; both
must accept, refuse and store exactly the same. A hypothesis-generated stream of
good and bad batches goes to one log through each path; every outcome, the
stored bytes and the producer state must agree.
"""

from __future__ import annotations

from pathlib import Path

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_helpers import stored_batches

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import encode_batch

T0 = 1_700_000_000_000
# Small segments and index intervals, so rolls and index entries happen mid-stream.
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=300, max_batch_bytes=900)


def spoil(data: bytes, how: str) -> bytes:
    out = bytearray(data)
    if how == "crc":
        out[-1] ^= 0x01
    elif how == "magic":
        out[16] = 1
    elif how == "count":
        out[57:61] = (2).to_bytes(4, "big")  # recordsCount 2 with lastOffsetDelta 0
        out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    elif how == "control":
        out[22] |= 0x20
        out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    elif how == "short":
        del out[-3:]
    elif how == "zero-body":  # issue 15: a right CRC over records that do not decode
        out[61:] = bytes(len(out) - 61)
        out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    elif how == "count-past-body":  # recordsCount 2^31-1 (lastOffsetDelta to match) over the records
        out[23:27] = (2**31 - 2).to_bytes(4, "big")
        out[57:61] = (2**31 - 1).to_bytes(4, "big")
        out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


batch_specs = st.tuples(
    st.sampled_from([-1, 1, 2]),  # producer id
    st.integers(0, 2),  # epoch
    st.integers(0, 8),  # base sequence
    st.integers(1, 3),  # records
    st.integers(1, 400),  # value bytes (above 900 in total: too large)
    st.sampled_from(
        ["ok", "ok", "ok", "ok", "crc", "magic", "count", "control", "short", "zero-body", "count-past-body"]
    ),
    st.integers(0, 10**7),  # timestamp offset
)


def build(spec: tuple[int, int, int, int, int, str, int]) -> bytes:
    pid, epoch, sequence, records, value_bytes, how, ts = spec
    data = encode_batch(
        [(b"k", b"v" * value_bytes)] * records,
        producer_id=pid,
        producer_epoch=epoch if pid >= 0 else -1,
        base_sequence=sequence if pid >= 0 else -1,
        timestamp_ms=T0 + ts,
    )
    return data if how == "ok" else spoil(data, how)


def outcome(log: Log, data: bytes, single: bool) -> object:
    try:
        return log.append(data) if single else log.append_batches([data])[0]
    except Exception as exc:  # the error class is the outcome compared
        return type(exc).__name__


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(batch_specs, min_size=1, max_size=40))
def test_append_and_append_batches_agree_on_every_outcome_byte_and_producer(
    tmp_path_factory: object, specs: list[tuple[int, int, int, int, int, str, int]]
) -> None:
    root = Path(tmp_path_factory.mktemp("single"))  # type: ignore[attr-defined]
    clock = lambda: T0  # noqa: E731 - a fixed broker clock for both logs
    single = Log.open(root / "single-0", CONFIG, clock=clock)
    slow = Log.open(root / "slow-0", CONFIG, clock=clock)
    try:
        for spec in specs:
            data = build(spec)
            assert outcome(single, data, True) == outcome(slow, data, False), spec
        assert stored_batches(single) == stored_batches(slow)
        assert [s.base_offset for s in single.segments] == [s.base_offset for s in slow.segments]
        assert list(single.producers()) == list(slow.producers())
    finally:
        single.close()
        slow.close()
