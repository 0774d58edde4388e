"""Record codec: oncelog against kafka-python's pure-Python v2 codec (brief §11).

Each group pairs an oncelog operation with kafka-python doing the same work on the
same records, so the ratio can be read off one table. Building is 100 records
appended then one batch built; decoding iterates those records and reads each
key and value. The target shape is 100 null-key records of 100-byte values; the
keyed shape adds an 8-byte key and two headers per record.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka.record.default_records import DefaultRecordBatch
from pytest_benchmark.fixture import BenchmarkFixture

from oncelog.bench.references import kafka_python_batch
from oncelog.segments import RecordBatch, encode_batch

BATCHES_PER_ROUND = 200
ROUNDS = 10
TIMESTAMP_MS = 1_700_000_000_000

Spec = tuple[bytes | None, bytes, list[tuple[str, bytes | None]]]
SHAPES: dict[str, list[Spec]] = {
    "100x100B": [(None, b"v" * 100, []) for _ in range(100)],
    "100x100B keyed, 2 headers": [
        (b"key-%04d" % i, b"v" * 100, [("trace", b"0123456789abcdef"), ("retry", None)]) for i in range(100)
    ],
}


def _ours(specs: list[Spec]) -> list[object]:
    """The records as a producer hands them to encode_batch."""
    return [(key, value, headers) if headers else (key, value) for key, value, headers in specs]


def _kafka_python_build(specs: list[Spec]) -> bytes:
    return kafka_python_batch(specs, TIMESTAMP_MS)


def _oncelog_build(records: list[object]) -> bytes:
    return encode_batch(records, timestamp_ms=TIMESTAMP_MS, partition_leader_epoch=0)


def _kafka_python_decode(buf: bytes) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in DefaultRecordBatch(buf)]


def _oncelog_decode(buf: bytes) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in RecordBatch(buf).records()]


def _repeat(operation: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(BATCHES_PER_ROUND):
            operation()

    return run


def test_both_codecs_agree_on_the_benchmarked_batches() -> None:
    for specs in SHAPES.values():
        ours = _oncelog_build(_ours(specs))
        assert ours == _kafka_python_build(specs)
        expected = [(key, value) for key, value, _ in specs]
        assert _oncelog_decode(ours) == _kafka_python_decode(ours) == expected


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_oncelog(benchmark: BenchmarkFixture, shape: str) -> None:
    records = _ours(SHAPES[shape])
    benchmark.group = f"encode {shape}"
    benchmark.pedantic(_repeat(lambda: _oncelog_build(records)), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_reference_kafka_python(benchmark: BenchmarkFixture, shape: str) -> None:
    specs = SHAPES[shape]
    benchmark.group = f"encode {shape}"
    benchmark.pedantic(_repeat(lambda: _kafka_python_build(specs)), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_oncelog(benchmark: BenchmarkFixture, shape: str) -> None:
    buf = _kafka_python_build(SHAPES[shape])
    benchmark.group = f"decode {shape}"
    benchmark.pedantic(_repeat(lambda: _oncelog_decode(buf)), rounds=ROUNDS, warmup_rounds=1)


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_reference_kafka_python(benchmark: BenchmarkFixture, shape: str) -> None:
    buf = _kafka_python_build(SHAPES[shape])
    benchmark.group = f"decode {shape}"
    benchmark.pedantic(_repeat(lambda: _kafka_python_decode(buf)), rounds=ROUNDS, warmup_rounds=1)
