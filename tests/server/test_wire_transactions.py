"""Transactions through real, unmodified clients (confluent-kafka, kafka-python, aiokafka) and on the wire.

What a client sees: a committed transaction is read by read_committed consumers and an
aborted one only by read_uncommitted ones; a second incarnation of a transactional id
fences the first (whose open transaction is aborted); a transaction left open past its
timeout is aborted by the server; offsets sent to a transaction become the group's
exactly when it commits. What the log holds is checked without a client: the batches
and their COMMIT/ABORT markers from a raw Fetch, the last stable offset and aborted
transactions from a read_committed Fetch, ListOffsets in both isolation levels.

Crash recovery runs a real `oncelog serve` (ServeProcess) and SIGKILLs it between
transactions and with transactions open; a transaction a crash left in PrepareCommit
is made by failing its markers in a first in-process server, and completed by the
next start. The error codes of the transaction APIs are checked with raw requests.

Every reader stops at an END record committed after the scenario's transactions, so
"never sees the aborted records" is checked without waiting for a timeout: records
come in offset order, and the END record is after them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ProducerFenced as AioProducerFenced
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from in_process import InProcessServer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import InvalidProducerEpochError, ProducerFencedError
from kafka.producer.future import FutureRecordMetadata
from kafka.structs import OffsetAndMetadata
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from serve_process import ServeProcess
from wire_client import WireSocket, decode_response, encode_request

from oncelog.layout import TopicPartition
from oncelog.log_manager import LogManager
from oncelog.segments import RecordBatch, encode_batch
from oncelog.segments import format as fmt
from oncelog.segments.batch import batch_size_at
from oncelog.segments.control import decode_txn_marker
from oncelog.server.broker import Broker, ServeConfig
from oncelog.server.codec import build, nested
from oncelog.server.coordinator_store import TXN, CoordinatorStore
from oncelog.server.group_state import GroupLimits
from oncelog.server.txn_coordinator import TxnState
from oncelog.storage.fs import OsFileSystem

Client = Literal["confluent", "kafka-python", "aiokafka"]
Isolation = Literal["read_uncommitted", "read_committed"]
CLIENTS: Final[tuple[Client, ...]] = ("confluent", "kafka-python", "aiokafka")
T = TypeVar("T")

TIMEOUT_S: Final = 15.0
# The transaction timeout of the scenarios that want the server to abort (librdkafka also
# needs message.timeout.ms <= transaction.timeout.ms).
SHORT_TXN_TIMEOUT_MS: Final = 2000
LONG_TXN_TIMEOUT_MS: Final = 60_000
END: Final = b"END"  # the last record of every scenario: readers stop at it
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST: Final = -1

_names = itertools.count()


def unique(name: str) -> str:
    """A topic, group or transactional id no other scenario of the module uses."""
    return f"txn-{name}-{next(_names)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """One in-process server for the module's client scenarios; groups join without the initial delay."""
    config = ServeConfig(listen_port=0, groups=GroupLimits(initial_rebalance_delay_ms=0))
    with InProcessServer(tmp_path_factory.mktemp("txn-root"), config) as running:
        yield running


# -- the clients' transactional producers, driven step by step ------------------------------------


class LoopThread:
    """An event loop in a daemon thread: aiokafka's clients live on it and the test calls into it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class TxnProducer(Protocol):
    """A client's transactional producer; constructing one runs init_transactions."""

    client: Client

    def begin(self) -> None: ...

    def send(self, topic: str, value: bytes, partition: int = 0) -> None: ...

    def flush(self) -> None:
        """Wait for every record sent; raise the first delivery error."""

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def send_offsets(self, topic: str, partition: int, offset: int, group: Any) -> None:
        """send_offsets_to_transaction of one partition's offset; `group` as join_group gives it."""

    def is_fenced(self, exc: BaseException) -> bool:
        """Whether `exc` is this client's fatal "fenced by a newer incarnation" error."""

    def close(self) -> None: ...


class ConfluentTxn:
    client: Client = "confluent"

    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int):
        self.delivery_errors: list[KafkaError] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": timeout_ms,
                "message.timeout.ms": timeout_ms,
                "socket.timeout.ms": min(timeout_ms, 60_000),
                # Back quickly after a server restart.
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.producer.init_transactions(TIMEOUT_S)

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.delivery_errors.append(err)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self.producer.produce(topic, value=value, partition=partition, on_delivery=self._on_delivery)

    def flush(self) -> None:
        assert self.producer.flush(TIMEOUT_S) == 0, "confluent: records still undelivered"
        if self.delivery_errors:
            raise KafkaException(self.delivery_errors[0])

    def commit(self) -> None:
        self.producer.commit_transaction(TIMEOUT_S)

    def abort(self) -> None:
        self.producer.abort_transaction(TIMEOUT_S)

    def send_offsets(self, topic: str, partition: int, offset: int, group: Any) -> None:
        offsets = [ConfluentTopicPartition(topic, partition, offset)]
        self.producer.send_offsets_to_transaction(offsets, group, TIMEOUT_S)

    def is_fenced(self, exc: BaseException) -> bool:
        if not isinstance(exc, KafkaException):
            return False
        err: KafkaError = exc.args[0]
        fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        return bool(err.fatal()) and err.code() in fenced

    def close(self) -> None:
        # close() aborts an open transaction first, which a fenced producer cannot: it says so.
        with contextlib.suppress(KafkaException), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.producer.close()


class KafkaPythonTxn:
    client: Client = "kafka-python"

    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int):
        self._pending: list[FutureRecordMetadata] = []
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=transactional_id,
            transaction_timeout_ms=timeout_ms,
            request_timeout_ms=int(TIMEOUT_S * 1000),
            reconnect_backoff_ms=50,
            reconnect_backoff_max_ms=500,
        )
        self.producer.init_transactions()

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self._pending.append(self.producer.send(topic, value=value, partition=partition))

    def flush(self) -> None:
        self.producer.flush(TIMEOUT_S)
        pending, self._pending = self._pending, []
        for future in pending:
            future.get(TIMEOUT_S)

    def commit(self) -> None:
        self.producer.commit_transaction()

    def abort(self) -> None:
        self.producer.abort_transaction()

    def send_offsets(self, topic: str, partition: int, offset: int, group: Any) -> None:
        offsets = {KafkaTopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)}
        self.producer.send_offsets_to_transaction(offsets, group)

    def is_fenced(self, exc: BaseException) -> bool:
        return isinstance(exc, ProducerFencedError | InvalidProducerEpochError)

    def close(self) -> None:
        self.producer.close(timeout=5)


class AioKafkaTxn:
    """aiokafka's transactional producer (InitProducerId and the other transaction APIs at v0)."""

    client: Client = "aiokafka"

    def __init__(self, bootstrap: str, transactional_id: str, timeout_ms: int):
        self._loop = LoopThread()
        self._pending: list[asyncio.Future[Any]] = []

        async def start() -> AIOKafkaProducer:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                transactional_id=transactional_id,
                transaction_timeout_ms=timeout_ms,
                enable_idempotence=True,
                request_timeout_ms=int(TIMEOUT_S * 1000),
            )
            await producer.start()
            return producer

        self.producer = self._loop.run(start())

    def begin(self) -> None:
        self._loop.run(self.producer.begin_transaction())

    def send(self, topic: str, value: bytes, partition: int = 0) -> None:
        self._pending.append(self._loop.run(self.producer.send(topic, value, partition=partition)))

    def flush(self) -> None:
        pending, self._pending = self._pending, []

        async def delivered() -> None:
            await asyncio.gather(*pending)

        self._loop.run(delivered())

    def commit(self) -> None:
        self._loop.run(self.producer.commit_transaction())

    def abort(self) -> None:
        self._loop.run(self.producer.abort_transaction())

    def send_offsets(self, topic: str, partition: int, offset: int, group: Any) -> None:
        offsets = {AioTopicPartition(topic, partition): offset}
        self._loop.run(self.producer.send_offsets_to_transaction(offsets, group))

    def is_fenced(self, exc: BaseException) -> bool:
        return isinstance(exc, AioProducerFenced)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a fenced producer may complain on the way out
            self._loop.run(self.producer.stop())
        self._loop.close()


