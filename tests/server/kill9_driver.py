"""Kill -9 end to end: idempotent Kafka producers stream into `oncelog serve` while it is SIGKILLed.

One scenario: a server subprocess (ServeProcess), two producer subprocesses (confluent-kafka and
kafka-python 3.x, both idempotent, acks=all, unlimited retries) each sending N uniquely numbered
messages (b"confluent-000123", b"kafka-python-000123") into one shared topic, and K SIGKILLs of the
server at seeded random moments while both are sending, each followed at once by a restart on the
same port. When the producers have flushed, a confluent-kafka consumer reads every partition from
offset 0 (assign(), no group) and each client's messages are counted: every acknowledged message must
be there exactly once, no message at all twice, and (retries being unlimited) no delivery may fail.

The clients reach the server through AckHoldingRelay, which the server advertises. Half the kills
(seeded) hold back a Produce acknowledgement first: the batch is in the log, its producer never
hears so, and after the restart it retries the batch, which the recovered producer state must
recognise as a duplicate. The other kills land blind. (A blind kill hardly ever falls between an
append and its response: with idempotence turned off in the clients, 28 blind kills on direct
connections left no duplicate, while 10 of 10 held-back acknowledgements duplicated a batch.)

The same driver runs the short variant of the normal test run and the long soak (`make serve-soak`):

    ONCELOG_KILL9_MESSAGES  messages per client (default 3000)
    ONCELOG_KILL9_KILLS     SIGKILLs per scenario (default 5)
    ONCELOG_KILL9_SEED      the seed of the kill moments (default: from the clock; always printed)

The producers pace their sends over a window long enough for every kill (drawn from the seed before
the first send), so every kill lands while both still have messages to send, and each gap before a
kill starts only once both producers are acknowledged again by the restarted server. Each kill
records what each producer had sent and had acknowledged at that moment; a kill that finds a
producer done, or a producer that is not acknowledged again after a restart, is a problem.

A producer runs as `python kill9_driver.py produce ...`: it prints `progress SENT ACKED FAILED` lines
while it runs and writes its delivery reports as JSON when it has flushed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_process import ServeProcess, free_port

from oncelog.bench.relay import AckHoldingRelay

CLIENTS = ("confluent", "kafka-python")
# 2023-01-01T00:00:00Z: message i of the CreateTime scenario carries this + i.
CREATE_TIME_2023_MS = 1_672_531_200_000
DEFAULT_MESSAGES = 3000
DEFAULT_KILLS = 5
# A kill comes this long after the previous restart (or after both producers are streaming).
MIN_GAP_S, MAX_GAP_S = 0.2, 1.5
# What the pacing allows for each kill's restart (~0.5 s) and for the clients to be acknowledged
# again (librdkafka takes up to ~1.5 s to look up the leader again); slack keeps every kill inside
# the send window on a slow machine.
RESTART_ALLOWANCE_S = 3.0
RESUME_TIMEOUT_S = 30.0
# How long a kill that holds back an acknowledgement waits for a Produce response to hold.
HOLD_TIMEOUT_S = 3.0
PACE_TAIL_S = 2.0
# Producers: how long a message may wait for its acknowledgement, and the final flush.
DELIVERY_TIMEOUT_MS = 120_000
FLUSH_TIMEOUT_S = 180.0
STREAMING_TIMEOUT_S = 60.0
RESTART_ATTEMPTS = 3
CONSUME_TIMEOUT_S = 120.0
PARTITIONS = 3
_MAX_RETRIES = 2**31 - 1


def value_of(client: str, index: int) -> bytes:
    return f"{client}-{index:06d}".encode()


def parse_value(value: bytes) -> tuple[str, int] | None:
    """(client, index) of a value made by value_of; None for anything else."""
    client, sep, number = value.decode("ascii", "replace").rpartition("-")
    if not sep or client not in CLIENTS or not number.isdigit():
        return None
    return client, int(number)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text else default


@dataclass(frozen=True)
class Kill9Config:
    name: str
    messages: int = DEFAULT_MESSAGES
    kills: int = DEFAULT_KILLS
    seed: int = 0
    # None: the clients stamp the send time; else message i carries timestamp_base + i (CreateTime).
    timestamp_base: int | None = None
    partitions: int = PARTITIONS

    @classmethod
    def from_env(cls, name: str, *, timestamp_base: int | None = None) -> Kill9Config:
        seed_text = os.environ.get("ONCELOG_KILL9_SEED", "").strip()
        return cls(
            name=name,
            messages=_env_int("ONCELOG_KILL9_MESSAGES", DEFAULT_MESSAGES),
            kills=_env_int("ONCELOG_KILL9_KILLS", DEFAULT_KILLS),
            seed=int(seed_text) if seed_text else time.time_ns() % 1_000_000_007,
            timestamp_base=timestamp_base,
        )

    def schedule(self) -> tuple[list[tuple[float, bool]], float]:
        """([(the wait before a kill, whether it holds back an acknowledgement)], the send window).

        Half the kills (in seeded order) hold back a Produce acknowledgement (AckHoldingRelay),
        the others land blind; the producers spread their sends over the send window.
        """
        rng = random.Random(f"{self.seed}:{self.name}")
        gaps = [rng.uniform(MIN_GAP_S, MAX_GAP_S) for _ in range(self.kills)]
        holds = [number % 2 == 1 for number in range(self.kills)]
        rng.shuffle(holds)
        return list(zip(gaps, holds, strict=True)), sum(gaps) + self.kills * RESTART_ALLOWANCE_S + PACE_TAIL_S


# -- the driver side --------------------------------------------------------------------------------


@dataclass
class ClientCounts:
    client: str
    sent: int = 0
    acked: int = 0
    failed: int = 0
    found: int = 0
    duplicates: int = 0  # messages present more than once
    lost: int = 0  # acknowledged, not present
    unacked_found: int = 0  # not acknowledged (failed or unreported), present once: allowed
    wrong_timestamp: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    duplicate_examples: list[int] = field(default_factory=list)
    lost_examples: list[int] = field(default_factory=list)

    def line(self) -> str:
        text = (
            f"{self.client:>12}: sent {self.sent}, acked {self.acked}, failed {self.failed}, "
            f"found {self.found}, duplicates {self.duplicates}, lost {self.lost}, "
            f"unacked found {self.unacked_found}, wrong timestamp {self.wrong_timestamp}"
        )
        if self.errors:
            text += f"; delivery errors {self.errors}"
        if self.duplicate_examples:
            text += f"; duplicated e.g. {self.duplicate_examples}"
        if self.lost_examples:
            text += f"; lost e.g. {self.lost_examples}"
        return text


@dataclass
class KillRecord:
    number: int
    at_s: float  # since the producers started
    restart_s: float  # from the SIGKILL to the restarted server listening
    progress: dict[str, tuple[int, int, int]]  # client -> (sent, acked, failed) at the kill
    held: str | None = None  # the Produce response held back from its client, if any
    # client -> seconds from the restart to its first acknowledgement by the new server
    resumed_s: dict[str, float] = field(default_factory=dict)

    def line(self, messages: int) -> str:
        states = ", ".join(
            f"{client} sent {sent}/{messages} acked {acked} in flight {sent - acked - failed}"
            for client, (sent, acked, failed) in self.progress.items()
        )
        resumed = ", ".join(f"{client} {s:.2f} s" for client, s in self.resumed_s.items())
        how = f"holding back the acknowledgement to {self.held}" if self.held else "blind"
        return (
            f"kill {self.number} at {self.at_s:6.2f} s, {how}: {states}; restarted in "
            f"{self.restart_s:.2f} s, acknowledging again after {resumed or '-'}"
        )


@dataclass
class Kill9Outcome:
    config: Kill9Config
    pace_s: float = 0.0
    counts: dict[str, ClientCounts] = field(default_factory=dict)
    kills: list[KillRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    producer_logs: dict[str, str] = field(default_factory=dict)
    server_log: str = ""
    elapsed_s: float = 0.0
    stray_values: int = 0

    def summary(self) -> str:
        config = self.config
        lines = [
            f"kill -9 scenario {config.name!r}: seed {config.seed} (ONCELOG_KILL9_SEED={config.seed}), "
            f"{config.messages} messages per client, {len(self.kills)}/{config.kills} kills, "
            f"sends paced over {self.pace_s:.1f} s, {self.elapsed_s:.1f} s in all",
            *(kill.line(config.messages) for kill in self.kills),
            *(counts.line() for counts in self.counts.values()),
            *self.notes,
        ]
        if self.stray_values:
            lines.append(f"{self.stray_values} records whose value no producer sent")
        return "\n".join(lines)

    def report(self) -> str:
        """The summary, the problems and (when there are problems) the logs."""
        text = self.summary()
        if not self.problems:
            return text
        text += "\nPROBLEMS:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        for client, output in self.producer_logs.items():
            text += f"\n--- {client} producer output (tail) ---\n{output}"
        return text + f"\n--- server log (tail) ---\n{self.server_log}"


class ProducerProcess:
    """One producer subprocess and its latest `progress` line."""

    def __init__(
        self, client: str, bootstrap: str, topic: str, config: Kill9Config, pace_s: float, out: Path
    ):
        self.client = client
        self.result_path = out
        command = [sys.executable, str(Path(__file__).resolve()), "produce", client, bootstrap, topic]
        command += ["--messages", str(config.messages), "--pace", f"{pace_s:.3f}", "--result", str(out)]
        if config.timestamp_base is not None:
            command += ["--timestamp-base", str(config.timestamp_base)]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.progress = (0, 0, 0)
        self.output: collections.deque[str] = collections.deque(maxlen=150)
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if len(words) == 4 and words[0] == "progress":
                self.progress = (int(words[1]), int(words[2]), int(words[3]))
            else:
                self.output.append(line.rstrip("\n"))

    def log(self) -> str:
        self._pump.join(2)
        return "\n".join(self.output)

    def result(self) -> dict[str, Any] | None:
        try:
            loaded: dict[str, Any] = json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            return None
        return loaded

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _wait(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(step_s)
    return True


def _restart(server: ServeProcess, outcome: Kill9Outcome, number: int) -> bool:
    """Start the killed server again on its port; a failed start is a problem (retried a little)."""
    for attempt in range(1, RESTART_ATTEMPTS + 1):
        try:
            server.start()
            return True
        except RuntimeError as exc:
            first_line = str(exc).splitlines()[0]
            outcome.problems.append(f"restart after kill {number} failed (attempt {attempt}): {first_line}")
            server.kill()
            time.sleep(0.5)
    return False


def run_kill9(root: Path, config: Kill9Config) -> Kill9Outcome:
    """Run one scenario under `root` (a fresh directory); the outcome lists every problem found."""
    outcome = Kill9Outcome(config)
    kills, outcome.pace_s = config.schedule()
    started = time.monotonic()
    topic = f"kill9-{config.name}-{uuid.uuid4().hex[:8]}"
    port = free_port()
    relay = AckHoldingRelay(port)
    server = ServeProcess(
        root / "serve", "--partitions", str(config.partitions), "--advertise", relay.address, port=port
    )
    producers: dict[str, ProducerProcess] = {}
    server.start()
    try:
        for client in CLIENTS:
            result_path = root / f"{client}-result.json"
            producers[client] = ProducerProcess(
                client, relay.address, topic, config, outcome.pace_s, result_path
            )
        if _kill_while_streaming(server, relay, producers, kills, outcome, started):
            results = _finish_producers(producers, outcome)
            if len(results) == len(CLIENTS):
                _consume_and_count(relay.address, topic, config, results, outcome)
    finally:
        for producer in producers.values():
            producer.stop()
            outcome.producer_logs[producer.client] = producer.log()
        outcome.server_log = server.log()
        server.kill()
        relay.close()
        outcome.elapsed_s = time.monotonic() - started
    return outcome


def _kill_while_streaming(
    server: ServeProcess,
    relay: AckHoldingRelay,
    producers: dict[str, ProducerProcess],
    kills: list[tuple[float, bool]],
    outcome: Kill9Outcome,
    started: float,
) -> bool:
    """Kill after each gap, restart at once; False if the server could not be restarted.

    Each gap starts once both producers are being acknowledged by the running server (at first,
    and again after every restart), so every kill cuts live traffic rather than a client still
    reconnecting; a producer that gets no acknowledgement after a restart is a problem.
    """
    rng = random.Random(f"{outcome.config.seed}:{outcome.config.name}:down")
    if not _resumed(producers, outcome, None, {client: 0 for client in producers}, STREAMING_TIMEOUT_S):
        return False
    for number, (gap, hold) in enumerate(kills, start=1):
        time.sleep(gap)
        held = None
        if hold:
            if relay.arm().wait(HOLD_TIMEOUT_S):
                held = relay.held
            else:
                relay.disarm()
                outcome.notes.append(f"kill {number}: no Produce response to hold back in {HOLD_TIMEOUT_S} s")
        progress = {client: producer.progress for client, producer in producers.items()}
        killed_at = time.monotonic()
        server.kill()
        time.sleep(rng.uniform(0.0, 0.3))  # down for a moment: the clients see refused connections
        restarted = _restart(server, outcome, number)
        kill = KillRecord(number, killed_at - started, time.monotonic() - killed_at, progress, held)
        outcome.kills.append(kill)
        done = [c for c, (sent, _, _) in progress.items() if sent >= outcome.config.messages]
        if done:
            outcome.problems.append(
                f"kill {number} came after {', '.join(done)} had sent everything: not mid-stream"
            )
        if not restarted:
            return False
        baseline = {client: producer.progress[1] for client, producer in producers.items()}
        if not _resumed(producers, outcome, kill, baseline, RESUME_TIMEOUT_S):
            return False
    return True


def _resumed(
    producers: dict[str, ProducerProcess],
    outcome: Kill9Outcome,
    kill: KillRecord | None,
    baseline: dict[str, int],
    timeout_s: float,
) -> bool:
    """Wait until every producer has an acknowledgement past `baseline` (or has finished)."""
    since = time.monotonic()
    waiting = set(producers)
    while waiting:
        for client in sorted(waiting):
            producer = producers[client]
            sent, acked, failed = producer.progress
            finished = sent >= outcome.config.messages and acked + failed >= sent
            if acked > baseline[client] or finished or producer.proc.poll() is not None:
                waiting.discard(client)
                if kill is not None:
                    kill.resumed_s[client] = time.monotonic() - since
        if time.monotonic() - since > timeout_s:
            after = f"restart {kill.number}" if kill is not None else "the start"
            outcome.problems.append(
                f"no acknowledgement for {', '.join(sorted(waiting))} within {timeout_s} s of {after}: "
                + ", ".join(f"{c} (sent, acked, failed) {producers[c].progress}" for c in sorted(waiting))
            )
            return False
        time.sleep(0.01)
    return True


def _finish_producers(producers: dict[str, ProducerProcess], outcome: Kill9Outcome) -> dict[str, Any]:
    """Wait for every producer to flush and exit; their delivery reports, by client."""
    results: dict[str, Any] = {}
    deadline = time.monotonic() + outcome.pace_s + FLUSH_TIMEOUT_S + 30
    for client, producer in producers.items():
        try:
            code = producer.proc.wait(max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            outcome.problems.append(
                f"the {client} producer had not finished {FLUSH_TIMEOUT_S} s after its flush"
            )
            continue
        result = producer.result()
        if code != 0 or result is None:
            outcome.problems.append(f"the {client} producer exited {code} without its delivery reports")
            continue
        results[client] = result
        if result["unresolved"]:
            outcome.problems.append(
                f"the {client} producer's flush left {result['unresolved']} messages "
                "without a delivery report"
            )
    return results


def _consume_and_count(
    bootstrap: str, topic: str, config: Kill9Config, results: dict[str, Any], outcome: Kill9Outcome
) -> None:
    copies: dict[str, collections.Counter[int]] = {client: collections.Counter() for client in CLIENTS}
    bad_timestamps: dict[str, set[int]] = {client: set() for client in CLIENTS}
    for value, timestamp in _read_everything(bootstrap, topic, outcome):
        parsed = parse_value(value)
        if parsed is None or not 0 <= parsed[1] < config.messages:
            outcome.stray_values += 1
            continue
        client, index = parsed
        copies[client][index] += 1
        if config.timestamp_base is not None and timestamp != config.timestamp_base + index:
            bad_timestamps[client].add(index)
    if outcome.stray_values:
        outcome.problems.append(f"{outcome.stray_values} records hold a value no producer sent")
    for client in CLIENTS:
        outcome.counts[client] = counts = count_copies(client, results[client], copies[client])
        counts.wrong_timestamp = len(bad_timestamps[client])
        if counts.failed:
            # Unlimited retries and a long delivery timeout: only a non-retriable answer fails one.
            outcome.problems.append(
                f"{client}: {counts.failed} messages failed delivery ({counts.errors}), "
                "though the producer retries without limit"
            )
        if counts.lost:
            outcome.problems.append(
                f"{client}: {counts.lost} acknowledged messages are missing, e.g. {counts.lost_examples}"
            )
        if counts.duplicates:
            outcome.problems.append(
                f"{client}: {counts.duplicates} messages are present more than once, "
                f"e.g. {counts.duplicate_examples}"
            )
        if counts.wrong_timestamp:
            outcome.problems.append(
                f"{client}: {counts.wrong_timestamp} messages lost their CreateTime "
                f"(expected {config.timestamp_base} + i), e.g. {sorted(bad_timestamps[client])[:10]}"
            )


def count_copies(client: str, result: dict[str, Any], copies: collections.Counter[int]) -> ClientCounts:
    """One client's counts from its delivery reports and the copies of each of its messages read."""
    acked = set(result["acked"])
    counts = ClientCounts(
        client, sent=result["sent"], acked=len(acked), failed=len(result["failed"]), errors=result["errors"]
    )
    counts.found = len(copies)
    duplicated = sorted(index for index, n in copies.items() if n > 1)
    lost = sorted(acked - copies.keys())
    counts.duplicates, counts.duplicate_examples = len(duplicated), duplicated[:10]
    counts.lost, counts.lost_examples = len(lost), lost[:10]
    counts.unacked_found = len(copies.keys() - acked)
    return counts


