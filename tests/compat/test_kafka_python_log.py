"""kafka-python-built batches go through Log.append and come back with log offsets.

The acceptance test of issue 2: batches from kafka-python's DefaultRecordBatchBuilder
(random producer ids, epochs, sequences, null keys and values, headers, 1-500
records) are appended, read back, and must decode identically in oncelog and in
kafka-python, with the offsets the log assigned.
"""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from oncelog import Log, LogConfig
from oncelog.bench.references import kafka_python_batch
from oncelog.segments import Record

Header = tuple[str, bytes | None]
Spec = tuple[bytes | None, bytes | None, list[Header]]

nullable_bytes = st.none() | st.binary(max_size=16)
record_specs = st.tuples(
    nullable_bytes, nullable_bytes, st.lists(st.tuples(st.text(max_size=6), nullable_bytes), max_size=3)
)
batch_specs = st.tuples(
    st.lists(record_specs, min_size=1, max_size=20)
    | st.integers(400, 500).map(lambda n: [(b"k", b"v" * (n % 7), [])] * n),
    st.integers(0, 32767),  # producer epoch
    st.integers(0, 2**31 - 1),  # base sequence
    st.booleans(),  # idempotent (a producer id) or not
)


def build(specs: list[Spec], producer_id: int, epoch: int, sequence: int, base_offset: int) -> bytes:
    raw = bytearray(
        kafka_python_batch(
            specs,
            [1_700_000_000_000 + delta for delta in range(len(specs))],
            producer_id=producer_id,
            producer_epoch=epoch if producer_id >= 0 else -1,
            base_sequence=sequence if producer_id >= 0 else -1,
        )
    )
    # A client's base offset is meaningless to the log: make it wrong on purpose.
    raw[0:8] = base_offset.to_bytes(8, "big")
    return bytes(raw)


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(batch_specs, min_size=1, max_size=4), client_base=st.integers(0, 2**40))
def test_kafka_python_batches_append_and_read_back_with_log_offsets(
    batches: list[tuple[list[Spec], int, int, bool]], client_base: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = Log.open(directory, LogConfig(segment_bytes=16 * 1024, index_interval_bytes=256))
        expected: list[Record] = []
        for n, (specs, epoch, sequence, idempotent) in enumerate(batches):
            producer_id = 1000 + n if idempotent else -1  # distinct producers: no sequence conflicts
            result = log.append(build(specs, producer_id, epoch, sequence, client_base))
            base = len(expected)
            assert result.first_offset == base
            assert result.last_offset == base + len(specs) - 1
            expected.extend(
                Record(base + delta, 1_700_000_000_000 + delta, key, value, tuple(headers))
                for delta, (key, value, headers) in enumerate(specs)
            )
        assert log.log_end_offset == len(expected)

        ours: list[Record] = []
        theirs: list[Record] = []
        offset = 0
        while offset < log.log_end_offset:
            fetched = log.read(offset, max_bytes=4096)
            for batch in fetched.batches:
                batch.validate()
                ours.extend(batch.records())
                kafka_batch = DefaultRecordBatch(batch.buffer.tobytes())
                assert kafka_batch.validate_crc()
                assert kafka_batch.base_offset == batch.base_offset
                theirs.extend(
                    Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in kafka_batch
                )
            offset = fetched.next_offset
        log.close()
        assert ours == expected
        assert theirs == expected
