"""The demo's step 7: the three monotonic counters that fence a zombie, with unmodified Kafka clients.

confluent-kafka (librdkafka) clients talk to a fresh `oncelog serve` through an
AckHoldingRelay that the server advertises, so the demo can lose one acknowledgement or
stall one client the way a network or a long GC pause would:

(a) sequence: an idempotent producer's batch is appended but its acknowledgement is
    lost (the relay holds it back, then cuts the connection). librdkafka sends the same
    batch again (same producer id, epoch and sequence); the server answers it as a
    duplicate with the original offset, and the partition holds the message once.
(b) epoch: transactional producer A opens a transaction and writes; B starts with the
    same transactional.id, which bumps the epoch and aborts A's transaction. A's commit
    is refused (librdkafka reports it fenced, fatally); B commits; a read_committed
    reader sees B's records and none of A's.
(c) generation: consumer c1 of a group consumes, then stalls (the relay holds all its
    bytes) and commits; the server drops it after its session timeout, c2 joins (the
    generation goes up) and commits further; c1's late commit then reaches the server and
    is refused (UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION): the group keeps c2's offsets.

Last, the server is stopped and its log read back: the stored batches carry the
counters (the retried batch's sequence; the epochs of A, of the abort and of B).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from oncelog.bench.relay import AckHoldingRelay
from oncelog.bench.serve_process import ServeProcess, free_port
from oncelog.bench.sigint import interrupted
from oncelog.cli.demo_wire import KAFKA_EXTRA
from oncelog.log import Log
from oncelog.log_manager import LogManager
from oncelog.segments.control import decode_txn_marker

# The root this step's `oncelog serve` serves, inside the demo's data directory.
FENCES_DIR = "fences"
SEQ_TOPIC, TXN_TOPIC, GEN_TOPIC = "fences-seq", "fences-txn", "fences-gen"
PARTITIONS = 2  # of every topic the server creates; (a) and (b) use partition 0
PROBE = b"probe"  # the message whose acknowledgement is lost
TXN_ID = "fences-txn"
GROUP = "fences"
C1, C2 = "fences-c1", "fences-c2"  # client ids: the relay freezes c1 by its own
SESSION_MS = 1500  # the consumers' session.timeout.ms: how long the server waits for a silent c1
PER_PARTITION = 5  # records per partition c1 reads; as many again are for c2 only
WAIT_S = 20.0  # the longest any one wait of this step may take (each takes a fraction of that)
# librdkafka's log (the lost acknowledgement, the fenced producer, the stalled consumer are
# the point, and it warns about each) is kept out of the demo's output.
_LIBRDKAFKA_LOG = logging.getLogger("oncelog.demo.librdkafka")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
_LIBRDKAFKA_LOG.propagate = False

Say = Callable[[str], None]


def run_fences_step(data_dir: str, say: Say, failures: list[str]) -> None:
    try:
        import confluent_kafka
    except ImportError:
        failures.append(f"step 7 needs confluent-kafka: {KAFKA_EXTRA}")
        return
    root = os.path.join(data_dir, FENCES_DIR)
    port = free_port()
    relay = AckHoldingRelay(port)
    server = ServeProcess(
        root,
        *("--advertise", relay.address, "--partitions", str(PARTITIONS)),
        *("--group-min-session-timeout-ms", "1000", "--group-initial-rebalance-delay-ms", "0"),
        port=port,
    )
    probe: int | None = None
    try:
        server.start()
        say(f"   oncelog serve {root} on {server.bootstrap}; clients go through a relay at {relay.address}")
        clients = _Clients(confluent_kafka, relay)
        probe = _step(failures, "(a) sequence", lambda: _sequence(clients, say, failures))
        _step(failures, "(b) epoch", lambda: _epoch(clients, say, failures))
        _step(failures, "(c) generation", lambda: _generation(clients, say, failures))
    finally:
        relay.close()
        status = server.terminate()
    if status != 0:
        failures.append(f"step 7: the server exited {status}:\n{server.log(40)}")
        return
    _read_back(root, probe, say, failures)


def _step(failures: list[str], name: str, run: Callable[[], Any]) -> Any:
    """Run one sub-step; an exception (a client error, a timeout) is one of the demo's failures."""
    try:
        return run()
    except Exception as exc:  # any of them fails the step, and the demo goes on
        if interrupted(exc):  # (CPython wraps a Ctrl-C landing in librdkafka's log callback)
            raise
        failures.append(f"{name}: {type(exc).__name__}: {exc}")
        return None