def _read_everything(bootstrap: str, topic: str, outcome: Kill9Outcome) -> Iterable[tuple[bytes, int]]:
    """(value, CreateTime) of every record of `topic`, every partition from offset 0 to its end."""
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kill9-check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        assigned = [TopicPartition(topic, partition, 0) for partition in partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in assigned}
        consumer.assign(assigned)
        positions = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(positions[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                outcome.problems.append(
                    f"the consumer stalled at {positions} of ends {ends} after {CONSUME_TIMEOUT_S} s"
                )
                return
            for message in consumer.consume(1000, timeout=1.0):
                if message.error() is not None:
                    outcome.problems.append(f"consumer error: {message.error()}")
                    return
                positions[message.partition()] = message.offset() + 1
                kind, timestamp = message.timestamp()
                yield message.value() or b"", timestamp if kind == TIMESTAMP_CREATE_TIME else -1
        outcome.notes.append(f"read {sum(ends.values())} records from partitions ending at {ends}")
    finally:
        consumer.close()


# -- the producer side (a subprocess) ---------------------------------------------------------------


class _Reports:
    """Delivery reports as they arrive (from the client's thread for kafka-python)."""

    def __init__(self) -> None:
        self.sent = 0
        self.acked: set[int] = set()
        self.failed: set[int] = set()
        self.errors: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def ok(self, index: int) -> None:
        with self.lock:
            self.acked.add(index)

    def fail(self, index: int, error: object) -> None:
        with self.lock:
            self.failed.add(index)
            self.errors[str(error)[:200]] += 1

    def line(self) -> str:
        with self.lock:
            return f"progress {self.sent} {len(self.acked)} {len(self.failed)}"

    def save(self, path: Path, messages: int) -> None:
        with self.lock:
            unresolved = self.sent - len(self.acked | self.failed)
            document = {
                "sent": self.sent,
                "acked": sorted(self.acked),
                "failed": sorted(self.failed - self.acked),
                "errors": dict(self.errors),
                "unresolved": unresolved,
                "messages": messages,
            }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document))
        tmp.replace(path)


