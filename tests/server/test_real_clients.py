"""Three real, unmodified Kafka clients against `oncelog serve`: confluent-kafka, kafka-python, aiokafka.

Each client produces idempotently (acks=all) with every compression codec it has,
keyed records with headers and explicit CreateTime timestamps, then reads them back
with assign() (no group, no commits) in both isolation levels and checks every key,
value, header, offset and timestamp. Each client also looks offsets up by time and
reads the watermarks, and what one client writes the other two read byte for byte.

Every scenario writes its own topic on the module's one server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response, encode_request, request_body

Client = Literal["confluent", "kafka-python", "aiokafka"]
Isolation = Literal["read_uncommitted", "read_committed"]
CLIENTS: Final[tuple[Client, ...]] = ("confluent", "kafka-python", "aiokafka")
CODECS: Final = ("none", "gzip", "snappy", "lz4", "zstd")
# The codec id a v2 batch carries in attribute bits 0-2.
CODEC_IDS: Final = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ISOLATIONS: Final[tuple[Isolation, ...]] = ("read_uncommitted", "read_committed")
CODEC_BY_ISOLATION: Final = [
    pytest.param(codec, isolation, id=f"{codec}-{isolation}") for codec in CODECS for isolation in ISOLATIONS
]

# Records per scenario; small batches so each scenario spans several batches (and sequences).
COUNT: Final = 120
BATCH_BYTES: Final = 2048
# CreateTime of record i is BASE_TS_MS + i * TS_STEP_MS; the gaps let a lookup fall between records.
BASE_TS_MS: Final = 1_700_000_000_000
TS_STEP_MS: Final = 10
TIMEOUT_S: Final = 15.0
PARTITION: Final = 0

_topic_numbers = itertools.count()


@dataclass(frozen=True, slots=True)
class Record:
    """A record as a producer sends it and as a consumer must see it at `offset`."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


def unique_topic(scenario: str) -> str:
    return f"real-{scenario}-{next(_topic_numbers)}"