class _Clients:
    """Kafka clients that reach the server through the relay."""

    def __init__(self, kafka: Any, relay: AckHoldingRelay):
        self.kafka = kafka
        self.relay = relay

    def config(self, client_id: str, settings: dict[str, Any]) -> dict[str, Any]:
        bootstrap = self.relay.address
        return {"bootstrap.servers": bootstrap, "client.id": client_id, "logger": _LIBRDKAFKA_LOG, **settings}

    def read(
        self, topic: str, partition: int, isolation: str = "read_uncommitted"
    ) -> list[tuple[int, bytes]]:
        """(offset, value) of every record of the partition that a consumer with `isolation` returns."""
        settings = {
            "group.id": "fences-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
            "isolation.level": isolation,
        }
        consumer = self.kafka.Consumer(self.config(f"fences-reader-{isolation}", settings))
        try:
            consumer.assign([self.kafka.TopicPartition(topic, partition, 0)])
            records: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error() is None:
                    records.append((message.offset(), message.value()))
                elif message.error().code() == self.kafka.KafkaError._PARTITION_EOF:
                    return records
            raise TimeoutError(f"reading {topic}-{partition} ({isolation}) did not reach its end")
        finally:
            consumer.close()


def _sequence(clients: _Clients, say: Say, failures: list[str]) -> int | None:
    """(a): a lost Produce acknowledgement; librdkafka's retry is answered as a duplicate.

    The probe's offset if it is stored once, at the offset its delivery report gave."""
    reports: list[tuple[Any, int]] = []
    settings = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 200,
    }
    producer = clients.kafka.Producer(clients.config("fences-seq", settings))
    for number in range(3):  # a few first, so the probe's sequence is not 0
        producer.produce(SEQ_TOPIC, b"before-%d" % number, partition=0)
    _flush(producer, "the first messages")
    held = clients.relay.arm()
    producer.produce(
        SEQ_TOPIC, PROBE, partition=0, on_delivery=lambda err, msg: reports.append((err, msg.offset()))
    )
    producer.poll(0)
    if not held.wait(WAIT_S):
        clients.relay.disarm()
        raise TimeoutError("the relay saw no Produce response to hold back")
    clients.relay.cut()
    _flush(producer, f"the {PROBE.decode()!r} retry")
    copies = [offset for offset, value in clients.read(SEQ_TOPIC, 0) if value == PROBE]
    err, offset = reports[0] if reports else ("no delivery report", -1)
    say(
        f"   (a) sequence: an idempotent producer's {PROBE.decode()!r} is appended to {SEQ_TOPIC}-0; "
        "the relay holds back the\n       acknowledgement and cuts the connection. librdkafka sends the "
        "batch again (same producer id,\n       epoch, sequence): answered as a duplicate, delivery report "
        f"offset {offset}; copies in {SEQ_TOPIC}-0: {len(copies)}"
    )
    if err is not None or copies != [offset]:
        failures.append(f"(a) sequence: the delivery report: {err or offset}; in the log at {copies}")
        return None
    return offset


def _epoch(clients: _Clients, say: Say, failures: list[str]) -> None:
    """(b): a second incarnation of a transactional.id fences the first and aborts its transaction."""
    kafka = clients.kafka
    a = kafka.Producer(clients.config("fences-txn-A", {"transactional.id": TXN_ID, "linger.ms": 0}))
    a.init_transactions(WAIT_S)
    a.begin_transaction()
    for number in range(3):
        a.produce(TXN_TOPIC, b"A-%d" % number, partition=0)
    _flush(a, "A's records")
    b = kafka.Producer(clients.config("fences-txn-B", {"transactional.id": TXN_ID, "linger.ms": 0}))
    b.init_transactions(WAIT_S)
    error: Any = None
    try:
        a.commit_transaction(WAIT_S)
    except kafka.KafkaException as exc:
        error = exc.args[0]
    shown = "committed" if error is None else f"{'FATAL ' if error.fatal() else ''}{error.name()}"
    say(
        f"   (b) epoch: producer A (transactional.id {TXN_ID!r}) writes A-0..A-2 in a transaction; B, with "
        "the same id,\n       calls init_transactions: the epoch goes up and A's open transaction is aborted"
    )
    say(f"       A's commit_transaction -> {shown}" + ("" if error is None else f": {error.str()}"))
    b.begin_transaction()
    for number in range(2):
        b.produce(TXN_TOPIC, b"B-%d" % number, partition=0)
    b.commit_transaction(WAIT_S)
    committed = [value.decode() for _, value in clients.read(TXN_TOPIC, 0, "read_committed")]
    everything = [value.decode() for _, value in clients.read(TXN_TOPIC, 0)]
    say(f"       B writes B-0, B-1 and commits; read_committed: {committed} (read_uncommitted: {everything})")
    codes = kafka.KafkaError
    fenced = {codes._FENCED, codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH}
    if error is None or not error.fatal() or error.code() not in fenced:
        failures.append(f"(b) epoch: the fenced producer's commit_transaction -> {shown}")
    if committed != ["B-0", "B-1"] or everything != ["A-0", "A-1", "A-2", "B-0", "B-1"]:
        failures.append(f"(b) epoch: read_committed {committed}, read_uncommitted {everything}")


