"""A consume-transform-produce app with exactly-once semantics (confluent-kafka), run as a subprocess.

    python eos_app.py --bootstrap HOST:PORT --input IN --output OUT --group G --transactional-id T

A consumer (group G, read_committed, no auto commit) subscribes to IN; a transactional producer
(transactional.id T) turns each input record into one output record (key kept, value b"out:" +
the input value), and each batch's transaction also commits the consumer's positions
(send_offsets_to_transaction), so an output record and its input's committed offset stand or
fall together. The errors are handled the way the librdkafka/confluent-kafka transactional
examples do: an abortable error aborts the transaction and rewinds the consumer to its committed
offsets, a retriable one is retried, a fatal one exits 3 (the driver starts the app again).
With --pause-ms each transaction stays open that long, half of it after its records are sent and
half after its offsets are too (before the commit), so a SIGKILL (of app or server) likely cuts one.

It exits 0 once it holds every input partition, has committed up to each one's high watermark
and has had no new input for --idle-seconds ("done input-end"), or after --max-seconds ("done
max-seconds"). stdout, flushed line by line, is for the driver and for debugging:

    assigned 0,1,2 | revoked 0,1,2
    commit TXN MESSAGES P:OFFSET,P:OFFSET,...   (the positions committed with transaction TXN)
    abort TXN REASON
    done input-end | done max-seconds
    fatal REASON
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

FATAL_EXIT = 3
CALL_TIMEOUT_S = 30.0
WATERMARK_CHECK_S = 1.0
STALL_REPORT_S = 5.0
# A call that has not returned this long after its timeout hangs (librdkafka#5456: the timeout of
# send_offsets_to_transaction is not enforced): the app exits HUNG_EXIT and is started again.
HUNG_S = CALL_TIMEOUT_S + 15.0
HUNG_EXIT = 4


class Fatal(Exception):
    """The app cannot go on; it exits FATAL_EXIT and its next start resumes from the committed offsets."""


class Abortable(Exception):
    """The current transaction must be aborted."""


def say(line: str) -> None:
    print(line, flush=True)


class EosApp:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.deadline: float = time.monotonic() + args.max_seconds
        common: dict[str, Any] = {
            "bootstrap.servers": args.bootstrap,
            # No re-bootstrap when the (only) broker is down: re-bootstrapping decommissions the broker
            # that a cached group coordinator still points to, and send_offsets_to_transaction then
            # waits for it forever (librdkafka#5511).
            "metadata.recovery.strategy": "none",
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "error_cb": self._on_client_error,
        }
        if args.debug:
            common["debug"] = args.debug
        self.consumer = Consumer(
            {
                **common,
                "group.id": args.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": args.session_timeout_ms,
                "heartbeat.interval.ms": max(args.session_timeout_ms // 6, 100),
            }
        )
        self.producer = Producer(
            {
                **common,
                "transactional.id": args.transactional_id,
                "enable.idempotence": True,
                "transaction.timeout.ms": args.transaction_timeout_ms,
                "linger.ms": 5,
            }
        )
        self.transactions = 0
        self.began = 0.0
        self._phase, self.phase_since = "start", time.monotonic()
        self.last_commit_at = time.monotonic()
        threading.Thread(target=self._report_stalls, daemon=True).start()
        self.partitions: set[int] = set()
        self.last_input_at = time.monotonic()
        self.next_watermark_check = 0.0

    def _on_client_error(self, error: KafkaError) -> None:
        say(f"client error: {error}")

    @property
    def phase(self) -> str:
        """What the loop is doing (for the stall reports and the hang check)."""
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self._phase, self.phase_since = phase, time.monotonic()

    def _report_stalls(self) -> None:
        """Every STALL_REPORT_S without a commit: what the loop waits in; a call that hangs: exit."""
        while True:
            time.sleep(STALL_REPORT_S)
            if (stuck := time.monotonic() - self.phase_since) > HUNG_S:
                say(f"fatal hung in {self.phase} for {stuck:.0f} s")
                os._exit(HUNG_EXIT)
            since = time.monotonic() - self.last_commit_at
            if since >= STALL_REPORT_S:
                try:
                    assigned = ",".join(str(tp.partition) for tp in self.consumer.assignment())
                except (RuntimeError, KafkaException):  # closed
                    return
                say(f"stalled {since:.0f} s since the last commit, in {self.phase}; assigned [{assigned}]")

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        self.phase = "init_transactions"
        self._retrying("init_transactions", lambda: self.producer.init_transactions(CALL_TIMEOUT_S))
        self.phase = "metadata"
        metadata = self.consumer.list_topics(self.args.input, timeout=CALL_TIMEOUT_S)
        topic = metadata.topics.get(self.args.input)
        if topic is None or topic.error is not None or not topic.partitions:
            raise Fatal(f"input topic {self.args.input}: {topic.error if topic else 'not found'}")
        self.partitions = set(topic.partitions)
        self.consumer.subscribe([self.args.input], on_assign=self._on_assign, on_revoke=self._on_revoke)
        while self._left() > 0:
            self.producer.poll(0)
            self.phase = "consume"
            batch = []
            for message in self.consumer.consume(self.args.batch, timeout=0.5):
                error = message.error()
                if error is None:
                    batch.append(message)
                elif error.fatal():
                    raise Fatal(f"consumer: {error}")
                else:
                    say(f"consumer error: {error}")
            if batch:
                self.last_input_at = time.monotonic()
                self._transform(batch)
            elif self._at_end() and time.monotonic() - self.last_input_at >= self.args.idle_seconds:
                say("done input-end")
                return 0
        say("done max-seconds")
        return 0

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        say("assigned " + ",".join(str(tp.partition) for tp in partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        say("revoked " + ",".join(str(tp.partition) for tp in partitions))

    def _transform(self, batch: list[Any]) -> None:
        """One transaction: the batch's output records and the consumer's positions after it."""
        self.transactions += 1
        self.began = time.monotonic()
        self.phase = f"transaction {self.transactions}: produce"
        self.producer.begin_transaction()
        try:
            for message in batch:
                self._produce(message.key(), b"out:" + (message.value() or b""))
            self._hold("its records sent", 0.5)
            positions = self.consumer.position(self.consumer.assignment())
            self._in_transaction(
                "send_offsets_to_transaction",
                lambda: self.producer.send_offsets_to_transaction(
                    positions, self.consumer.consumer_group_metadata(), CALL_TIMEOUT_S
                ),
            )
            self._hold("its records and offsets sent", 1.0)
            self._in_transaction(
                "commit_transaction", lambda: self.producer.commit_transaction(CALL_TIMEOUT_S)
            )
        except Abortable as exc:
            say(f"abort {self.transactions} {exc}")
            self._retrying("abort_transaction", lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
            self._rewind()
            return
        self.last_commit_at = time.monotonic()
        offsets = ",".join(f"{tp.partition}:{tp.offset}" for tp in positions if tp.offset >= 0)
        say(f"commit {self.transactions} {len(batch)} {offsets}")

    def _hold(self, what: str, until: float) -> None:
        """Keep the transaction open until `until` of --pause-ms: a kill then likely lands in it."""
        if self.args.pause_ms:
            self.phase = f"transaction {self.transactions}: open, {what}"
            self.producer.flush(self.args.pause_ms / 1000)
            time.sleep(max(0.0, until * self.args.pause_ms / 1000 - (time.monotonic() - self.began)))

    def _produce(self, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.args.output, value=value, key=key)
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full
            except KafkaException as exc:
                self._raise_for(exc.args[0], "produce")

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset (its start if none)."""
        assignment = self.consumer.assignment()
        if not assignment:
            return
        self.phase = "rewind"
        try:
            committed = self.consumer.committed(assignment, timeout=CALL_TIMEOUT_S)
            for tp in committed:
                if tp.offset < 0:
                    tp.offset = OFFSET_BEGINNING
                self.consumer.seek(tp)
        except KafkaException as exc:
            raise Fatal(f"rewind to the committed offsets failed: {exc.args[0]}") from exc
        say("rewound to " + ",".join(f"{tp.partition}:{tp.offset}" for tp in committed))

    # -- error handling ---------------------------------------------------------------------------

    @staticmethod
    def _raise_for(error: KafkaError, what: str) -> None:
        if error.fatal():
            raise Fatal(f"{what}: {error}")
        if error.txn_requires_abort():
            raise Abortable(f"{what}: {error}")
        raise Fatal(f"{what}: {error} (neither retriable nor abortable)")

    def _in_transaction(self, what: str, call: Callable[[], None]) -> None:
        """Call until it succeeds; retriable errors are retried, the rest raise Abortable or Fatal."""
        while True:
            self.phase = f"transaction {self.transactions}: {what}"
            try:
                call()
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and not error.fatal() and not error.txn_requires_abort():
                    say(f"retry {what}: {error}")
                    if self._left() <= 0:
                        raise Fatal(f"{what}: still {error} at --max-seconds") from exc
                    time.sleep(0.1)
                    continue
                self._raise_for(error, what)

    def _retrying(self, what: str, call: Callable[[], None]) -> None:
        """Outside a transaction (init, abort): retriable errors are retried, anything else is fatal."""
        while True:
            self.phase = what
            try:
                call()
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and not error.fatal() and self._left() > 0:
                    say(f"retry {what}: {error}")
                    time.sleep(0.1)
                    continue
                raise Fatal(f"{what}: {error}") from exc

    def _at_end(self) -> bool:
        """Whether every input partition is assigned and its position is at its high watermark."""
        now = time.monotonic()
        if now < self.next_watermark_check:
            return False
        self.next_watermark_check = now + WATERMARK_CHECK_S
        self.phase = "the end check: committed"
        assignment = self.consumer.assignment()
        if {tp.partition for tp in assignment} != self.partitions:
            return False
        positions = {tp.partition: tp.offset for tp in self.consumer.position(assignment)}
        unknown = [tp for tp in assignment if positions[tp.partition] < 0]
        if unknown:  # nothing consumed since the assignment: its committed offset is the position
            positions.update(
                (tp.partition, tp.offset) for tp in self.consumer.committed(unknown, timeout=CALL_TIMEOUT_S)
            )
        for tp in assignment:
            self.phase = f"the end check: the watermarks of {tp.partition}"
            _low, high = self.consumer.get_watermark_offsets(tp, timeout=CALL_TIMEOUT_S, cached=False)
            if positions[tp.partition] < high:
                self.last_input_at = now
                return False
        return True

    def close(self) -> None:
        self.phase = "close"
        self.consumer.close()
        self.producer.flush(5)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="quiet time at the input's end")
    parser.add_argument("--batch", type=int, default=500, help="input records per transaction, at most")
    parser.add_argument(
        "--pause-ms", type=float, default=0.0, help="each transaction is open this long, at least"
    )
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    parser.add_argument("--debug", default="", help="librdkafka debug contexts (e.g. protocol,cgrp,eos)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    app = EosApp(parse_args(argv))
    try:
        code = app.run()
    except Fatal as exc:
        say(f"fatal {exc}")
        return FATAL_EXIT
    except KafkaException as exc:
        say(f"fatal unexpected {exc.args[0]}")
        return FATAL_EXIT
    app.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