def _paced(messages: int, pace_s: float, idle: Callable[[float], None]) -> Iterable[int]:
    """0..messages-1, message i not before pace_s * i / messages from now."""
    start = time.monotonic()
    for index in range(messages):
        due = start + pace_s * index / messages
        while (wait := due - time.monotonic()) > 0:
            idle(min(wait, 0.05))
        yield index


def _produce_confluent(args: argparse.Namespace, reports: _Reports) -> None:
    from confluent_kafka import KafkaException, Producer

    errors_shown = 0

    def on_error(error: Any) -> None:
        nonlocal errors_shown
        if error.fatal() or errors_shown < 20:
            errors_shown += 1
            print(f"client error: {error}", flush=True)

    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "retries": _MAX_RETRIES,
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "linger.ms": 5,
            "error_cb": on_error,
        }
    )

    def on_delivery(error: Any, message: Any) -> None:
        parsed = parse_value(message.value())
        assert parsed is not None
        if error is None:
            reports.ok(parsed[1])
        else:
            reports.fail(parsed[1], error)

    for index in _paced(args.messages, args.pace, producer.poll):
        options: dict[str, Any] = {}
        if args.timestamp_base is not None:
            options["timestamp"] = args.timestamp_base + index
        while True:
            try:
                producer.produce(args.topic, value_of(args.client, index), on_delivery=on_delivery, **options)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: wait for deliveries
            except KafkaException as exc:
                reports.fail(index, exc)
                break
        reports.sent += 1
        producer.poll(0)
    producer.flush(FLUSH_TIMEOUT_S)


