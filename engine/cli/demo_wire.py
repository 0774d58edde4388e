"""The demo's step 6: an unmodified Kafka client through `oncelog serve`, across SIGKILLs.

A confluent-kafka (librdkafka) producer with enable.idempotence=true streams
uniquely numbered messages into a server process. The server is SIGKILLed twice
mid-stream and restarted on the same port; the producer carries on, retrying what
was in flight. A consumer then reads the partition and counts, among the messages
whose delivery was reported, the ones missing (loss) and the ones stored twice
(duplicates). Both must be 0.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from oncelog.bench.serve_process import ServeProcess

MESSAGES = 20_000
KILLS = 2
TOPIC = "wire"
# The root `oncelog serve` serves, inside the demo's data directory.
WIRE_DIR = "wire"
# Messages sent but not yet acknowledged that the producer keeps in flight.
_IN_FLIGHT = 5000
_BURST = 1500
# Steps 6 and 7 need confluent-kafka, which the `kafka` extra brings.
KAFKA_EXTRA = "pip install 'oncelog[kafka]'"


def kafka_client_missing() -> bool:
    """Whether confluent-kafka, the client of steps 6 and 7, is not installed."""
    return importlib.util.find_spec("confluent_kafka") is None


def run_wire_step(data_dir: str, say: Callable[[str], None], failures: list[str]) -> None:
    try:
        import confluent_kafka
    except ImportError:
        failures.append(f"step 6 needs confluent-kafka: {KAFKA_EXTRA}")
        return
    # `with`: an error or a Ctrl-C on the way stops the server too (SIGTERM: every log closed cleanly).
    with ServeProcess(os.path.join(data_dir, WIRE_DIR)) as server:
        say(f"   oncelog serve {server.root} is listening on {server.bootstrap}")
        acked, errors, left = _produce_across_kills(confluent_kafka, server, say)
        say(
            f"   producer: {MESSAGES} sent, {len(acked)} acknowledged, {len(errors)} failed, {left} in flight"
        )
        seen = _consume_all(confluent_kafka, server.bootstrap)
        duplicates = sum(count - 1 for count in seen.values() if count > 1)
        lost = sum(1 for number in set(acked) if seen[number] == 0)
        stored = sum(seen.values())
        say(f"   consumer (assign, from offset 0): {stored} records; duplicates {duplicates}, lost {lost}")
        status = server.terminate()
    say(f"   SIGTERM: the server closed every log cleanly and exited {status}")
    if duplicates or lost or errors or left or status != 0:
        failures.append(
            f"over the wire: {duplicates} duplicates, {lost} lost, {len(errors)} delivery errors, "
            f"{left} undelivered, exit {status}"
        )


def _produce_across_kills(
    kafka: Any, server: ServeProcess, say: Callable[[str], None]
) -> tuple[list[int], list[str], int]:
    """(numbers acknowledged, delivery errors, messages still unacknowledged after the flush)."""
    acked: list[int] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(int(msg.value()[len(b"wire-") :]))

    producer = kafka.Producer(
        {
            "bootstrap.servers": server.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "log_level": 0,  # the disconnects are the point; keep librdkafka's log quiet
        }
    )
    kill_at = [MESSAGES * (n + 1) // (KILLS + 2) for n in range(KILLS)]
    burst_end: int | None = None
    for number in range(MESSAGES):
        producer.produce(TOPIC, value=b"wire-%06d" % number, key=b"%d" % (number % 10), on_delivery=delivered)
        while number + 1 - len(acked) - len(errors) > _IN_FLIGHT:
            producer.poll(0.005)
        if kill_at and burst_end is None and len(acked) >= kill_at[0]:
            burst_end = number + _BURST  # send a burst unpolled, so the kill lands with it in flight
        if burst_end == number:
            kill_at.pop(0)
            burst_end = None
            producer.poll(0)
            server.kill()
            in_flight = number + 1 - len(acked)
            say(f"   SIGKILL with {len(acked)} acknowledged and {in_flight} in flight; restarting")
            time.sleep(0.3)
            server.start()
            say(f"   restarted on the same port: {server.recovery_summary()}")
    left: int = producer.flush(120)
    return acked, errors, left


def _consume_all(kafka: Any, bootstrap: str) -> Counter[int]:
    """How many times each message number is stored, read with assign() from offset 0."""
    consumer = kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "demo", "enable.auto.commit": False, "log_level": 0}
    )
    _, end = consumer.get_watermark_offsets(kafka.TopicPartition(TOPIC, 0), timeout=10)
    consumer.assign([kafka.TopicPartition(TOPIC, 0, 0)])
    seen: Counter[int] = Counter()
    read = 0
    deadline = time.monotonic() + 60
    while read < end and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error() is not None:
            continue
        read += 1
        seen[int(message.value()[len(b"wire-") :])] += 1
    consumer.close()
    return seen