def _generation(clients: _Clients, say: Say, failures: list[str]) -> None:
    """(c): a consumer the group dropped while it stalled commits late; the server refuses it."""
    kafka = clients.kafka
    feeder = kafka.Producer(clients.config("fences-feeder", {"acks": "all", "linger.ms": 0}))
    _feed(feeder, "c1")
    answers: list[Any] = []

    def consumer(client_id: str, settings: dict[str, Any]) -> Any:
        group_settings = {
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 250,
            "fetch.wait.max.ms": 50,
        }
        made = kafka.Consumer(clients.config(client_id, group_settings | settings))
        made.subscribe([GEN_TOPIC])
        return made

    c1 = consumer(C1, {"on_commit": lambda err, partitions: answers.append(err)})
    c2: Any = None
    try:
        _consume(c1, PER_PARTITION)
        generation1, assigned1 = _generation_of(c1), _partitions(c1.assignment())
        positions = c1.position(c1.assignment())
        say(
            f"   (c) generation: consumer c1 joins group {GROUP!r} (generation {generation1}), is assigned "
            f"{GEN_TOPIC} {assigned1}, reads {PER_PARTITION} from each"
        )
        # c1 stalls: the relay holds all its bytes, so its commit (of generation1) waits in the relay.
        clients.relay.freeze(C1)
        c1.commit(offsets=positions, asynchronous=True)
        _feed(feeder, "c2")
        c2 = consumer(C2, {})
        _consume(c2, 2 * PER_PARTITION)
        generation2, assigned2 = _generation_of(c2), _partitions(c2.assignment())
        by_c2 = _offsets(c2.commit(asynchronous=False))
        say(
            f"       c1 stalls (the relay holds its bytes) and commits {_offsets(positions)}; past its "
            f"{SESSION_MS} ms session the server\n       drops it: c2 joins (generation {generation2}), "
            f"is assigned {assigned2}, reads {2 * PER_PARTITION} from each, commits {by_c2}"
        )
        clients.relay.thaw()
        deadline = time.monotonic() + WAIT_S
        while not answers and time.monotonic() < deadline:
            c1.poll(0.1)
        partitions = [kafka.TopicPartition(GEN_TOPIC, partition) for partition in range(PARTITIONS)]
        group = _offsets(c2.committed(partitions, timeout=WAIT_S))
        error = answers[0] if answers else None
        shown = "no answer" if not answers else "accepted" if error is None else error.name()
        say(
            f"       c1 resumes: its late commit (generation {generation1}) -> {shown}"
            + ("" if error is None else f" ({error.str()})")
            + f"\n       the group's committed offsets stay {group}"
        )
        refused = {kafka.KafkaError.UNKNOWN_MEMBER_ID, kafka.KafkaError.ILLEGAL_GENERATION}
        if error is None or error.code() not in refused:
            failures.append(f"(c) generation: the evicted consumer's commit -> {shown}")
        if group != by_c2 or group == _offsets(positions):
            failures.append(f"(c) generation: the group's offsets are {group}; c2 committed {by_c2}")
        if assigned1 != assigned2 or len(assigned2) != PARTITIONS:
            failures.append(f"(c) generation: c1 was assigned {assigned1}, c2 {assigned2}")
        if generation1 is not None and generation2 is not None and generation2 <= generation1:
            failures.append(f"(c) generation: c1 had generation {generation1}, c2 {generation2}")
    finally:
        clients.relay.thaw()
        # c2 first: its leaving ends the rebalance c1's rejoin started, so c1 can leave at once too.
        if c2 is not None:
            c2.close()
        c1.close()