def _produce_kafka_python(args: argparse.Namespace, reports: _Reports) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=args.bootstrap,
        enable_idempotence=True,
        acks="all",
        retries=_MAX_RETRIES,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
        request_timeout_ms=30_000,
        max_block_ms=DELIVERY_TIMEOUT_MS,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
        linger_ms=5,
    )
    for index in _paced(args.messages, args.pace, time.sleep):
        try:
            future = producer.send(
                args.topic, value=value_of(args.client, index), timestamp_ms=_timestamp(args, index)
            )
        except Exception as exc:  # a fatal producer state: the message was not sent
            reports.fail(index, repr(exc))
        else:
            future.add_callback(lambda _metadata, index=index: reports.ok(index))
            future.add_errback(lambda error, index=index: reports.fail(index, repr(error)))
        reports.sent += 1
    try:
        producer.flush(timeout=FLUSH_TIMEOUT_S)
    finally:
        producer.close(timeout=10)


def _timestamp(args: argparse.Namespace, index: int) -> int | None:
    return None if args.timestamp_base is None else args.timestamp_base + index


def produce_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kill9_driver.py produce")
    parser.add_argument("client", choices=CLIENTS)
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--pace", type=float, required=True, help="seconds to spread the sends over")
    parser.add_argument("--timestamp-base", type=int, default=None)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    reports = _Reports()
    finished = threading.Event()

    def report_progress() -> None:
        while not finished.wait(0.05):
            print(reports.line(), flush=True)

    threading.Thread(target=report_progress, daemon=True).start()
    try:
        if args.client == "confluent":
            _produce_confluent(args, reports)
        else:
            _produce_kafka_python(args, reports)
    finally:
        finished.set()
        print(reports.line(), flush=True)
        reports.save(args.result, args.messages)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["produce"]:
        sys.exit("usage: kill9_driver.py produce CLIENT BOOTSTRAP TOPIC --messages N --pace S --result PATH")
    sys.exit(produce_main(sys.argv[2:]))