PRODUCERS: Final[dict[Client, Callable[[str, str, int], TxnProducer]]] = {
    "confluent": ConfluentTxn,
    "kafka-python": KafkaPythonTxn,
    "aiokafka": AioKafkaTxn,
}


@contextlib.contextmanager
def transactional(
    client: Client, bootstrap: str, transactional_id: str, timeout_ms: int = LONG_TXN_TIMEOUT_MS
) -> Iterator[TxnProducer]:
    producer = PRODUCERS[client](bootstrap, transactional_id, timeout_ms)
    try:
        yield producer
    finally:
        producer.close()


def commit_end(client: Client, bootstrap: str, topic: str, partition: int = 0) -> None:
    """Commit the END record to `topic` from a transactional id of its own."""
    with transactional(client, bootstrap, unique("end")) as producer:
        producer.begin()
        producer.send(topic, END, partition)
        producer.commit()


def produce_plain(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    """`count` records outside any transaction (idempotent, acks=all)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, value=b"in-%d" % i, partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


# -- consumers: from offset 0 up to the END record --------------------------------------------------

Read = list[tuple[int, bytes]]


def read_confluent(bootstrap: str, topic: str, isolation: Isolation, partition: int) -> Read:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),  # required by the client; assign() never joins it
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 100,
        }
    )
    read: Read = []
    try:
        consumer.assign([ConfluentTopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + TIMEOUT_S
        while (not read or read[-1][1] != END) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=0.2):
                assert msg.error() is None, f"confluent consumer: {msg.error()}"
                offset, value = msg.offset(), msg.value()
                assert offset is not None and value is not None
                read.append((offset, value))
    finally:
        consumer.close()
    return read


def read_kafka_python(bootstrap: str, topic: str, isolation: Isolation, partition: int) -> Read:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=isolation,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    read: Read = []
    try:
        tp = KafkaTopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + TIMEOUT_S
        while (not read or read[-1][1] != END) and time.monotonic() < deadline:
            read.extend((msg.offset, msg.value) for msg in consumer.poll(timeout_ms=200).get(tp, []))
    finally:
        consumer.close()
    return read


def read_aiokafka(bootstrap: str, topic: str, isolation: Isolation, partition: int) -> Read:
    async def run() -> Read:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        read: Read = []
        try:
            tp = AioTopicPartition(topic, partition)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + TIMEOUT_S
            while (not read or read[-1][1] != END) and time.monotonic() < deadline:
                batches = await consumer.getmany(tp, timeout_ms=200)
                read.extend((msg.offset, msg.value) for msg in batches.get(tp, []))
        finally:
            await consumer.stop()
        return read

    return asyncio.run(run())


READERS: Final[dict[Client, Callable[[str, str, Isolation, int], Read]]] = {
    "confluent": read_confluent,
    "kafka-python": read_kafka_python,
    "aiokafka": read_aiokafka,
}


def read_to_end(client: Client, bootstrap: str, topic: str, isolation: Isolation, partition: int = 0) -> Read:
    """(offset, value) of every record a `client` consumer in `isolation` reads, up to the END record."""
    read = READERS[client](bootstrap, topic, isolation, partition)
    assert read and read[-1][1] == END, f"{client} ({isolation}) never reached END in {topic}: {read}"
    return read


# -- group members whose metadata send_offsets_to_transaction takes --------------------------------


@dataclass
class GroupMember:
    metadata: Any  # what the client's send_offsets_to_transaction takes for the group
    close: Callable[[], None]


def join_group(client: Client, bootstrap: str, group: str, topic: str) -> GroupMember:
    """A consumer of `topic` in `group` (subscribe(), read_committed) once it holds its partitions.

    aiokafka's producer takes the bare group id (its TxnOffsetCommit is v0, without member
    or generation), so it gets no consumer.
    """
    deadline = time.monotonic() + TIMEOUT_S
    if client == "confluent":
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        assert consumer.assignment(), "confluent consumer did not join its group"
        return GroupMember(consumer.consumer_group_metadata(), consumer.close)
    if client == "kafka-python":
        kafka_consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        kafka_consumer.subscribe([topic])
        while not kafka_consumer.assignment() and time.monotonic() < deadline:
            kafka_consumer.poll(timeout_ms=100)
        assert kafka_consumer.assignment(), "kafka-python consumer did not join its group"
        return GroupMember(kafka_consumer.group_metadata(), kafka_consumer.close)
    return GroupMember(group, lambda: None)


# -- the log without a client: raw Fetch, ListOffsets, OffsetFetch and the transaction APIs ---------


class Wire:
    """One connection sending requests that kio encodes from keyword fields (build ignores extra ones)."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self._socket = WireSocket(bootstrap)
        self._ids = itertools.count(1)

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        correlation_id = next(self._ids)
        body = build(load_request_schema(api_key, version), **fields)
        self._socket.send_raw(encode_request(api_key, version, correlation_id, body))
        answered, response = decode_response(api_key, version, self._socket.read_frame())
        assert answered == correlation_id
        return response

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads --------------------------------------------------------------------------------
    def fetch(self, topic: str, partition: int, offset: int, isolation: int) -> Any:
        """One partition of a Fetch v12 (no wait)."""
        request = load_request_schema(1, 12)
        topic_type = nested(request, "topics")
        wanted = build(
            nested(topic_type, "partitions"),
            partition=partition,
            fetch_offset=offset,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        response = self.call(
            1,
            12,
            replica_id=-1,
            max_wait=datetime.timedelta(0),
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=isolation,
            topics=(build(topic_type, topic=topic, partitions=(wanted,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
        answer = response.responses[0].partitions[0]
        assert answer.error_code == ErrorCode.none, f"fetch of {topic}-{partition}: {answer.error_code!r}"
        return answer

    def latest(self, topic: str, partition: int, isolation: int) -> int:
        """ListOffsets v7 latest: the log end, or under read_committed the last stable offset."""
        request = load_request_schema(2, 7)
        topic_type = nested(request, "topics")
        wanted = build(nested(topic_type, "partitions"), partition_index=partition, timestamp=LATEST)
        response = self.call(
            2,
            7,
            replica_id=-1,
            isolation_level=isolation,
            topics=(build(topic_type, name=topic, partitions=(wanted,)),),
        )
        answer = response.topics[0].partitions[0]
        assert answer.error_code == ErrorCode.none, (
            f"ListOffsets of {topic}-{partition}: {answer.error_code!r}"
        )
        return int(answer.offset)

    def committed(
        self, group: str, topic: str, partition: int = 0, *, require_stable: bool = False, version: int = 7
    ) -> tuple[ErrorCode, int]:
        """(error, committed offset) of one partition from OffsetFetch (v7: one group; v8: a list)."""
        request = load_request_schema(9, version)
        if version <= 7:
            topic_type = nested(request, "topics")
            topics = (build(topic_type, name=topic, partition_indexes=(partition,)),)
            response = self.call(9, version, group_id=group, topics=topics, require_stable=require_stable)
            answer = response.topics[0].partitions[0]
        else:
            group_type = nested(request, "groups")
            topics = (build(nested(group_type, "topics"), name=topic, partition_indexes=(partition,)),)
            groups = (build(group_type, group_id=group, topics=topics),)
            response = self.call(9, version, groups=groups, require_stable=require_stable)
            answer = response.groups[0].topics[0].partitions[0]
        return answer.error_code, int(answer.committed_offset)

    # -- the transaction APIs -------------------------------------------------------------------
    def init_producer_id(
        self,
        transactional_id: str | None,
        *,
        timeout_ms: int = LONG_TXN_TIMEOUT_MS,
        producer_id: int = -1,
        epoch: int = -1,
        version: int = 4,
    ) -> tuple[ErrorCode, int, int]:
        response = self.call(
            22,
            version,
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        return response.error_code, int(response.producer_id), int(response.producer_epoch)

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        topic: str,
        partitions: tuple[int, ...] = (0,),
        *,
        version: int = 3,
    ) -> list[ErrorCode]:
        request = load_request_schema(24, version)
        topics = (build(nested(request, "v3_and_below_topics"), name=topic, partitions=partitions),)
        response = self.call(
            24,
            version,
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer_id,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=topics,
        )
        return [
            p.partition_error_code for p in response.results_by_topic_v3_and_below[0].results_by_partition
        ]

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group: str, *, version: int = 3
    ) -> ErrorCode:
        response = self.call(
            25,
            version,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            group_id=group,
        )
        return ErrorCode(response.error_code)

    def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, *, commit: bool, version: int = 3
    ) -> ErrorCode:
        response = self.call(
            26,
            version,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            committed=commit,
        )
        return ErrorCode(response.error_code)

    def produce(
        self, topic: str, partition: int, batch: bytes, transactional_id: str | None
    ) -> tuple[ErrorCode, int]:
        """(error, base offset) of one batch in a Produce v9 with acks=all."""
        request = load_request_schema(0, 9)
        topic_type = nested(request, "topic_data")
        data = build(nested(topic_type, "partition_data"), index=partition, records=batch)
        response = self.call(
            0,
            9,
            transactional_id=transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(build(topic_type, name=topic, partition_data=(data,)),),
        )
        answer = response.responses[0].partition_responses[0]
        return answer.error_code, int(answer.base_offset)

    def create_topic(self, topic: str, partitions: int) -> None:
        request = load_request_schema(19, 5)
        creatable = build(
            nested(request, "topics"),
            name=topic,
            num_partitions=partitions,
            replication_factor=1,
            assignments=(),
            configs=(),
        )
        response = self.call(
            19, 5, topics=(creatable,), timeout=datetime.timedelta(seconds=5), validate_only=False
        )
        assert response.topics[0].error_code == ErrorCode.none, response.topics[0]


@dataclass(frozen=True, slots=True)
class Batch:
    """A stored batch as a raw Fetch hands it out."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    marker: Literal["COMMIT", "ABORT"] | None  # a control batch's marker


def partition_batches(bootstrap: str, topic: str, partition: int = 0) -> list[Batch]:
    """Every batch of the partition, control batches too, from read_uncommitted Fetches."""
    batches: list[Batch] = []
    offset = 0
    with Wire(bootstrap) as wire:
        while True:
            answer = wire.fetch(topic, partition, offset, READ_UNCOMMITTED)
            if offset >= answer.high_watermark:
                return batches
            view = memoryview(bytes(answer.records or b""))
            position = 0
            while position + fmt.HEADER_SIZE <= len(view) and position + batch_size_at(view, position) <= len(
                view
            ):
                batch = RecordBatch(view[position:])
                marker: Literal["COMMIT", "ABORT"] | None = None
                if batch.is_control:
                    decoded = decode_txn_marker(batch)
                    marker = None if decoded is None else ("COMMIT" if decoded.commit else "ABORT")
                batches.append(
                    Batch(
                        batch.base_offset,
                        batch.last_offset,
                        batch.producer_id,
                        batch.producer_epoch,
                        batch.is_transactional,
                        marker,
                    )
                )
                position += batch.size
                offset = batch.last_offset + 1
            assert position > 0, f"raw fetch of {topic}-{partition} at {offset} returned no whole batch"


def layout(batches: list[Batch]) -> str:
    """One character per offset: t transactional record, p plain record, C commit marker, A abort marker."""
    kinds: list[str] = []
    for batch in batches:
        kind = {"COMMIT": "C", "ABORT": "A", None: "t" if batch.transactional else "p"}[batch.marker]
        kinds.extend(kind * (batch.last_offset - batch.base_offset + 1))
    assert len(kinds) == (batches[-1].last_offset + 1 if batches else 0), "the batches leave a gap"
    return "".join(kinds)


@dataclass(frozen=True, slots=True)
class StableView:
    """What read_committed readers are told about a partition."""

    high_watermark: int
    last_stable_offset: int
    # (producer id, first offset) of each aborted transaction from offset 0.
    aborted: list[tuple[int, int]]
    # ListOffsets latest in each isolation level.
    latest_uncommitted: int
    latest_committed: int


def stable_view(bootstrap: str, topic: str, partition: int = 0) -> StableView:
    """A read_committed Fetch from offset 0 (the partitions here fit one fetch) and ListOffsets."""
    with Wire(bootstrap) as wire:
        answer = wire.fetch(topic, partition, 0, READ_COMMITTED)
        return StableView(
            int(answer.high_watermark),
            int(answer.last_stable_offset),
            sorted((int(a.producer_id), int(a.first_offset)) for a in answer.aborted_transactions or ()),
            wire.latest(topic, partition, READ_UNCOMMITTED),
            wire.latest(topic, partition, READ_COMMITTED),
        )


def settled(view: StableView) -> bool:
    """No transaction open: read_committed readers reach the log end."""
    return view.last_stable_offset == view.high_watermark == view.latest_committed == view.latest_uncommitted


def settled_view(bootstrap: str, topic: str, partition: int = 0) -> StableView | None:
    view = stable_view(bootstrap, topic, partition)
    return view if settled(view) else None


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = TIMEOUT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def markers_in(bootstrap: str, topic: str, partition: int = 0) -> StableView:
    """The partition once no transaction is open in it: EndTxn is answered once the outcome
    is stored, and the markers follow."""
    return wait_for(f"the markers in {topic}", lambda: settled_view(bootstrap, topic, partition))


def committed_offset(
    bootstrap: str, group: str, topic: str, *, require_stable: bool = False
) -> tuple[ErrorCode, int]:
    with Wire(bootstrap) as wire:
        return wire.committed(group, topic, require_stable=require_stable)


# == 1. commit and abort through each client ========================================================


@pytest.mark.parametrize("client", CLIENTS)
def test_a_committed_transaction_is_read_committed_and_an_aborted_one_only_read_uncommitted(
    server: InProcessServer, client: Client
) -> None:
    bootstrap, topic = server.bootstrap, unique(f"visibility-{client}")
    with transactional(client, bootstrap, unique(f"visibility-{client}")) as producer:
        producer.begin()
        for i in range(5):
            producer.send(topic, b"committed-%d" % i)
        producer.commit()
        producer.begin()
        for i in range(3):
            producer.send(topic, b"aborted-%d" % i)
        producer.flush()
        # Open: read_committed stops at its first record (offset 6, after the first commit marker).
        open_view = stable_view(bootstrap, topic)
        assert (open_view.high_watermark, open_view.last_stable_offset) == (9, 6)
        assert (open_view.latest_uncommitted, open_view.latest_committed) == (9, 6)
        producer.abort()
        producer.begin()
        producer.send(topic, END)
        producer.commit()

    markers_in(bootstrap, topic)  # (EndTxn is answered before its markers are written)
    batches = partition_batches(bootstrap, topic)
    assert layout(batches) == "tttttC" + "tttA" + "tC"
    producer_ids = {(b.producer_id, b.producer_epoch) for b in batches}
    assert len(producer_ids) == 1, f"{client}: one producer id and epoch for every batch and marker"
    ((pid, _),) = producer_ids
    view = stable_view(bootstrap, topic)
    assert settled(view) and view.high_watermark == 12
    assert view.aborted == [(pid, 6)], "the aborted transaction is listed from its first offset"

    committed = [(i, b"committed-%d" % i) for i in range(5)]
    aborted = [(6 + i, b"aborted-%d" % i) for i in range(3)]
    assert read_to_end(client, bootstrap, topic, "read_committed") == [*committed, (10, END)]
    assert read_to_end(client, bootstrap, topic, "read_uncommitted") == [*committed, *aborted, (10, END)]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_commit_is_answered_before_its_markers_and_read_committed_readers_wait_for_them(
    server: InProcessServer, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EndTxn is answered once PrepareCommit is stored; the markers follow. Held back here
    # (a slow disk): the client's commit returns, yet no read_committed reader sees the data.
    bootstrap, topic = server.bootstrap, unique(f"answered-{client}")
    coordinator = server.server.broker.transactions
    write_marker, gate = coordinator._write_marker, threading.Event()

    def held_back(tp: TopicPartition, *args: Any) -> None:
        if tp.topic == topic:
            assert gate.wait(4 * TIMEOUT_S), "the test never opened the gate"
        write_marker(tp, *args)

    monkeypatch.setattr(coordinator, "_write_marker", held_back)
    with transactional(client, bootstrap, unique(f"answered-{client}")) as producer:
        producer.begin()
        for i in range(5):
            producer.send(topic, b"committed-%d" % i)
        producer.commit()  # answered with no marker written
        view = stable_view(bootstrap, topic)
        assert (view.high_watermark, view.last_stable_offset, view.latest_committed) == (5, 0, 0)
        # The producer's next transaction waits for the markers, then goes on.
        threading.Timer(0.3, gate.set).start()
        producer.begin()
        producer.send(topic, END)
        producer.commit()
    assert gate.is_set()
    markers_in(bootstrap, topic)
    assert layout(partition_batches(bootstrap, topic)) == "tttttC" + "tC"
    committed = [(i, b"committed-%d" % i) for i in range(5)]
    assert read_to_end(client, bootstrap, topic, "read_committed") == [*committed, (6, END)]


# == 2. a second incarnation fences the first ========================================================


@pytest.mark.parametrize("client", CLIENTS)
def test_init_transactions_of_a_second_instance_fences_the_first_and_aborts_its_open_transaction(
    server: InProcessServer, client: Client
) -> None:
    bootstrap, topic, transactional_id = (
        server.bootstrap,
        unique(f"fence-{client}"),
        unique(f"fence-{client}"),
    )
    with transactional(client, bootstrap, transactional_id) as first:
        first.begin()
        first.send(topic, b"first-open")
        first.flush()
        with transactional(client, bootstrap, transactional_id) as second:
            # The second's init aborted the first's transaction: nothing is left open.
            assert settled(stable_view(bootstrap, topic))
            with pytest.raises(Exception) as refused:  # each client raises its own type
                first.commit()
            assert first.is_fenced(refused.value), f"{client}: not a fencing error: {refused.value!r}"
            second.begin()
            second.send(topic, b"second")
            second.send(topic, END)
            second.commit()

    markers_in(bootstrap, topic)
    batches = partition_batches(bootstrap, topic)
    assert layout(batches) == "t" + "A" + "ttC"
    first_data, abort, *second_data = batches
    assert len({b.producer_id for b in batches}) == 1, "the producer id is kept; only the epoch moves"
    assert abort.producer_epoch == first_data.producer_epoch + 1, "the abort is written at a fencing epoch"
    assert {b.producer_epoch for b in second_data} == {first_data.producer_epoch + 2}
    view = stable_view(bootstrap, topic)
    assert settled(view) and view.aborted == [(first_data.producer_id, 0)]
    assert read_to_end(client, bootstrap, topic, "read_committed") == [(2, b"second"), (3, END)]
    assert read_to_end(client, bootstrap, topic, "read_uncommitted") == [
        (0, b"first-open"),
        (2, b"second"),
        (3, END),
    ]


def test_a_fenced_confluent_producers_next_send_fails_as_fenced_not_as_an_abortable_error(
    server: InProcessServer,
) -> None:
    """Kafka answers the stale epoch's Produce INVALID_PRODUCER_EPOCH, which librdkafka makes fatal (fenced).

    INVALID_TXN_STATE instead is an abortable error to librdkafka: the zombie is told to
    abort and carry on, and only learns that it is fenced when it tries to.
    """
    bootstrap, topic, transactional_id = server.bootstrap, unique("zombie"), unique("zombie")
    with transactional("confluent", bootstrap, transactional_id) as first:
        assert isinstance(first, ConfluentTxn)
        first.begin()
        first.send(topic, b"first-open")
        first.flush()
        with transactional("confluent", bootstrap, transactional_id):
            first.send(topic, b"zombie")
            # Its delivery report, or the fatal error poll() raises (flush() of a producer gone fatal
            # raises SystemError instead).
            seen: list[KafkaError] = []
            deadline = time.monotonic() + TIMEOUT_S
            while not seen and time.monotonic() < deadline:
                try:
                    first.producer.poll(0.1)
                except KafkaException as exc:
                    seen.append(exc.args[0])
                seen[:0] = first.delivery_errors
            fenced = (KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
            assert seen and seen[0].code() in fenced, f"the fenced producer's Produce failed with {seen}"
            with pytest.raises(KafkaException) as refused:
                first.commit()
            assert first.is_fenced(refused.value), f"not fenced: {refused.value.args[0]}"


# == 3. the server aborts a transaction open past its timeout =======================================


@pytest.mark.parametrize("client", CLIENTS)
def test_a_transaction_open_past_its_timeout_is_aborted_by_the_server_and_its_commit_then_fails(
    server: InProcessServer, client: Client
) -> None:
    bootstrap, topic = server.bootstrap, unique(f"timeout-{client}")
    with transactional(client, bootstrap, unique(f"timeout-{client}"), SHORT_TXN_TIMEOUT_MS) as stalled:
        stalled.begin()
        for i in range(3):
            stalled.send(topic, b"stalled-%d" % i)
        stalled.flush()
        opened = time.monotonic()
        view = stable_view(bootstrap, topic)
        assert (view.high_watermark, view.last_stable_offset, view.latest_committed) == (3, 0, 0)

        # The producer pauses; the server aborts within its timeout check interval after the timeout.
        aborted = wait_for("the timeout abort", lambda: settled_view(bootstrap, topic))
        waited = time.monotonic() - opened
        assert waited >= SHORT_TXN_TIMEOUT_MS / 1000 - 0.5, (
            f"aborted after {waited:.2f} s, before its timeout"
        )
        assert aborted.high_watermark == 4 and layout(partition_batches(bootstrap, topic)) == "tttA"
        ((pid, _),) = aborted.aborted
        assert aborted.aborted == [(pid, 0)]

        with pytest.raises(Exception) as refused:  # each client raises its own type
            stalled.commit()
        assert stalled.is_fenced(refused.value), f"{client}: {refused.value!r}"

    commit_end(client, bootstrap, topic)
    assert read_to_end(client, bootstrap, topic, "read_committed") == [(4, END)]
    assert [value for _, value in read_to_end(client, bootstrap, topic, "read_uncommitted")] == [
        b"stalled-0",
        b"stalled-1",
        b"stalled-2",
        END,
    ]


# == 4. offsets sent to a transaction ===============================================================


@pytest.mark.parametrize("client", CLIENTS)
def test_offsets_sent_to_a_transaction_are_the_groups_after_its_commit_and_unchanged_after_an_abort(
    server: InProcessServer, client: Client
) -> None:
    bootstrap = server.bootstrap
    source, sink, group = (
        unique(f"offsets-in-{client}"),
        unique(f"offsets-out-{client}"),
        unique(f"g-{client}"),
    )
    produce_plain(bootstrap, source, 10)
    member = join_group(client, bootstrap, group, source)
    try:
        with transactional(client, bootstrap, unique(f"offsets-{client}")) as producer:
            producer.begin()
            producer.send(sink, b"out-0..3")
            producer.send_offsets(source, 0, 4, member.metadata)
            producer.commit()
            assert committed_offset(bootstrap, group, source) == (ErrorCode.none, 4)

            producer.begin()
            producer.send(sink, b"out-4..7")
            producer.send_offsets(source, 0, 8, member.metadata)
            producer.flush()  # abort_transaction drops what is not sent yet: this is in the log
            producer.abort()
            assert committed_offset(bootstrap, group, source) == (ErrorCode.none, 4)

            producer.begin()
            producer.send(sink, END)
            producer.send_offsets(source, 0, 10, member.metadata)
            producer.commit()
            assert committed_offset(bootstrap, group, source) == (ErrorCode.none, 10)
    finally:
        member.close()
    assert read_to_end(client, bootstrap, sink, "read_committed") == [(0, b"out-0..3"), (4, END)]


def test_a_plain_commit_after_a_transactional_one_returned_is_the_groups_offset(
    server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a red-team helper: the transaction's offsets, applied with its markers after
    # the answer, overwrote the consumer's later plain commit. Markers held back past the
    # time an OffsetCommit waits for them (a slow disk), so the later commit lands first.
    bootstrap, source, group = server.bootstrap, unique("plain-after-in"), unique("plain-after-g")
    coordinator = server.server.broker.transactions
    write_marker = coordinator._write_marker

    def slow(tp: TopicPartition, *args: Any) -> None:
        time.sleep(1.5)
        write_marker(tp, *args)

    produce_plain(bootstrap, source, 30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.assign([ConfluentTopicPartition(source, 0)])
        monkeypatch.setattr(coordinator, "_write_marker", slow)
        with transactional("confluent", bootstrap, unique("plain-after")) as producer:
            producer.begin()
            producer.send(unique("plain-after-out"), b"out")
            producer.send_offsets(source, 0, 10, consumer.consumer_group_metadata())
            producer.commit()
            consumer.commit(offsets=[ConfluentTopicPartition(source, 0, 20)], asynchronous=False)
            wait_for("the markers", lambda: None if coordinator._completing else True)
        assert committed_offset(bootstrap, group, source) == (ErrorCode.none, 20)
    finally:
        consumer.close()


class StableCommitted(Protocol):
    """A read_committed consumer of a group that only asks for its committed offset (no join)."""

    def committed(self, topic: str, partition: int) -> int: ...

    def close(self) -> None: ...


class ConfluentCommitted:
    def __init__(self, bootstrap: str, group: str):
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"}
        )

    def committed(self, topic: str, partition: int) -> int:
        [answer] = self._consumer.committed([ConfluentTopicPartition(topic, partition)], TIMEOUT_S)
        assert answer.error is None, answer.error
        return int(answer.offset)

    def close(self) -> None:
        self._consumer.close()


class KafkaPythonCommitted:
    def __init__(self, bootstrap: str, group: str):
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            request_timeout_ms=int(TIMEOUT_S * 1000),
        )

    def committed(self, topic: str, partition: int) -> int:
        return int(self._consumer.committed(KafkaTopicPartition(topic, partition)))

    def close(self) -> None:
        self._consumer.close()


# aiokafka is not among them: it asks OffsetFetch v1, which has no require_stable.
STABLE_COMMITTED: Final[dict[Client, Callable[[str, str], StableCommitted]]] = {
    "confluent": ConfluentCommitted,
    "kafka-python": KafkaPythonCommitted,
}


@pytest.mark.parametrize("client", list(STABLE_COMMITTED))
def test_a_read_committed_consumer_waits_for_the_offsets_an_open_transaction_holds(
    server: InProcessServer, client: Client
) -> None:
    """OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while a transaction holds offsets of
    the partition; librdkafka and kafka-python (which ask so under read_committed) retry until it ends."""
    bootstrap = server.bootstrap
    source, sink, group = unique("unstable-in"), unique("unstable-out"), unique(f"unstable-{client}")
    produce_plain(bootstrap, source, 10)
    member = join_group(client, bootstrap, group, source)
    reader = STABLE_COMMITTED[client](bootstrap, group)
    try:
        with transactional(client, bootstrap, unique(f"unstable-{client}")) as producer:
            producer.begin()
            producer.send(sink, b"out")
            producer.send_offsets(source, 0, 4, member.metadata)
            producer.commit()

            producer.begin()
            producer.send_offsets(source, 0, 9, member.metadata)
            with Wire(bootstrap) as wire:
                for version in (7, 8):
                    assert wire.committed(group, source, require_stable=True, version=version) == (
                        ErrorCode.unstable_offset_commit,
                        -1,
                    )
                    assert wire.committed(group, source, require_stable=False, version=version) == (
                        ErrorCode.none,
                        4,
                    )
                other_source = unique("unstable-other")
                wire.create_topic(other_source, 1)
                assert wire.committed(group, other_source, require_stable=True) == (ErrorCode.none, -1), (
                    "a partition the transaction holds no offset of is stable"
                )

            answers: list[int] = []
            fetching = threading.Thread(target=lambda: answers.append(reader.committed(source, 0)))
            fetching.start()
            fetching.join(1.0)
            assert fetching.is_alive(), f"committed() answered while the transaction was open: {answers}"
            producer.commit()
            fetching.join(TIMEOUT_S)
            assert not fetching.is_alive()
            assert answers == [9]

            producer.begin()
            producer.send_offsets(source, 0, 10, member.metadata)
            producer.abort()
            assert committed_offset(bootstrap, group, source, require_stable=True) == (ErrorCode.none, 9)
            assert reader.committed(source, 0) == 9
    finally:
        reader.close()
        member.close()


# == 5. crash recovery ===============================================================================


def test_sigkill_between_transactions_keeps_committed_data_and_offsets_committed_and_aborted_data_aborted(
    tmp_path: Path,
) -> None:
    source, topic, group = "crash-in", "crash-out", "crash-group"
    with ServeProcess(tmp_path / "root", "--group-initial-rebalance-delay-ms", "0") as process:
        bootstrap = process.bootstrap
        produce_plain(bootstrap, source, 10)
        member = join_group("confluent", bootstrap, group, source)
        try:
            with transactional("confluent", bootstrap, "crash-between") as producer:
                producer.begin()
                for i in range(3):
                    producer.send(topic, b"kept-%d" % i)
                producer.send_offsets(source, 0, 3, member.metadata)
                producer.commit()
                producer.begin()
                for i in range(2):
                    producer.send(topic, b"dropped-%d" % i)
                producer.send_offsets(source, 0, 5, member.metadata)
                producer.flush()
                producer.abort()
                markers_in(bootstrap, topic)
                before = partition_batches(bootstrap, topic)

                process.restart()  # SIGKILL, then start on the same port

                assert partition_batches(bootstrap, topic) == before
                assert layout(before) == "tttC" + "ttA"
                view = stable_view(bootstrap, topic)
                assert settled(view) and view.aborted == [(before[0].producer_id, 4)]
                assert committed_offset(bootstrap, group, source, require_stable=True) == (ErrorCode.none, 3)
                # The same producer carries on after the restart.
                producer.begin()
                producer.send(topic, END)
                producer.commit()
        finally:
            member.close()
        assert read_to_end("confluent", bootstrap, topic, "read_committed") == [
            *((i, b"kept-%d" % i) for i in range(3)),
            (7, END),
        ]
        assert [v for _, v in read_to_end("confluent", bootstrap, topic, "read_uncommitted")] == [
            b"kept-0",
            b"kept-1",
            b"kept-2",
            b"dropped-0",
            b"dropped-1",
            END,
        ]


def test_sigkill_with_transactions_open_leaves_none_hanging_after_the_restart(tmp_path: Path) -> None:
    """Three transactions open at the kill: after the restart the first is committed by its producer, the
    second aborted by a new incarnation of its transactional id, the third by its timeout."""
    with ServeProcess(tmp_path / "root") as process:
        bootstrap = process.bootstrap
        resumed = ConfluentTxn(bootstrap, "open-resumed", LONG_TXN_TIMEOUT_MS)
        replaced = ConfluentTxn(bootstrap, "open-replaced", LONG_TXN_TIMEOUT_MS)
        abandoned = ConfluentTxn(bootstrap, "open-abandoned", SHORT_TXN_TIMEOUT_MS)
        try:
            for producer, topic in ((resumed, "resumed"), (replaced, "replaced"), (abandoned, "abandoned")):
                producer.begin()
                producer.send(topic, b"%s-0" % topic.encode())
                producer.send(topic, b"%s-1" % topic.encode())
                producer.flush()
                view = stable_view(bootstrap, topic)
                assert (view.high_watermark, view.last_stable_offset) == (2, 0)

            process.restart()  # SIGKILL, then start on the same port

            resumed.send("resumed", END)
            resumed.commit()
            with transactional("confluent", bootstrap, "open-replaced") as successor:
                successor.begin()
                successor.send("replaced", END)
                successor.commit()
            abandoned_view = wait_for(
                "the timeout abort after the restart", lambda: settled_view(bootstrap, "abandoned")
            )
            assert abandoned_view.high_watermark == 3
            with pytest.raises(KafkaException) as refused:
                abandoned.commit()
            assert abandoned.is_fenced(refused.value)
        finally:
            for producer in (resumed, replaced, abandoned):
                producer.close()
        commit_end("confluent", bootstrap, "abandoned")

        for topic, expected_layout in (("resumed", "tttC"), ("replaced", "ttAtC"), ("abandoned", "ttAtC")):
            markers_in(bootstrap, topic)
            assert layout(partition_batches(bootstrap, topic)) == expected_layout, topic
            view = stable_view(bootstrap, topic)
            assert settled(view), f"{topic}: {view}"
        assert read_to_end("confluent", bootstrap, "resumed", "read_committed") == [
            (0, b"resumed-0"),
            (1, b"resumed-1"),
            (2, END),
        ]
        assert read_to_end("confluent", bootstrap, "replaced", "read_committed") == [(3, END)]
        assert read_to_end("confluent", bootstrap, "abandoned", "read_committed") == [(3, END)]


def stored_transaction(root: Path, transactional_id: str) -> dict[str, Any]:
    """The coordinator store's record of `transactional_id`, read with the server stopped."""
    store = CoordinatorStore.open(OsFileSystem(), str(root))
    try:
        [stored] = [r for r, _ in store.records(TXN, "id", dict) if r["id"] == transactional_id]
    finally:
        store.close()
    return stored


def standalone_group_metadata(bootstrap: str, group: str) -> Any:
    """confluent's group metadata from a consumer that never joins: no member, no generation."""
    outside = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return outside.consumer_group_metadata()
    finally:
        outside.close()


def test_a_transaction_a_crash_left_in_prepare_commit_is_completed_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first server writes partition 0's COMMIT marker but cannot write partition 1's: the
    transaction stays PrepareCommit (EndTxn was answered: the outcome is decided) with its offsets
    pending. The next start writes the markers again (partition 0 gets a second one, which completes
    nothing) and applies the offsets with the Complete state."""
    root = tmp_path / "root"
    config = ServeConfig(listen_port=0, partitions=2, groups=GroupLimits(initial_rebalance_delay_ms=0))
    source, topic, group, transactional_id = "prepared-in", "prepared-out", "prepared-group", "prepared"
    write_marker = Broker._write_marker
    written: list[TopicPartition] = []

    def partition_0_once(
        broker: Broker, tp: TopicPartition, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int
    ) -> None:
        """Partition 0's first marker is written; every other marker (and every retry) fails."""
        if tp.partition != 0 or written:
            raise OSError(f"injected: the marker to {tp} is not written")
        write_marker(broker, tp, producer_id, epoch, commit, coordinator_epoch)
        written.append(tp)

    monkeypatch.setattr(Broker, "_write_marker", partition_0_once)
    with InProcessServer(root, config) as first:
        bootstrap = first.bootstrap
        produce_plain(bootstrap, source, 10)
        group_metadata = standalone_group_metadata(bootstrap, group)
        with transactional("confluent", bootstrap, transactional_id) as producer:
            producer.begin()
            for partition in (0, 1):
                producer.send(topic, b"p%d-a" % partition, partition)
                producer.send(topic, b"p%d-b" % partition, partition)
            producer.send_offsets(source, 0, 6, group_metadata)
            producer.commit()
            # EndTxn may be answered before partition 0's marker (written in its own thread) is in.
            wait_for("partition 0's marker", lambda: settled_view(bootstrap, topic, 0))
            assert written == [TopicPartition(topic, 0)]
            assert layout(partition_batches(bootstrap, topic, 0)) == "ttC"
            assert layout(partition_batches(bootstrap, topic, 1)) == "tt"
            stuck = stable_view(bootstrap, topic, 1)
            assert (stuck.high_watermark, stuck.last_stable_offset, stuck.latest_committed) == (2, 0, 0)
            # Decided but not complete: the offsets are not the group's yet, and are pending.
            assert committed_offset(bootstrap, group, source) == (ErrorCode.none, -1)
            assert committed_offset(bootstrap, group, source, require_stable=True)[0] == (
                ErrorCode.unstable_offset_commit
            )
    # What the next start finds: the transaction stored decided (PrepareCommit), with its offsets.
    stored = stored_transaction(root, transactional_id)
    assert stored["state"] == TxnState.PREPARE_COMMIT.value
    assert sorted(map(tuple, stored["partitions"])) == [(topic, 0), (topic, 1)]
    assert [offset[:4] for offset in stored["offsets"]] == [[group, source, 0, 6]]
    monkeypatch.undo()

    with InProcessServer(root, config) as second:
        bootstrap = second.bootstrap
        assert layout(partition_batches(bootstrap, topic, 0)) == "ttC" + "C"
        assert layout(partition_batches(bootstrap, topic, 1)) == "ttC"
        for partition in (0, 1):
            assert settled(stable_view(bootstrap, topic, partition))
            commit_end("confluent", bootstrap, topic, partition)
            assert read_to_end("confluent", bootstrap, topic, "read_committed", partition) == [
                (0, b"p%d-a" % partition),
                (1, b"p%d-b" % partition),
                (4 if partition == 0 else 3, END),
            ]
        assert committed_offset(bootstrap, group, source, require_stable=True) == (
            ErrorCode.none,
            6,
        )
        assert (
            second.server.broker.transactions.transactions[transactional_id].state is TxnState.COMPLETE_COMMIT
        )


def close_within(producer: ConfluentTxn) -> None:
    """Close a producer whose server may be down (a start that failed): librdkafka's close aborts
    the open transaction first and would wait for a server for ever. The close is cleanup, after
    the test's assertions; left hanging, its thread is a daemon."""
    closing = threading.Thread(target=producer.close, name="producer-close", daemon=True)
    closing.start()
    closing.join(TIMEOUT_S)


def test_a_completed_ends_marker_a_power_loss_took_is_written_again_with_its_outcome_at_the_next_start(
    tmp_path: Path,
) -> None:
    """A completion is stored before its markers are fsynced, naming each marker's offset. Power
    loss can then take a marker and everything after it in the partition, here the next
    transaction's record, whose own record holds the partition. The next start ends the data below
    the named offset with the stored outcome: left open, it would end with the next transaction,
    whose abort (the producer's, after the restart) would take the committed records with it."""
    root = tmp_path / "root"
    topic, transactional_id = "lost-marker", "lost-marker"
    with ServeProcess(root) as process:
        bootstrap = process.bootstrap
        producer = ConfluentTxn(bootstrap, transactional_id, LONG_TXN_TIMEOUT_MS)
        try:
            producer.begin()
            producer.send(topic, b"a")
            producer.send(topic, b"b")
            producer.commit()
            producer.begin()
            producer.send(topic, b"next")
            producer.flush()
            assert layout(partition_batches(bootstrap, topic)) == "ttCt"
            process.kill()
            try:  # (started again whatever fails: the producer's close needs a server)
                stored = stored_transaction(root, transactional_id)
                with LogManager.open(root, progress=False) as manager:  # what power loss may leave
                    log = manager.log(topic, 0, create=False)
                    truncated_to = log.truncate_to(2)
                    still_open = log.open_transactions()
            finally:
                process.start()
            assert stored["state"] == TxnState.ONGOING.value
            assert stored["last_end"]["commit"] is True
            assert stored["last_end"]["markers"] == [[topic, 0, 2]]
            assert truncated_to == 2 and still_open == {stored["pid"]: 0}
            assert layout(partition_batches(bootstrap, topic)) == "ttC"  # written again: a commit
            producer.abort()  # the open transaction, which holds nothing now
        finally:
            close_within(producer)
        commit_end("confluent", bootstrap, topic)
        assert layout(partition_batches(bootstrap, topic)) == "ttCAtC"  # the abort ended nothing
        assert read_to_end("confluent", bootstrap, topic, "read_committed") == [
            (0, b"a"),
            (1, b"b"),
            (4, END),
        ]


def test_a_topic_deleted_and_made_again_is_not_taken_for_an_end_whose_marker_was_lost(tmp_path: Path) -> None:
    """The stored end names its marker's offset in the topic as it was; made again, the topic's
    offsets start anew, and an open transaction of the same producer and epoch sits below that
    offset (here at the next epoch: a new incarnation, whose metadata knows the new topic). Delete
    forgets the topic's markers in every stored end, and the start writes no marker over a newer
    epoch's data: it leaves the transaction open."""
    topic, transactional_id = "made-again", "made-again"
    with ServeProcess(tmp_path / "root") as process:
        bootstrap = process.bootstrap
        with transactional("confluent", bootstrap, transactional_id) as first:
            first.begin()
            for n in range(5):
                first.send(topic, b"old-%d" % n)
            first.commit()  # its marker at offset 5
        admin = AdminClient({"bootstrap.servers": bootstrap})  # (held: its futures need it)
        admin.delete_topics([topic])[topic].result(TIMEOUT_S)
        producer = ConfluentTxn(bootstrap, transactional_id, LONG_TXN_TIMEOUT_MS)
        try:
            producer.begin()
            producer.send(topic, b"open")  # made again: offset 0
            producer.flush()
            process.restart()  # SIGKILL, then start on the same port
            view = stable_view(bootstrap, topic)
            assert (view.high_watermark, view.last_stable_offset) == (1, 0)  # still open
            producer.abort()
        finally:
            close_within(producer)
        commit_end("confluent", bootstrap, topic)
        assert read_to_end("confluent", bootstrap, topic, "read_committed") == [(2, END)]


# == 6. error codes on the wire ======================================================================


@pytest.fixture
def wire(server: InProcessServer) -> Iterator[Wire]:
    with Wire(server.bootstrap) as connection:
        yield connection


def test_end_txn_with_no_transaction_open_is_invalid_txn_state(wire: Wire) -> None:
    transactional_id = unique("no-txn")
    code, pid, epoch = wire.init_producer_id(transactional_id)
    assert code == ErrorCode.none and pid >= 0 and epoch == 0
    for version in range(4):
        for commit in (True, False):
            assert wire.end_txn(transactional_id, pid, epoch, commit=commit, version=version) == (
                ErrorCode.invalid_txn_state
            ), (version, commit)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (0, ErrorCode.invalid_producer_epoch),
        (1, ErrorCode.invalid_producer_epoch),
        (2, ErrorCode.producer_fenced),
        (3, ErrorCode.producer_fenced),
    ],
)
def test_add_partitions_with_a_fenced_epoch_is_producer_fenced_from_v2_and_invalid_producer_epoch_before(
    wire: Wire, version: int, expected: ErrorCode
) -> None:
    transactional_id, topic = unique("fenced-epoch"), unique("fenced-epoch")
    wire.create_topic(topic, 1)
    _, pid, old_epoch = wire.init_producer_id(transactional_id)
    code, same_pid, epoch = wire.init_producer_id(transactional_id)
    assert (code, same_pid, epoch) == (ErrorCode.none, pid, old_epoch + 1)
    assert wire.add_partitions(transactional_id, pid, old_epoch, topic, version=version) == [expected]
    assert wire.add_partitions(transactional_id, pid, epoch + 1, topic, version=version) == [expected], (
        "newer"
    )
    assert wire.add_partitions(transactional_id, pid, epoch, topic, version=version) == [ErrorCode.none]


def test_transactional_requests_naming_an_unknown_transactional_id_are_invalid_producer_id_mapping(
    wire: Wire,
) -> None:
    unknown, topic, group = unique("never-initialized"), unique("mapping"), unique("mapping-g")
    wire.create_topic(topic, 1)
    mapping = ErrorCode.invalid_producer_id_mapping
    assert wire.add_partitions(unknown, 1234, 0, topic) == [mapping]
    assert wire.add_offsets(unknown, 1234, 0, group) == mapping
    assert wire.end_txn(unknown, 1234, 0, commit=True) == mapping
    # A known id with another producer id is no better.
    known = unique("known")
    _, pid, epoch = wire.init_producer_id(known)
    assert wire.add_partitions(known, pid + 1000, epoch, topic) == [mapping]
    assert wire.end_txn(known, pid + 1000, epoch, commit=False) == mapping


def test_init_producer_id_naming_a_producer_for_a_transactional_id_with_no_state_starts_it_afresh(
    wire: Wire,
) -> None:
    """KIP-360: a producer recovering (e.g. from UNKNOWN_PRODUCER_ID) presents its producer id and epoch;
    when the coordinator has no state for its transactional id, Kafka creates it (epoch -1 matches any
    presented producer) and answers a new producer id at epoch 0, not an error."""
    _, pid, epoch = wire.init_producer_id(unique("elsewhere"))
    code, new_pid, new_epoch = wire.init_producer_id(
        unique("never-initialized"), producer_id=pid, epoch=epoch
    )
    assert code == ErrorCode.none, f"answered {code!r}"
    assert new_pid >= 0 and new_pid != pid and new_epoch == 0


def test_init_producer_id_with_a_timeout_over_the_maximum_is_invalid_transaction_timeout(wire: Wire) -> None:
    maximum = ServeConfig().transaction_max_timeout_ms
    for version in (0, 4):
        for timeout_ms in (maximum + 1, 0, -1):
            code, pid, epoch = wire.init_producer_id(
                unique("timeout"), timeout_ms=timeout_ms, version=version
            )
            assert (code, pid, epoch) == (ErrorCode.invalid_transaction_timeout, -1, -1), (
                version,
                timeout_ms,
            )
        code, pid, epoch = wire.init_producer_id(unique("timeout"), timeout_ms=maximum, version=version)
        assert code == ErrorCode.none and pid >= 0 and epoch == 0


def test_a_transactional_produce_to_a_partition_not_added_is_invalid_txn_state_and_writes_nothing(
    wire: Wire,
) -> None:
    transactional_id, topic = unique("not-added"), unique("not-added")
    wire.create_topic(topic, 2)
    _, pid, epoch = wire.init_producer_id(transactional_id)

    def batch(sequence: int) -> bytes:
        return encode_batch(
            [(b"k", b"v-%d" % sequence)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=True,
        )

    # No transaction open at all yet.
    assert wire.produce(topic, 0, batch(0), transactional_id) == (ErrorCode.invalid_txn_state, -1)
    assert wire.add_partitions(transactional_id, pid, epoch, topic, (0,)) == [ErrorCode.none]
    # Open and holding partition 0, but not partition 1.
    assert wire.produce(topic, 1, batch(0), transactional_id) == (ErrorCode.invalid_txn_state, -1)
    assert wire.produce(topic, 0, batch(0), transactional_id) == (ErrorCode.none, 0)
    assert wire.latest(topic, 1, READ_UNCOMMITTED) == 0, "the refused batch was not written"
    assert wire.end_txn(transactional_id, pid, epoch, commit=True) == ErrorCode.none
    # Ended: the partition must be added again for the next transaction.
    assert wire.produce(topic, 0, batch(1), transactional_id) == (ErrorCode.invalid_txn_state, -1)
    markers_in(wire.bootstrap, topic)
    assert wire.latest(topic, 0, READ_UNCOMMITTED) == wire.latest(topic, 0, READ_COMMITTED) == 2


def test_a_produce_refused_part_way_releases_its_admitted_append_and_the_transaction_still_ends(
    wire: Wire, server: InProcessServer
) -> None:
    """A transactional batch is admitted to its transaction, then another topic of the same request
    cannot be created (past the partition budget): the request is answered per partition, and the
    transaction's end does not wait forever for the admitted append (found by a red-team run)."""
    transactional_id, topic, over = unique("part-way"), unique("part-way"), unique("over-budget")
    wire.create_topic(topic, 1)
    _, pid, epoch = wire.init_producer_id(transactional_id)
    assert wire.add_partitions(transactional_id, pid, epoch, topic) == [ErrorCode.none]
    batch = encode_batch(
        [(b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True
    )
    request = load_request_schema(0, 9)
    topic_type = nested(request, "topic_data")
    data = build(nested(topic_type, "partition_data"), index=0, records=batch)
    broker = server.server.broker
    budget = broker.max_partitions
    broker.max_partitions = broker.total_partitions()  # no room for `over`
    try:
        response = wire.call(
            0,
            9,
            transactional_id=transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=tuple(build(topic_type, name=name, partition_data=(data,)) for name in (topic, over)),
        )
    finally:
        broker.max_partitions = budget
    codes = {answer.name: answer.partition_responses[0].error_code for answer in response.responses}
    assert codes == {topic: ErrorCode.none, over: ErrorCode.invalid_partitions}
    assert wire.end_txn(transactional_id, pid, epoch, commit=True) == ErrorCode.none
    markers_in(wire.bootstrap, topic)
    assert wire.latest(topic, 0, READ_COMMITTED) == wire.latest(topic, 0, READ_UNCOMMITTED) == 2


def test_a_fenced_producers_transactional_produce_is_invalid_producer_epoch(wire: Wire) -> None:
    """Kafka checks the epoch before the partition (its verification answers PRODUCER_FENCED, which a
    Produce carries as INVALID_PRODUCER_EPOCH; before KIP-890 the partition's ABORT marker at the
    bumped epoch fenced it the same way)."""
    transactional_id, topic = unique("stale-epoch"), unique("stale-epoch")
    wire.create_topic(topic, 1)
    _, pid, epoch = wire.init_producer_id(transactional_id)
    assert wire.add_partitions(transactional_id, pid, epoch, topic) == [ErrorCode.none]

    def batch(sequence: int) -> bytes:
        return encode_batch(
            [(b"k", b"v")],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=True,
        )

    assert wire.produce(topic, 0, batch(0), transactional_id) == (ErrorCode.none, 0)
    code, _, new_epoch = wire.init_producer_id(transactional_id)  # fences `epoch`, aborting its transaction
    assert code == ErrorCode.none and new_epoch > epoch
    assert wire.produce(topic, 0, batch(1), transactional_id) == (ErrorCode.invalid_producer_epoch, -1)
    assert wire.latest(topic, 0, READ_UNCOMMITTED) == 2, "only the batch and the ABORT marker"


def test_a_retried_end_txn_is_answered_none_and_the_other_outcome_invalid_txn_state(wire: Wire) -> None:
    transactional_id, topic = unique("end-retry"), unique("end-retry")
    wire.create_topic(topic, 1)
    _, pid, epoch = wire.init_producer_id(transactional_id)
    for commit in (True, False):
        assert wire.add_partitions(transactional_id, pid, epoch, topic) == [ErrorCode.none]
        assert wire.end_txn(transactional_id, pid, epoch, commit=commit) == ErrorCode.none
        assert wire.end_txn(transactional_id, pid, epoch, commit=commit) == ErrorCode.none, "a retry"
        assert wire.end_txn(transactional_id, pid, epoch, commit=not commit) == ErrorCode.invalid_txn_state
    assert layout(partition_batches(wire.bootstrap, topic)) == "CA", (
        "one marker per transaction, none per retry"
    )


def test_add_partitions_naming_an_unknown_partition_adds_none_of_them(wire: Wire) -> None:
    transactional_id, topic = unique("unknown-partition"), unique("unknown-partition")
    wire.create_topic(topic, 1)
    _, pid, epoch = wire.init_producer_id(transactional_id)
    assert wire.add_partitions(transactional_id, pid, epoch, topic, (0, 7)) == [
        ErrorCode.operation_not_attempted,
        ErrorCode.unknown_topic_or_partition,
    ]
    batch = encode_batch(
        [(b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True
    )
    assert wire.produce(topic, 0, batch, transactional_id) == (ErrorCode.invalid_txn_state, -1)
    assert wire.end_txn(transactional_id, pid, epoch, commit=True) == ErrorCode.invalid_txn_state


def test_a_batch_carrying_another_transactions_producer_id_is_refused_and_the_owners_batch_still_lands(
    wire: Wire,
) -> None:
    """KIP-890's mapping: a transactional batch must carry the producer its request's transactional
    id holds. Found by a red-team run: naming one's own id with another transaction's producer
    id, epoch and next sequence slipped a record into that transaction, and the owner's own
    batch was then answered as a duplicate and dropped."""
    victim, intruder, topic = unique("victim"), unique("intruder"), unique("hijack")
    wire.create_topic(topic, 1)
    _, pid, epoch = wire.init_producer_id(victim)
    assert wire.init_producer_id(intruder)[0] == ErrorCode.none
    assert wire.add_partitions(victim, pid, epoch, topic, (0,)) == [ErrorCode.none]

    def batch(value: bytes) -> bytes:
        return encode_batch(
            [(b"k", value)], producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True
        )

    forged = batch(b"forged")
    assert wire.produce(topic, 0, forged, intruder) == (ErrorCode.invalid_producer_id_mapping, -1)
    assert wire.produce(topic, 0, forged, unique("no-such-id")) == (ErrorCode.invalid_producer_id_mapping, -1)
    assert wire.latest(topic, 0, READ_UNCOMMITTED) == 0, "the forged batch was not written"
    assert wire.produce(topic, 0, batch(b"genuine"), victim) == (ErrorCode.none, 0)
    assert wire.end_txn(victim, pid, epoch, commit=True) == ErrorCode.none
    markers_in(wire.bootstrap, topic)
    assert wire.latest(topic, 0, READ_COMMITTED) == 2
