"""Transactions and consumer groups in `oncelog bench --wire`, against librdkafka's mock cluster.

Run by wire.wire_figures on the same two brokers, interleaved repeat by repeat:

1. transactional produce throughput: a Producer with a transactional.id sends N
   messages of 100-byte values in transactions of TXN_MESSAGES messages each
   (begin_transaction, produce, commit_transaction), from the first begin to the
   last commit returning; messages/s. init_transactions and a first transaction
   to every partition stay out of the timed region. Each commit on oncelog serve
   stores the transaction's Prepare state durably (an LMDB commit) and is answered;
   the markers (written and fsynced in every partition) and the Complete state follow
   while the client starts its next transaction, whose AddPartitionsToTxn waits for
   them. The mock keeps all of it in memory.
2. rebalance time: two consumers share a 4-partition topic in one group (the
   classic protocol, the range assignor) and are stable; a third subscribes, and
   the time from its subscribe() to every consumer holding its new share (the
   three assignments disjoint and covering every partition) is measured. The
   consumers heartbeat every REBALANCE_HEARTBEAT_MS, which bounds how soon the
   others learn of the rebalance on either broker.

Both rows are informational (the issue sets no target): the ratio says how far
oncelog serve is from an in-memory broker doing the same protocol work.
"""

from __future__ import annotations

import gc
import time
import uuid
from typing import Any, Final

from oncelog.bench.harness import BenchResults, Target, count_label, make_row, median

TXN_MESSAGES: Final = 1000
REBALANCE_HEARTBEAT_MS: Final = 100
REBALANCE_TIMEOUT_S: Final = 60.0
_TXN_TIMEOUT_S: Final = 60.0


def transactional_produce_seconds(
    kafka: Any, bootstrap: str, topic: str, count: int, partitions: int
) -> float:
    """Seconds to send `count` messages in transactions of TXN_MESSAGES, every commit confirmed."""
    producer = kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"oncelog-bench-{uuid.uuid4()}",
            "linger.ms": 5,
            "log_level": 3,
        }
    )
    producer.init_transactions(_TXN_TIMEOUT_S)
    value = b"t" * 100
    producer.begin_transaction()  # the warm-up: every partition joins a first transaction
    for partition in range(partitions):
        producer.produce(topic, value, partition=partition)
    producer.commit_transaction(_TXN_TIMEOUT_S)
    produce, poll = producer.produce, producer.poll
    gc.collect()
    start = time.perf_counter()
    sent = 0
    while sent < count:
        producer.begin_transaction()
        for n in range(sent, min(count, sent + TXN_MESSAGES)):
            while True:
                try:
                    produce(topic, value, partition=n % partitions)
                    break
                except BufferError:
                    poll(0.001)
        sent = min(count, sent + TXN_MESSAGES)
        producer.commit_transaction(_TXN_TIMEOUT_S)  # raises if any message of it failed
    return time.perf_counter() - start


def rebalance_seconds(kafka: Any, bootstrap: str, topic: str, partitions: int) -> float:
    """Seconds from a third consumer's subscribe() to the group of three holding its new assignment."""
    warm = kafka.Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for partition in range(partitions):  # the topic exists before anyone subscribes
        warm.produce(topic, b"r", partition=partition)
    if warm.flush(_TXN_TIMEOUT_S):
        raise RuntimeError(f"could not create {topic} on {bootstrap}")
    group = f"oncelog-bench-{uuid.uuid4()}"
    consumers = [_member(kafka, bootstrap, group, topic) for _ in range(2)]
    try:
        _wait_for_shares(consumers, partitions, "two consumers settling")
        third = _member(kafka, bootstrap, group, topic, subscribe=False)
        consumers.append(third)
        start = time.perf_counter()
        third.consumer.subscribe([topic], on_assign=third.assigned, on_revoke=third.revoked)
        _wait_for_shares(consumers, partitions, "the rebalance to three")
        return time.perf_counter() - start
    finally:
        for member in consumers:
            member.consumer.close()


class _Member:
    def __init__(self, consumer: Any):
        self.consumer = consumer
        self.partitions: set[int] = set()

    def assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self.partitions = {p.partition for p in partitions}

    def revoked(self, consumer: Any, partitions: list[Any]) -> None:
        self.partitions = set()


def _member(kafka: Any, bootstrap: str, group: str, topic: str, *, subscribe: bool = True) -> _Member:
    member = _Member(
        kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "heartbeat.interval.ms": REBALANCE_HEARTBEAT_MS,
                "session.timeout.ms": 6000,
                "log_level": 3,
            }
        )
    )
    if subscribe:
        member.consumer.subscribe([topic], on_assign=member.assigned, on_revoke=member.revoked)
    return member


def _wait_for_shares(members: list[_Member], partitions: int, what: str) -> None:
    """Poll every member until each holds a share and the shares partition the topic exactly."""
    deadline = time.perf_counter() + REBALANCE_TIMEOUT_S
    while time.perf_counter() < deadline:
        for member in members:
            member.consumer.poll(0.01)
        shares = [member.partitions for member in members]
        if (
            all(shares)
            and sum(map(len, shares)) == partitions
            and set().union(*shares) == set(range(partitions))
        ):
            return
    raise RuntimeError(f"{what}: no complete assignment within {REBALANCE_TIMEOUT_S} s: {shares}")


def add_rows(
    results: BenchResults,
    count: int,
    txn_s: tuple[list[float], list[float]],
    rebalance_s: tuple[list[float], list[float]],
) -> None:
    """The rows: (oncelog, mock) samples of each figure."""
    (ours_txn, mock_txn), (ours_rebalance, mock_rebalance) = txn_s, rebalance_s
    figure = f"wire: transactional produce, {count_label(count)} x 100 B, {TXN_MESSAGES} per transaction"
    ratios = [mock_s / ours_s for ours_s, mock_s in zip(ours_txn, mock_txn, strict=True)]
    target = Target(min_ratio=0.8)  # issue 30
    results.rows.append(
        make_row(figure, count / median(ours_txn), "messages/s", count / median(mock_txn), target, ratios)
    )
    figure = "wire: consumer group rebalance, 2 -> 3 members (subscribe to all assigned)"
    results.rows.append(
        make_row(figure, median(ours_rebalance) * 1000, "ms", median(mock_rebalance) * 1000, Target())
    )