def _feed(producer: Any, whom: str) -> None:
    for partition in range(PARTITIONS):
        for number in range(PER_PARTITION):
            producer.produce(GEN_TOPIC, b"for-%s-%d" % (whom.encode(), number), partition=partition)
    _flush(producer, f"the records for {whom}")


def _consume(consumer: Any, per_partition: int) -> None:
    """Poll until `consumer` has read `per_partition` records from each of the PARTITIONS."""
    read = dict.fromkeys(range(PARTITIONS), 0)
    deadline = time.monotonic() + WAIT_S
    while any(count < per_partition for count in read.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a consumer of group {GROUP!r} read {read}, not {per_partition} from each")
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            read[message.partition()] += 1


def _generation_of(consumer: Any) -> int | None:
    """The generation the consumer is in, from librdkafka's serialized group metadata
    ("CGMDv2:", then the generation id in host byte order); None if it is not that format."""
    raw = bytes(consumer.consumer_group_metadata())
    if not raw.startswith(b"CGMDv2:") or len(raw) < 11:
        return None
    return int.from_bytes(raw[7:11], sys.byteorder, signed=True)


def _partitions(assignment: list[Any]) -> list[int]:
    return sorted(tp.partition for tp in assignment)


def _offsets(partitions: list[Any] | None) -> dict[int, int]:
    return {tp.partition: tp.offset for tp in sorted(partitions or [], key=lambda tp: tp.partition)}


def _flush(producer: Any, what: str) -> None:
    if producer.flush(WAIT_S) != 0:
        raise TimeoutError(f"{what} were not delivered in {WAIT_S:g} s")


class _Batch(NamedTuple):
    offset: int
    producer_id: int
    epoch: int
    sequence: int
    marker: str | None  # "COMMIT" or "ABORT" for a transaction marker
    values: list[bytes]


def _read_back(root: str, probe: int | None, say: Say, failures: list[str]) -> None:
    """The counters as the server stored them: the probe's one batch, and the epochs of the transactions."""
    with LogManager.open(root, progress=False) as manager:
        seq_batches = _batches(manager.log(SEQ_TOPIC, 0, create=False))
        txn_batches = _batches(manager.log(TXN_TOPIC, 0, create=False))
    probes = [b for b in seq_batches if PROBE in b.values]
    seen = "; ".join(
        f"offset {b.offset}: producer {b.producer_id} epoch {b.epoch} seq {b.sequence}" for b in probes
    )
    say(f"   SIGTERM; the server's log, read back: {SEQ_TOPIC}-0 holds {PROBE.decode()!r} once ({seen})")
    if probe is not None and [b.offset for b in probes] != [probe]:
        failures.append(f"{SEQ_TOPIC}-0 holds {PROBE.decode()!r} in {len(probes)} batches: {seen}")
    epochs = {
        "A's records": [b.epoch for b in txn_batches if b.values and b.values[0].startswith(b"A-")],
        "the ABORT marker": [b.epoch for b in txn_batches if b.marker == "ABORT"],
        "B's records": [b.epoch for b in txn_batches if b.values and b.values[0].startswith(b"B-")],
        "COMMIT": [b.epoch for b in txn_batches if b.marker == "COMMIT"],
    }
    shown = ", ".join(f"{what} {'/'.join(map(str, found)) or '-'}" for what, found in epochs.items())
    producers = sorted({b.producer_id for b in txn_batches})
    say(f"   {TXN_TOPIC}-0, producer id {'/'.join(map(str, producers))}, epochs: {shown}")
    a, abort, b, commit = epochs.values()
    if not (len(a) == len(abort) == len(b) == len(commit) == 1 and a[0] < abort[0] <= b[0] == commit[0]):
        failures.append(f"{TXN_TOPIC}-0 epochs: {shown}")


def _batches(log: Log) -> list[_Batch]:
    found: list[_Batch] = []
    offset = 0
    while (fetched := log.read(offset, 1 << 20)).batches:
        for batch in fetched.batches:
            decoded = decode_txn_marker(batch) if batch.is_control else None
            marker = None if decoded is None else "COMMIT" if decoded.commit else "ABORT"
            values = [] if batch.is_control else [record.value or b"" for record in batch.records()]
            meta = (batch.base_offset, batch.producer_id, batch.producer_epoch, batch.base_sequence)
            found.append(_Batch(*meta, marker, values))
        offset = fetched.next_offset
    return found
