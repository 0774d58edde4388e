"""The client side of the wire figures: one confluent-kafka (librdkafka) measuring code
for both brokers (`oncelog serve` and librdkafka's mock cluster), used by `wire`,
`wire_fetch` and `wire_groups`. What each measurement does is in `wire`'s docstring.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Iterator
from typing import Any, Final

PARTITIONS: Final = 4  # what librdkafka's mock auto-creates a topic with
VALUE_BYTES: Final = 100
LINGER_MS: Final = 5
LATENCY_RATE: Final = 10_000  # messages/s offered in the latency measurement
DELIVERY_TIMEOUT_S: Final = 120.0
WARM_UP_TIMEOUT_S: Final = 30.0
METADATA_TIMEOUT_S: Final = 10.0
# librdkafka logs errors only: disconnects when a client closes are not news.
LOG_LEVEL: Final = 3


def producer_config(bootstrap: str, linger_ms: int = LINGER_MS) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "log_level": LOG_LEVEL,
    }


class Deliveries:
    """Counts delivery reports; keeps the first errors."""

    def __init__(self) -> None:
        self.delivered = 0
        self.errors: list[str] = []

    def report(self, error: Any, message: Any) -> None:
        if error is None:
            self.delivered += 1
        elif len(self.errors) < 5:
            self.errors.append(str(error))

    def check(self, expected: int, left: int, where: str) -> None:
        if self.errors or left or self.delivered != expected:
            raise RuntimeError(
                f"{where}: {self.delivered} of {expected} messages delivered, {left} left undelivered, "
                f"errors {self.errors}"
            )


def _warm_up(producer: Any, topic: str, bootstrap: str) -> None:
    """One message to each partition, flushed: connection, producer id, topic and metadata are ready."""
    deliveries = Deliveries()
    for partition in range(PARTITIONS):
        producer.produce(topic, b"w" * VALUE_BYTES, partition=partition, on_delivery=deliveries.report)
    deliveries.check(PARTITIONS, producer.flush(WARM_UP_TIMEOUT_S), f"warming up {topic} on {bootstrap}")
    partitions = len(producer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics[topic].partitions)
    if partitions != PARTITIONS:
        raise RuntimeError(f"{topic} on {bootstrap} has {partitions} partitions, not {PARTITIONS}")


def produce_seconds(kafka: Any, bootstrap: str, topic: str, count: int) -> float:
    """Seconds to send `count` messages and have every one acknowledged (after a warm-up)."""
    producer = kafka.Producer(producer_config(bootstrap))
    _warm_up(producer, topic, bootstrap)
    deliveries = Deliveries()
    produce, poll, report = producer.produce, producer.poll, deliveries.report
    value = b"v" * VALUE_BYTES
    gc.collect()
    start = time.perf_counter()
    for n in range(count):
        while True:
            try:
                produce(topic, value, partition=n % PARTITIONS, on_delivery=report)
                break
            except BufferError:  # the client's queue is full: serve delivery reports, retry
                poll(0.001)
        if n % 1000 == 0:
            poll(0)
    left = producer.flush(DELIVERY_TIMEOUT_S)
    elapsed_s = time.perf_counter() - start
    deliveries.check(count, left, f"producing to {topic} on {bootstrap}")
    return elapsed_s


def fetch_seconds(kafka: Any, bootstrap: str, topic: str) -> tuple[int, float]:
    """(messages read, seconds) for reading every partition of `topic` from offset 0 with assign()."""
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "oncelog-bench",
            "enable.auto.commit": False,
            "log_level": LOG_LEVEL,
        }
    )
    try:
        total = 0
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(
                kafka.TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S
            )
            if low != 0:
                raise RuntimeError(
                    f"{topic} [{partition}] on {bootstrap} starts at offset {low}, not 0: "
                    "the broker dropped messages"
                )
            total += high
        gc.collect()
        start = time.perf_counter()
        deadline = start + DELIVERY_TIMEOUT_S
        consumer.assign([kafka.TopicPartition(topic, partition, 0) for partition in range(PARTITIONS)])
        read = value_bytes = 0
        while read < total and time.perf_counter() < deadline:
            # No more than is left: consume() waits for as many as it is asked for, or the timeout.
            for message in consumer.consume(min(10_000, total - read), 0.5):
                if message.error() is not None:
                    raise RuntimeError(f"fetching {topic} on {bootstrap}: {message.error()}")
                value_bytes += len(message.value())
                read += 1
        elapsed_s = time.perf_counter() - start
    finally:
        consumer.close()
    if value_bytes != read * VALUE_BYTES:
        raise AssertionError(f"fetched {value_bytes} bytes of values in {read} messages from {topic}")
    return read, elapsed_s


def produce_latencies_ms(
    kafka: Any,
    bootstrap: str,
    topic: str,
    window_s: float,
    rate: int = LATENCY_RATE,
    linger_ms: int = LINGER_MS,
) -> tuple[list[float], float]:
    """(Each message's delivery latency in ms, messages/s actually offered) at `rate` for `window_s`."""
    producer = kafka.Producer(producer_config(bootstrap, linger_ms))
    _warm_up(producer, topic, bootstrap)
    latencies_ms: list[float] = []
    errors: list[str] = []
    clock = time.perf_counter

    def report(sent: float, error: Any, message: Any) -> None:
        if error is None:
            latencies_ms.append((clock() - sent) * 1000)
        else:
            errors.append(str(error))

    produce, poll = producer.produce, producer.poll
    value = b"l" * VALUE_BYTES
    count = max(1, round(rate * window_s))
    gc.collect()
    start = clock()
    n = 0
    while n < count:
        due = min(count, int((clock() - start) * rate) + 1)
        while n < due:
            produce(topic, value, partition=n % PARTITIONS, on_delivery=functools.partial(report, clock()))
            n += 1
        # Serve delivery reports until the next message is due.
        poll(max(0.0, start + n / rate - clock()))
    offered = count / (clock() - start)
    left = producer.flush(DELIVERY_TIMEOUT_S)
    if errors or left or len(latencies_ms) != count:
        raise RuntimeError(
            f"latency run on {bootstrap}: {len(latencies_ms)} of {count} delivered, {left} left, "
            f"errors {errors[:5]}"
        )
    return latencies_ms, offered


# -- the two brokers -------------------------------------------------------------------


@contextlib.contextmanager
def mock_cluster(kafka: Any) -> Iterator[str]:
    """librdkafka's mock cluster, one broker; yields its bootstrap address (host:port)."""
    owner = kafka.Producer({"test.mock.num.brokers": 1, "log_level": LOG_LEVEL})
    try:
        brokers = owner.list_topics(timeout=METADATA_TIMEOUT_S).brokers
        broker = brokers[min(brokers)]
        yield f"{broker.host}:{broker.port}"
    finally:
        owner.flush(METADATA_TIMEOUT_S)
        del owner  # the cluster is destroyed with the client that owns it


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds process `pid` has used (Linux /proc); 0 without a pid or /proc."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            # The fields after the command name, which is in parentheses and may hold spaces.
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