def scenario_records(count: int = COUNT, *, seed: int = 7) -> list[Record]:
    """Keyed records with two headers each, compressible and incompressible values, known CreateTimes."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        # Half repeated text, half random bytes with a run after them: every batch, however the
        # client cuts them, still shrinks when compressed, so no client falls back to sending it raw.
        value = (b"value-%05d|" % i) * 8 if i % 2 == 0 else rng.randbytes(32 + i % 17) + b"." * 128
        headers = (("index", str(i).encode()), ("bin", bytes([i % 256, 0, 255])))
        records.append(Record(i, b"key-%05d" % i, value, headers, BASE_TS_MS + i * TS_STEP_MS))
    return records


def edge_records() -> list[Record]:
    """Records a byte-for-byte comparison should notice: every byte value, empty and null parts."""
    rng = random.Random(99)
    parts: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = [
        (bytes(range(256)), bytes(range(255, -1, -1)), (("all-bytes", bytes(range(256))),)),
        (b"empty-value", b"", (("empty", b""),)),
        (None, b"no key", ()),
        (b"tombstone", None, (("why", b"deleted"),)),
        (b"\x00", b"\x00\x00\x00", (("nul", b"\x00"), ("nul", b"\x00\x01"))),
        (b"unicode", "naïve ☃ 日本".encode(), (("ключ", "значение".encode()),)),
        (b"large", rng.randbytes(64 * 1024), (("size", b"65536"),)),
        (b"repeated", b"z" * 100_000, ()),
    ]
    return [
        Record(i, key, value, headers, BASE_TS_MS + 1000 * i) for i, (key, value, headers) in enumerate(parts)
    ]


# -- producers: each returns the offsets its delivery reports gave, in send order -----------------


def produce_confluent(bootstrap: str, topic: str, records: Sequence[Record], codec: str) -> list[int]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
            "batch.size": BATCH_BYTES,
        }
    )
    reports: list[tuple[KafkaError | None, int]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg.offset() if err is None else -1))

    for record in records:
        producer.produce(
            topic,
            value=record.value,
            key=record.key,
            partition=PARTITION,
            headers=list(record.headers),
            timestamp=record.timestamp_ms,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "confluent: records still undelivered"
    assert [err for err, _ in reports if err is not None] == []
    return [offset for _, offset in reports]


def produce_kafka_python(bootstrap: str, topic: str, records: Sequence[Record], codec: str) -> list[int]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        compression_type=None if codec == "none" else codec,
        linger_ms=5,
        batch_size=BATCH_BYTES,
        request_timeout_ms=int(TIMEOUT_S * 1000),
    )
    try:
        futures = [
            producer.send(
                topic,
                value=record.value,
                key=record.key,
                partition=PARTITION,
                headers=list(record.headers),
                timestamp_ms=record.timestamp_ms,
            )
            for record in records
        ]
        producer.flush(TIMEOUT_S)
        offsets: list[int] = [future.get(timeout=TIMEOUT_S).offset for future in futures]
    finally:
        producer.close(timeout=5)
    return offsets


def produce_aiokafka(bootstrap: str, topic: str, records: Sequence[Record], codec: str) -> list[int]:
    async def run() -> list[int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
            max_batch_size=BATCH_BYTES,
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    value=record.value,
                    key=record.key,
                    partition=PARTITION,
                    headers=list(record.headers),
                    timestamp_ms=record.timestamp_ms,
                )
                for record in records
            ]
            metadata = await asyncio.wait_for(asyncio.gather(*futures), TIMEOUT_S)
        finally:
            await producer.stop()
        return [m.offset for m in metadata]

    return asyncio.run(run())


# -- consumers: assign() partition 0 from the beginning, no group, no commits ------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    """What a consumer read: the record, and whether its timestamp is a CreateTime."""

    record: Record
    create_time: bool


def consume_confluent(bootstrap: str, topic: str, count: int, isolation: Isolation) -> list[Seen]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{topic}",  # required by the client; assign() never joins it
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 100,
        }
    )
    seen: list[Seen] = []
    try:
        consumer.assign([ConfluentTopicPartition(topic, PARTITION, OFFSET_BEGINNING)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(seen) < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=count - len(seen), timeout=0.5):
                assert msg.error() is None, f"confluent consumer: {msg.error()}"
                kind, timestamp = msg.timestamp()
                headers = tuple((name, value) for name, value in msg.headers() or ())
                record = Record(msg.offset(), msg.key(), msg.value(), headers, timestamp)
                seen.append(Seen(record, kind == TIMESTAMP_CREATE_TIME))
    finally:
        consumer.close()
    return seen


def consume_kafka_python(bootstrap: str, topic: str, count: int, isolation: Isolation) -> list[Seen]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=isolation,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    seen: list[Seen] = []
    try:
        tp = KafkaTopicPartition(topic, PARTITION)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + TIMEOUT_S
        while len(seen) < count and time.monotonic() < deadline:
            for msg in consumer.poll(timeout_ms=500).get(tp, []):
                headers = tuple((name, value) for name, value in msg.headers or ())
                record = Record(msg.offset, msg.key, msg.value, headers, msg.timestamp)
                seen.append(Seen(record, msg.timestamp_type == 0))
    finally:
        consumer.close()
    return seen


def consume_aiokafka(bootstrap: str, topic: str, count: int, isolation: Isolation) -> list[Seen]:
    async def run() -> list[Seen]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        seen: list[Seen] = []
        try:
            tp = AioTopicPartition(topic, PARTITION)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + TIMEOUT_S
            while len(seen) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(tp, timeout_ms=500)
                for msg in batches.get(tp, []):
                    headers = tuple((name, value) for name, value in msg.headers or ())
                    record = Record(msg.offset, msg.key, msg.value, headers, msg.timestamp)
                    seen.append(Seen(record, msg.timestamp_type == 0))
        finally:
            await consumer.stop()
        return seen

    return asyncio.run(run())


# -- offsets by time and watermarks: (beginning, end, offset found for each timestamp or None) ------


@dataclass(frozen=True, slots=True)
class OffsetAnswers:
    beginning: int
    end: int
    # The offset found for each timestamp asked about; None where the client says "no such record".
    by_time: list[int | None]


def offsets_confluent(
    bootstrap: str, topic: str, isolation: Isolation, times: Sequence[int]
) -> OffsetAnswers:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{topic}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(
            ConfluentTopicPartition(topic, PARTITION), timeout=TIMEOUT_S, cached=False
        )
        # One query per timestamp: a query answers per partition, so repeats of one partition collapse.
        found = [
            consumer.offsets_for_times([ConfluentTopicPartition(topic, PARTITION, ts)], timeout=TIMEOUT_S)[0]
            for ts in times
        ]
    finally:
        consumer.close()
    for tp in found:
        assert tp.error is None, f"confluent offsets_for_times: {tp.error}"
    # librdkafka answers "no record at or after this time" with offset -1 (OFFSET_END).
    return OffsetAnswers(low, high, [None if tp.offset == -1 else tp.offset for tp in found])


def offsets_kafka_python(
    bootstrap: str, topic: str, isolation: Isolation, times: Sequence[int]
) -> OffsetAnswers:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=isolation
    )
    try:
        tp = KafkaTopicPartition(topic, PARTITION)
        consumer.assign([tp])
        beginning = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        by_time: list[int | None] = []
        for ts in times:  # one query each: the result is a dict keyed by partition
            hit = consumer.offsets_for_times({tp: ts})[tp]
            by_time.append(None if hit is None else hit.offset)
    finally:
        consumer.close()
    return OffsetAnswers(beginning, end, by_time)


def offsets_aiokafka(bootstrap: str, topic: str, isolation: Isolation, times: Sequence[int]) -> OffsetAnswers:
    async def run() -> OffsetAnswers:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=isolation
        )
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, PARTITION)
            consumer.assign([tp])
            beginning = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            by_time: list[int | None] = []
            for ts in times:
                hit = (await consumer.offsets_for_times({tp: ts}))[tp]
                by_time.append(None if hit is None else hit.offset)
        finally:
            await consumer.stop()
        return OffsetAnswers(beginning, end, by_time)

    return asyncio.run(run())


Producer_ = Callable[[str, str, Sequence[Record], str], list[int]]
Consumer_ = Callable[[str, str, int, Isolation], list[Seen]]
Offsets_ = Callable[[str, str, Isolation, Sequence[int]], OffsetAnswers]
PRODUCE: Final[dict[Client, Producer_]] = {
    "confluent": produce_confluent,
    "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka,
}
CONSUME: Final[dict[Client, Consumer_]] = {
    "confluent": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
}
OFFSETS: Final[dict[Client, Offsets_]] = {
    "confluent": offsets_confluent,
    "kafka-python": offsets_kafka_python,
    "aiokafka": offsets_aiokafka,
}


def assert_read_back_exactly(seen: Sequence[Seen], records: Sequence[Record], reader: str) -> None:
    """Every record once, in order, at offsets 0..n-1, with its key, value, headers and CreateTime."""
    assert [s.record.offset for s in seen] == list(range(len(records))), f"{reader}: offsets not 0..n-1"
    for got, want in zip(seen, records, strict=True):
        assert got.record == want, f"{reader} read offset {want.offset} differently"
        assert got.create_time, f"{reader}: offset {want.offset} does not carry a CreateTime"


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """The header of a v2 record batch as the server hands it out."""

    base_offset: int
    last_offset: int
    codec_id: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


# base offset, length, leader epoch, magic, crc, attributes, last offset delta, base and max
# timestamp, producer id, producer epoch, base sequence, record count.
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")


def stored_batches(bootstrap: str, topic: str) -> list[StoredBatch]:
    """Every batch of partition 0 from a raw Fetch v12, so the checks see the wire bytes, not a client."""
    batches: list[StoredBatch] = []
    offset, high_watermark = 0, 1
    with WireSocket(bootstrap) as sock:
        for correlation_id in itertools.count(1):
            if offset >= high_watermark:
                break
            body = request_body(1, 12, topic)
            wanted = body.topics[0].partitions[0]
            body = dataclasses.replace(
                body,
                topics=(
                    dataclasses.replace(
                        body.topics[0], partitions=(dataclasses.replace(wanted, fetch_offset=offset),)
                    ),
                ),
            )
            sock.send_raw(encode_request(1, 12, correlation_id, body))
            _, response = decode_response(1, 12, sock.read_frame())
            partition = response.responses[0].partitions[0]
            assert partition.error_code == 0, f"raw fetch of {topic}: error {partition.error_code}"
            high_watermark = partition.high_watermark
            records = bytes(partition.records or b"")
            assert records, f"raw fetch of {topic} at {offset} returned nothing below {high_watermark}"
            position = 0
            while position + _BATCH_HEADER.size <= len(records):
                fields = _BATCH_HEADER.unpack_from(records, position)
                base, length, _, magic, _, attributes, last_delta, _, _, pid, epoch, sequence, _ = fields
                if position + 12 + length > len(records):
                    break  # a partial batch at the end of a fetch: asked for again
                assert magic == 2, f"{topic}: batch at {base} has magic {magic}"
                batches.append(StoredBatch(base, base + last_delta, attributes & 0x07, pid, epoch, sequence))
                position += 12 + length
                offset = base + last_delta + 1
    return batches


def assert_idempotent_batches_of(
    batches: Sequence[StoredBatch], codec: str, count: int, who: str, *, incompressible: bool = False
) -> None:
    """One producer id and epoch, sequences that follow the offsets from 0, and `codec` in every batch.

    With `incompressible`, a batch may also be uncompressed: librdkafka sends a batch as is
    when compressing it would not make it smaller (random bytes).
    """
    assert batches, f"{who}: no batches stored"
    codecs = [b.codec_id for b in batches]
    if incompressible:
        assert CODEC_IDS[codec] in codecs and set(codecs) <= {CODEC_IDS[codec], 0}, f"{who}: batch codecs"
    else:
        assert codecs == [CODEC_IDS[codec]] * len(batches), f"{who}: batch codecs"
    assert len({(b.producer_id, b.producer_epoch) for b in batches}) == 1, f"{who}: more than one producer"
    assert batches[0].producer_id >= 0 and batches[0].producer_epoch >= 0, f"{who}: not idempotent"
    assert [b.base_sequence for b in batches] == [b.base_offset for b in batches], f"{who}: sequences"
    assert [b.base_offset for b in batches[1:]] == [b.last_offset + 1 for b in batches[:-1]]
    assert (batches[0].base_offset, batches[-1].last_offset) == (0, count - 1)


def round_trip(server: ServeProcess, client: Client, codec: str, isolation: Isolation) -> None:
    topic = unique_topic(f"{client}-{codec}-{isolation}")
    records = scenario_records()
    offsets = PRODUCE[client](server.bootstrap, topic, records, codec)
    assert offsets == list(range(len(records))), f"{client} delivery reports are not contiguous from 0"
    batches = stored_batches(server.bootstrap, topic)
    assert_idempotent_batches_of(batches, codec, len(records), client)
    assert len(batches) > 1, f"{client}: {len(records)} records in one batch; the scenario wants several"
    seen = CONSUME[client](server.bootstrap, topic, len(records), isolation)
    assert_read_back_exactly(seen, records, client)


# -- 1 and 2: produce idempotently with every codec, read back in both isolation levels -------------


@pytest.mark.parametrize(("codec", "isolation"), CODEC_BY_ISOLATION)
def test_confluent_idempotent_producer_round_trips_keys_headers_and_timestamps_with_every_codec(
    served: ServeProcess, codec: str, isolation: Isolation
) -> None:
    round_trip(served, "confluent", codec, isolation)


@pytest.mark.parametrize(("codec", "isolation"), CODEC_BY_ISOLATION)
def test_kafka_python_idempotent_producer_round_trips_keys_headers_and_timestamps_with_every_codec(
    served: ServeProcess, codec: str, isolation: Isolation
) -> None:
    round_trip(served, "kafka-python", codec, isolation)


@pytest.mark.parametrize(("codec", "isolation"), CODEC_BY_ISOLATION)
def test_aiokafka_idempotent_producer_round_trips_keys_headers_and_timestamps_with_every_codec(
    served: ServeProcess, codec: str, isolation: Isolation
) -> None:
    round_trip(served, "aiokafka", codec, isolation)


# -- 3: offsets by time and watermarks --------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_finds_offsets_by_create_time_and_sees_watermarks_0_and_n(
    served: ServeProcess, client: Client, isolation: Isolation
) -> None:
    topic = unique_topic(f"times-{client}-{isolation}")
    records = scenario_records()
    n = len(records)
    assert PRODUCE[client](served.bootstrap, topic, records, "lz4") == list(range(n))
    middle = n // 2
    # (timestamp asked, offset expected): Kafka's answer is the first offset whose timestamp is >= it.
    lookups: list[tuple[int, int | None]] = [
        (records[middle].timestamp_ms, middle),  # exactly a record's CreateTime
        (records[middle].timestamp_ms - TS_STEP_MS // 2, middle),  # between two records: the later
        (BASE_TS_MS - 60_000, 0),  # before the first record
        (records[0].timestamp_ms, 0),
        (records[-1].timestamp_ms, n - 1),
        (records[-1].timestamp_ms + 1, None),  # after the last record: none
    ]
    answers = OFFSETS[client](served.bootstrap, topic, isolation, [ts for ts, _ in lookups])
    assert (answers.beginning, answers.end) == (0, n), f"{client} watermarks"
    assert answers.by_time == [want for _, want in lookups], f"{client} offsets_for_times"


# -- 4: what one client writes, the other two read byte for byte ------------------------------------

CROSS: Final = [
    pytest.param(producer, codec, id=f"{producer}-writes-{codec}-others-read-in")
    for producer, codec in (("confluent", "zstd"), ("kafka-python", "lz4"), ("aiokafka", "snappy"))
]


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize(("producer", "codec"), CROSS)
def test_a_record_written_by_one_client_is_read_byte_identically_by_the_other_two(
    served: ServeProcess, producer: Client, codec: str, isolation: Isolation
) -> None:
    topic = unique_topic(f"cross-{producer}-{codec}-{isolation}")
    edges = edge_records()
    # Then ordinary records, later in time, so the reads span more than the edge cases' batches.
    records = edges + [
        dataclasses.replace(r, offset=len(edges) + r.offset, timestamp_ms=r.timestamp_ms + 10_000_000)
        for r in scenario_records(40, seed=3)
    ]
    assert PRODUCE[producer](served.bootstrap, topic, records, codec) == list(range(len(records)))
    batches = stored_batches(served.bootstrap, topic)
    assert_idempotent_batches_of(batches, codec, len(records), producer, incompressible=True)
    readers = [client for client in CLIENTS if client != producer]
    reads: dict[str, list[Seen]] = {
        reader: CONSUME[reader](served.bootstrap, topic, len(records), isolation) for reader in readers
    }
    for reader, seen in reads.items():
        assert_read_back_exactly(seen, records, f"{reader} (written by {producer})")
    first, second = (reads[reader] for reader in readers)
    assert first == second
