"""Exactly once end to end: a transactional consume-transform-produce app while server and app are SIGKILLed.

run_eos: `oncelog serve` (ServeProcess) on a fresh root; N numbered input records (key = value =
the decimal number, produced idempotently up front) in an input topic; the app (eos_app.py, a
subprocess: a read_committed group consumer and a transactional producer whose transactions also
commit the consumer's offsets) maps each one to one output record. At seeded random moments the
server is SIGKILLed and restarted on its port, or the app is SIGKILLed and started again (same
group, same transactional id); each gap before a kill starts once the app has committed since the
kill before. The app holds each transaction open a while (first with its records sent, then with
its offsets sent too), so the input outlasts the kills and most kills cut a transaction at one of
those two points. Then the app runs to the input's end and exits 0 (one that exits non-zero on a
fatal error is started again), and a read_committed consumer (assign(), no group) reads the output
to its end: every input number exactly once; the group's committed offsets must be the input's
end offsets.

`mock=True` (`--mock`) runs the app and the checks against librdkafka's mock cluster instead: no
server kills; topics auto-created with 4 partitions (it has no CreateTopics); and its
TxnOffsetCommit stores nothing, so the committed offsets are only noted and a restarted app
processes everything again (app kills there must duplicate: a check of the checks).

    ONCELOG_EOS_MESSAGES  input records (default 50000)
    ONCELOG_EOS_KILLS     server kills and app kills, each (default 3)
    ONCELOG_EOS_SEED      the seed of the kill moments (default: from the clock; always printed)
    ONCELOG_EOS_DEBUG     librdkafka debug contexts for the app (e.g. cgrp,eos,protocol; in TMP/app.log)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kill9_driver import _env_int, _restart, _wait

from oncelog.bench.serve_process import ServeProcess

APP = Path(__file__).with_name("eos_app.py")
DEFAULT_MESSAGES, DEFAULT_PARTITIONS, DEFAULT_KILLS = 50_000, 3, 3
MIN_GAP_S, MAX_GAP_S = 0.5, 3.0  # from the app's first commit after a kill to the next kill
STREAMING_TIMEOUT_S = 90.0  # to the app's first commit
RESUME_TIMEOUT_S = 120.0  # to its first commit after a kill (a restarted app waits out its dead member)
FINISH_TIMEOUT_S = 600.0
APP_MAX_SECONDS = 1800.0
MAX_FATAL_RESTARTS = 20
READ_TIMEOUT_S = 120.0
EXAMPLES = 10


@dataclass(frozen=True)
class EosConfig:
    messages: int = DEFAULT_MESSAGES
    partitions: int = DEFAULT_PARTITIONS
    server_kills: int = DEFAULT_KILLS
    app_kills: int = DEFAULT_KILLS
    seed: int = 0
    mock: bool = False
    batch: int | None = None  # input records per transaction; None: from the size and the kills

    @classmethod
    def from_env(
        cls, *, messages: int = DEFAULT_MESSAGES, kills: int = DEFAULT_KILLS, **overrides: Any
    ) -> EosConfig:
        """The environment's knobs, defaulting to `messages` and `kills` (of each kind); overrides win."""
        seed_text = os.environ.get("ONCELOG_EOS_SEED", "").strip()
        kills = _env_int("ONCELOG_EOS_KILLS", kills)
        seed = int(seed_text) if seed_text else time.time_ns() % 1_000_000_007
        config = cls(
            _env_int("ONCELOG_EOS_MESSAGES", messages), server_kills=kills, app_kills=kills, seed=seed
        )
        return replace(config, **overrides)

    def schedule(self) -> list[tuple[str, float]]:
        """[(what to kill, the gap before the kill)], the targets in seeded order; no server with mock."""
        rng = random.Random(f"{self.seed}:eos")
        targets = ["app"] * self.app_kills + ([] if self.mock else ["server"] * self.server_kills)
        rng.shuffle(targets)
        return [(target, rng.uniform(MIN_GAP_S, MAX_GAP_S)) for target in targets]

    def batch_size(self) -> int:
        return self.batch or max(20, min(500, self.messages // max(1, 8 * len(self.schedule()))))

    def pause_ms(self) -> float:
        """How long each transaction stays open, so that the input outlasts the kills (0 without kills)."""
        schedule = self.schedule()
        pace_s = sum(gap for _, gap in schedule) + len(schedule) + 5.0 if schedule else 0.0
        return 1000 * pace_s / max(1, self.messages // self.batch_size())


@dataclass
class OutputCounts:
    read: int = 0  # output records read (read_committed)
    copies: collections.Counter[int] = field(default_factory=collections.Counter)  # input number -> copies
    missing: list[int] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)  # records that map back to no input number

    @property
    def duplicated(self) -> list[tuple[int, int]]:
        """(input number, copies) of each input with more than one output, by number."""
        return sorted((number, n) for number, n in self.copies.items() if n > 1)

    def line(self) -> str:
        duplicated = self.duplicated
        return (
            f"output: {self.read} records, {len(self.copies)} distinct inputs, {len(duplicated)} duplicated "
            f"{duplicated[:EXAMPLES]}, {len(self.missing)} missing {self.missing[:EXAMPLES]}, "
            f"{len(self.strays)} stray {self.strays[:EXAMPLES]}"
        )


def count_outputs(messages: int, records: Iterable[tuple[bytes | None, bytes | None]]) -> OutputCounts:
    """Map each output record (key, value) back to its input number and count the copies of each."""
    counts = OutputCounts()
    for key, value in records:
        counts.read += 1
        text = (value or b"").removeprefix(b"out:")
        if value is None or text == value or not text.isdigit() or key != text or int(text) >= messages:
            counts.strays.append(f"{key!r}={value!r}")
        else:
            counts.copies[int(text)] += 1
    counts.missing = sorted(set(range(messages)) - counts.copies.keys())
    return counts


@dataclass
class EosOutcome:
    config: EosConfig
    partitions: int = 0
    input_ends: dict[int, int] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)  # the group's, after the run
    kills: list[str] = field(default_factory=list)  # a line per kill
    counts: OutputCounts | None = None
    uncommitted_read: int = 0  # output records a read_uncommitted consumer reads (aborted ones too)
    app_starts: int = 0
    transactions: int = 0  # committed, as the app reported them
    aborts: int = 0
    fatal_exits: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    app_log: str = ""
    app_log_path: Path | None = None
    server_log: str = ""
    elapsed_s: float = 0.0

    def summary(self) -> str:
        config = self.config
        lines = [
            f"eos scenario on {'the librdkafka mock cluster' if config.mock else 'oncelog serve'}: seed "
            f"{config.seed} (ONCELOG_EOS_SEED={config.seed}), {config.messages} inputs in {self.partitions} "
            f"partitions, batches of {config.batch_size()}, {len(self.kills)} kills, {self.elapsed_s:.1f} s",
            f"app: {self.app_starts} starts, {self.transactions} transactions committed, "
            f"{self.aborts} aborted, {len(self.fatal_exits)} fatal exits",
            *self.kills,
            *([self.counts.line()] if self.counts else []),
            f"output read_uncommitted: {self.uncommitted_read} records",
            f"input ends {self.input_ends}, the group's committed offsets {self.committed}",
            *self.notes,
            *(f"fatal exit: {line}" for line in self.fatal_exits[:EXAMPLES]),
        ]
        return "\n".join(lines)

    def report(self) -> str:
        """The summary, the problems and (when there are problems) the logs."""
        text = self.summary()
        if not self.problems:
            return text
        text += "\nPROBLEMS:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        text += f"\n--- app output (tail; all of it: {self.app_log_path}) ---\n{self.app_log}"
        return f"{text}\n--- server log (tail) ---\n{self.server_log}"


class AppProcess:
    """The app subprocess, started again as needed; what it committed, parsed from its stdout."""

    def __init__(
        self, bootstrap: str, topics: tuple[str, str], config: EosConfig, outcome: EosOutcome, log_path: Path
    ):
        self.group, txn = f"eos-group-{uuid.uuid4().hex[:8]}", f"eos-txn-{uuid.uuid4().hex[:8]}"
        self.command = [sys.executable, str(APP), "--bootstrap", bootstrap, "--input", topics[0]]
        self.command += ["--output", topics[1], "--group", self.group, "--transactional-id", txn]
        self.command += ["--batch", str(config.batch_size()), "--pause-ms", f"{config.pause_ms():.1f}"]
        debug = os.environ.get("ONCELOG_EOS_DEBUG", "")
        self.command += ["--max-seconds", str(APP_MAX_SECONDS), "--debug", debug]
        self.log_path = log_path
        self.outcome = outcome
        self.proc: subprocess.Popen[str] | None = None
        self.pump: threading.Thread | None = None
        self.offsets: dict[int, int] = {}  # the positions of the latest commit, by input partition
        self.output: collections.deque[str] = collections.deque(maxlen=300)
        self.done: str | None = None

    def start(self) -> None:
        self.done = None
        self.outcome.app_starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.pump = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self.pump.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with self.log_path.open("a") as log:
            for line in proc.stdout:
                log.write(f"[{self.outcome.app_starts}] {line}")
                self._parse(line)

    def _parse(self, line: str) -> None:
        kind, _, rest = line.rstrip().partition(" ")
        if kind == "commit":  # commit TXN MESSAGES P:OFFSET,... (too many to keep in the tail)
            self.outcome.transactions += 1
            words = rest.split()
            for item in filter(None, words[2].split(",") if len(words) > 2 else []):
                partition, _, offset = item.partition(":")
                self.offsets[int(partition)] = int(offset)
            return
        if kind == "abort":
            self.outcome.aborts += 1
        elif kind == "done":
            self.done = rest
        self.output.append(f"[{self.outcome.app_starts}] {line.rstrip()}")

    def processed(self) -> int:
        return sum(self.offsets.values())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def supervise(self) -> bool:
        """True while the app runs (starting it again after a fatal exit); False once it exited 0."""
        code = None if self.proc is None else self.proc.poll()
        if code is None or code == 0 or len(self.outcome.fatal_exits) > MAX_FATAL_RESTARTS:
            return code is None
        fatal = next((line for line in reversed(self.output) if " fatal " in line), "no fatal line")
        self.outcome.fatal_exits.append(f"exit {code}: {fatal}")
        if len(self.outcome.fatal_exits) > MAX_FATAL_RESTARTS:
            self.outcome.problems.append(f"the app exited non-zero {MAX_FATAL_RESTARTS + 1} times")
            return False
        self.start()
        return True

    def wait_for_commit(self, timeout_s: float) -> float | None:
        """Seconds until the app's next commit (or its exit 0); None if neither comes in time."""
        since, baseline = time.monotonic(), self.outcome.transactions
        if _wait(lambda: not self.supervise() or self.outcome.transactions > baseline, timeout_s, 0.01):
            return time.monotonic() - since
        return None


def run_eos(tmp_path: Path, config: EosConfig) -> EosOutcome:
    """Run the scenario under `tmp_path` (a fresh directory); the outcome lists every problem found."""
    print(f"eos scenario: seed {config.seed} (ONCELOG_EOS_SEED={config.seed})", flush=True)
    outcome = EosOutcome(config)
    started = time.monotonic()
    topics = (f"eos-in-{uuid.uuid4().hex[:8]}", f"eos-out-{uuid.uuid4().hex[:8]}")
    server = None if config.mock else ServeProcess(tmp_path / "serve")
    app: AppProcess | None = None
    with contextlib.ExitStack() as stack:
        if server is None:
            from confluent_kafka import Producer

            mock = Producer({"test.mock.num.brokers": 1, "log_level": 4})  # the cluster lives as long
            stack.callback(mock.flush, 1)  # holds it until the scenario ends
            brokers = mock.list_topics(timeout=10).brokers.values()
            bootstrap = ",".join(f"{broker.host}:{broker.port}" for broker in brokers)
        else:
            stack.callback(server.kill)
            bootstrap = server.start().bootstrap
        try:
            if _set_up(bootstrap, topics, config, outcome):
                app = AppProcess(bootstrap, topics, config, outcome, tmp_path / "app.log")
                app.start()
                if _kill_while_processing(server, app, outcome, started) and _finish(app, outcome):
                    _verify(bootstrap, topics, app.group, outcome)
        finally:
            if app is not None:
                app.kill()
                outcome.app_log, outcome.app_log_path = "\n".join(app.output), app.log_path
            outcome.server_log = server.log() if server is not None else ""
            outcome.elapsed_s = time.monotonic() - started
    return outcome


def _set_up(bootstrap: str, topics: tuple[str, str], config: EosConfig, outcome: EosOutcome) -> bool:
    """Create both topics (not on the mock) and produce the numbered inputs; False on a problem."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if not config.mock:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for topic, future in admin.create_topics([NewTopic(t, config.partitions, 1) for t in topics]).items():
            try:
                future.result(timeout=30)
            except Exception as exc:
                outcome.problems.append(f"CreateTopics {topic}: {exc}")
                return False
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failed: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    for number in range(config.messages):
        text = str(number).encode()
        while True:
            try:
                producer.produce(topics[0], text, text, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    unflushed = producer.flush(120)
    if failed or unflushed:
        outcome.problems.append(f"input: {unflushed} unflushed, {len(failed)} failed, e.g. {failed[:3]}")
        return False
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eos-ends-{uuid.uuid4().hex[:8]}"})
    try:
        outcome.input_ends = _ends(consumer, topics[0])
    finally:
        consumer.close()
    outcome.partitions = len(outcome.input_ends)
    if sum(outcome.input_ends.values()) != config.messages:
        outcome.problems.append(f"the input holds {outcome.input_ends}, not {config.messages} records")
        return False
    return True


def _ends(consumer: Any, topic: str) -> dict[int, int]:
    """The high watermark of each partition of `topic`."""
    from confluent_kafka import TopicPartition

    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}


def _kill_while_processing(
    server: ServeProcess | None, app: AppProcess, outcome: EosOutcome, started: float
) -> bool:
    """Each kill once the app has committed since the kill before; False if it stops committing."""
    if app.wait_for_commit(STREAMING_TIMEOUT_S) is None:
        outcome.problems.append(f"the app committed no transaction within {STREAMING_TIMEOUT_S} s")
        return False
    rng = random.Random(f"{outcome.config.seed}:eos:down")
    messages = outcome.config.messages
    for number, (target, gap) in enumerate(outcome.config.schedule(), start=1):
        _wait(lambda: not app.supervise(), gap, 0.02)  # (an app that exits 0 ends the gap early)
        processed, killed_at = app.processed(), time.monotonic()
        if app.done is not None or processed >= messages:
            outcome.problems.append(f"kill {number} came after the app had processed everything")
            return True
        if target == "app":
            app.kill()
            app.start()
        else:
            assert server is not None
            server.kill()
            time.sleep(rng.uniform(0.0, 0.3))  # down for a moment: the clients see refused connections
            if not _restart(server, outcome, number):  # type: ignore[arg-type]  # it needs .problems only
                return False
        back_s, resumed_s = time.monotonic() - killed_at, app.wait_for_commit(RESUME_TIMEOUT_S)
        outcome.kills.append(
            f"kill {number} of the {target} at {killed_at - started:6.2f} s, {processed}/{messages} "
            f"processed; back in {back_s:.2f} s, committing again after "
            + ("never" if resumed_s is None else f"{resumed_s:.2f} s")
        )
        if resumed_s is None:
            outcome.problems.append(f"the app committed nothing within {RESUME_TIMEOUT_S} s of kill {number}")
            return False
    return True


def _finish(app: AppProcess, outcome: EosOutcome) -> bool:
    """Let the app run to the input's end; False if it does not get there."""
    timeout_s = max(FINISH_TIMEOUT_S, outcome.config.messages / 100)
    if not _wait(lambda: not app.supervise(), timeout_s, 0.05):
        outcome.problems.append(f"the app had not finished {timeout_s:.0f} s after the last kill")
        return False
    if app.pump is not None:
        app.pump.join(10)  # its last lines
    if app.done != "input-end":
        outcome.problems.append(f"the app stopped without reaching the input's end ({app.done})")
        return False
    return True


def _verify(bootstrap: str, topics: tuple[str, str], group: str, outcome: EosOutcome) -> None:
    """Every input number once in the committed output; the group's offsets at the input's ends."""
    from confluent_kafka import Consumer, TopicPartition

    outcome.counts = counts = count_outputs(
        outcome.config.messages, _read(bootstrap, topics[1], "read_committed", outcome)
    )
    outcome.uncommitted_read = sum(1 for _ in _read(bootstrap, topics[1], "read_uncommitted", outcome))
    if duplicated := counts.duplicated:
        outcome.problems.append(
            f"{len(duplicated)} inputs have several outputs, (input, copies) e.g. {duplicated[:EXAMPLES]}"
        )
    if counts.missing:
        outcome.problems.append(
            f"{len(counts.missing)} inputs have no output, e.g. {counts.missing[:EXAMPLES]}"
        )
    if counts.strays:
        outcome.problems.append(f"{len(counts.strays)} outputs map to no input: {counts.strays[:EXAMPLES]}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        answer = consumer.committed([TopicPartition(topics[0], p) for p in outcome.input_ends], timeout=30)
    finally:
        consumer.close()
    outcome.committed = {tp.partition: tp.offset for tp in answer}
    errors = [f"{tp.partition}: {tp.error}" for tp in answer if tp.error is not None]
    if errors or outcome.committed != outcome.input_ends:
        (outcome.notes if outcome.config.mock else outcome.problems).append(
            f"the group's committed offsets {outcome.committed} {errors or ''}are not the input's ends"
            + (" (the mock's TxnOffsetCommit stores nothing)" if outcome.config.mock else "")
        )


def _read(bootstrap: str, topic: str, isolation: str, outcome: EosOutcome) -> Iterator[tuple[Any, Any]]:
    """(key, value) of each record of `topic` visible at `isolation`, offset 0 to each partition's EOF.

    (A read_committed EOF is at the last stable offset; a marker takes an offset and is never read.)
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    config = {"bootstrap.servers": bootstrap, "group.id": f"eos-check-{uuid.uuid4().hex[:8]}"}
    consumer = Consumer({**config, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        ends = _ends(consumer, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        eof_at = dict.fromkeys(ends, -1)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while any(eof_at[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                outcome.problems.append(
                    f"{isolation}: the ends of file {eof_at} stay below the high watermarks {ends} "
                    f"after {READ_TIMEOUT_S} s (a transaction left open?)"
                )
                return
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is None:
                    yield message.key(), message.value()
                elif error.code() == KafkaError._PARTITION_EOF:
                    eof_at[message.partition()] = message.offset()
                else:
                    outcome.problems.append(f"{isolation} consumer error: {error}")
                    return
    finally:
        consumer.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mock", action="store_true", help="librdkafka's mock cluster, not oncelog serve")
    for name in ("messages", "partitions", "server-kills", "app-kills", "seed", "batch"):
        parser.add_argument(f"--{name}", type=int)
    args = parser.parse_args(argv)
    overrides = {name: value for name, value in vars(args).items() if value is not None}
    if args.mock:
        overrides.setdefault("app_kills", 0)
    config = EosConfig.from_env(**overrides)
    tmp = Path(tempfile.mkdtemp(prefix="oncelog-eos-"))
    outcome = run_eos(tmp, config)
    if not outcome.problems:  # else kept for the app's whole output
        shutil.rmtree(tmp)
    print(outcome.report(), flush=True)
    return 1 if outcome.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
