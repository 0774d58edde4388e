"""Descriptors and memory of `oncelog serve` over a long run with 1,000 rolling partitions (issue 28).

    make soak-resources                                        # 10 minutes
    SOAK_SECONDS=180 .venv/bin/python bench/soak_resources.py  # a trial

Why: a sealed segment holds no file descriptor until it is read (a bounded,
process-wide LRU cache, `segments.file_cache`, a quarter of the soft open-files limit,
at most 4,096), and index and write mappings hold none. Before that change a running
log kept 5 descriptors per rolled segment, so a server that rolled often ran out of
descriptors (here: after ~3,000 rolls). This soak shows whether the descriptors a server holds, and its
memory, stop growing once the cache is full, while segments keep rolling and piling up
on disk up to their topic's retention (SOAK_RETENTION_MS, 120 s; 0 keeps every segment).

What it does:

- a fresh root in a temporary directory (removed at the end) with 10 topics of 100
  partitions (1,000 partitions), each topic overridden to roll its segments every
  SOAK_SEGMENT_MS (5 s) or SOAK_SEGMENT_BYTES (64 KiB), whichever comes first.
  `oncelog serve` refuses topic configs in CreateTopics (INVALID_CONFIG), so the
  overrides are stored in the root first with `LogManager.set_topic_config` (the
  root's per-topic config, which the server opens every partition of the topic with);
  the topics are then created over the wire (an AdminClient's CreateTopics, 100
  partitions each, no configs);
- `python -m oncelog.cli serve ROOT` (`ServeProcess`) driven for SOAK_SECONDS (600) by
  SOAK_PRODUCERS (2) idempotent confluent-kafka producers (enable.idempotence=true,
  acks=all, linger.ms=1000) offering SOAK_RATE messages/s in all (1,000: about what
  `oncelog serve` keeps up with on 2 shared CPUs with batches of a message or two to
  each of 1,000 partitions) of 100-byte values, message n of a producer going to
  partition n % 1000, and SOAK_CONSUMERS (10) consumers in one consumer group
  subscribed to the 10 topics reading everything back as it comes. Ten, not two: a
  fetch waiting for data re-reads every partition it asks for each time an append to
  one of them wakes it, and librdkafka sends one partition per ProduceRequest, so with
  two consumers of 500 partitions each the re-reads took a third of the server's time
  and it acknowledged 300-800 of the 1,000 messages/s; with ten of 100 it keeps up;
- every SOAK_SAMPLE_SECONDS (10) the server process's open descriptors
  (`/proc/PID/fd`, split into segment `.log` files, sockets and the rest), its RSS
  (VmRSS, and of it RssAnon and RssFile), the segment files (`.log`) and all files
  under the root, the messages produced, acknowledged and consumed, its CPU time and
  the clients', and the load average;
- after the run the producers flush, the consumers drain (up to SOAK_DRAIN_SECONDS, 120),
  and every message is checked: each acknowledged message was consumed at the very
  offset its delivery report gave and at no other offset (a message at two offsets is
  a duplicate in the log; a consumer group re-reading an offset after a rebalance is
  counted apart, as a redelivery), no partition got a message meant for another, and
  every partition's high watermark equals the messages acknowledged to it and the
  offsets consumed from it (so its offsets are 0..n-1 with no gap); its low watermark is
  where retention moved its start;
- flatness: of the samples after the warm-up and before the drain, the mean of the last
  third against the mean of the first third, and the least-squares slope per minute,
  for descriptors and RSS. The warm-up lasts SOAK_WARMUP_SECONDS (120, or half the run
  if shorter), or longer, until the segment file cache is full (descriptors of segment
  files reach one a partition plus the cache's capacity).

Writes the samples to SOAK_OUT (default $TMPDIR/oncelog-soak-resources/: samples.csv,
summary.json with the figures, serve.log; printed) and plots them to SOAK_PLOT
(bench/soak_resources.png). Exits 1 if a message was lost, duplicated or misplaced, if
the descriptors grew by more than SOAK_FD_TOLERANCE (2%) of their level after the
warm-up, if the cache never filled, or if the server did not stop cleanly; RSS is
reported (flat: within 5%), not judged. A message whose delivery failed (librdkafka's
message.timeout.ms, 5 minutes, is left at its default) is a warning, not a loss, unless
it is in the log all the same.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from oncelog.bench.serve_process import ServeProcess
from oncelog.log_manager import LogManager
from oncelog.root_config import read_topic_config
from oncelog.segments import file_cache

TOPICS: Final = 10
PARTITIONS_PER_TOPIC: Final = 100
PARTITIONS: Final = TOPICS * PARTITIONS_PER_TOPIC
# How often the server applies retention (`--retention-check-ms`): well inside SOAK_RETENTION_MS.
RETENTION_CHECK_MS: Final = 10_000
PRODUCERS: Final = int(os.environ.get("SOAK_PRODUCERS", "2"))
CONSUMERS: Final = int(os.environ.get("SOAK_CONSUMERS", "10"))
GROUP: Final = "soak-resources"
VALUE_BYTES: Final = 100
HEADER: Final = struct.Struct(">HQ")  # producer, its message number; the rest of the value is filler
LINGER_MS: Final = 1000  # a partition gets a message every second or so: batch what comes
LOG_LEVEL: Final = 3  # librdkafka: errors only
FLUSH_TIMEOUT_S: Final = 120.0
ADMIN_TIMEOUT_S: Final = 60.0
WATERMARK_TIMEOUT_S: Final = 10.0
MIB: Final = 1024 * 1024
RSS_FLAT_SHARE: Final = 0.05  # RSS is called flat within this share of its level after the warm-up


def topic_name(index: int) -> str:
    return f"soak-{index}"


@dataclasses.dataclass(frozen=True)
class Settings:
    seconds: float
    rate: int
    segment_ms: int
    retention_ms: int  # each topic's retention.ms (0: none), so segments on disk level off
    segment_bytes: int
    warmup_s: float
    sample_s: float
    drain_s: float
    fd_tolerance: float
    out_dir: str
    plot_path: str
    scratch: str | None

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        seconds = float(env.get("SOAK_SECONDS", "600"))
        here = os.path.dirname(os.path.abspath(__file__))
        return cls(
            seconds=seconds,
            rate=int(env.get("SOAK_RATE", "1000")),
            segment_ms=int(env.get("SOAK_SEGMENT_MS", "5000")),
            retention_ms=int(env.get("SOAK_RETENTION_MS", "120000")),
            segment_bytes=int(env.get("SOAK_SEGMENT_BYTES", str(64 * 1024))),
            warmup_s=float(env.get("SOAK_WARMUP_SECONDS", str(min(120.0, seconds / 2)))),
            sample_s=float(env.get("SOAK_SAMPLE_SECONDS", "10")),
            drain_s=float(env.get("SOAK_DRAIN_SECONDS", "120")),
            fd_tolerance=float(env.get("SOAK_FD_TOLERANCE", "0.02")),
            out_dir=env.get("SOAK_OUT", os.path.join(tempfile.gettempdir(), "oncelog-soak-resources")),
            plot_path=env.get("SOAK_PLOT", os.path.join(here, "soak_resources.png")),
            scratch=env.get("SOAK_DIR") or None,
        )


# -- the ledger: what was acknowledged where, what was consumed where ---------------------------


def _grow(numbers: array[int], length: int) -> None:
    if len(numbers) < length:
        numbers.extend([-1] * max(length - len(numbers), 4096))


class Ledger:
    """Per producer, message n's acknowledged offset and consumed offset (-1: none yet)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.produced = [0] * PRODUCERS
        self.acked = [array("q") for _ in range(PRODUCERS)]
        self.consumed = [array("q") for _ in range(PRODUCERS)]
        self.acked_count = 0
        self.consumed_count = 0  # distinct messages
        self.redelivered = 0  # the same message at the same offset again (a group's at-least-once)
        self.duplicates = 0  # the same message at another offset: a duplicate in the log
        self.misrouted = 0
        self.delivery_errors = 0
        self.failed_to: dict[int, int] = {}  # partition: delivery errors
        self.first_errors: list[str] = []
        self.acked_to = [0] * PARTITIONS
        self.consumed_from = [0] * PARTITIONS
        self.max_offset = [-1] * PARTITIONS

    def error(self, text: str) -> None:
        with self.lock:
            if len(self.first_errors) < 10:
                self.first_errors.append(text)

    def ack(self, producer: int, number: int, partition: int, offset: int) -> None:
        with self.lock:
            _grow(self.acked[producer], number + 1)
            self.acked[producer][number] = offset
            self.acked_count += 1
            self.acked_to[partition] += 1

    def consume(self, messages: Sequence[Any], topic_index: dict[str, int]) -> None:
        with self.lock:
            for message in messages:
                if message.error() is not None:
                    if len(self.first_errors) < 10:
                        self.first_errors.append(f"consumer: {message.error()}")
                    continue
                producer, number = HEADER.unpack_from(message.value())
                partition = topic_index[message.topic()] * PARTITIONS_PER_TOPIC + message.partition()
                offset = message.offset()
                if number % PARTITIONS != partition or producer >= PRODUCERS:
                    self.misrouted += 1
                    continue
                consumed = self.consumed[producer]
                _grow(consumed, number + 1)
                seen = consumed[number]
                if seen == -1:
                    consumed[number] = offset
                    self.consumed_count += 1
                    self.consumed_from[partition] += 1
                    self.max_offset[partition] = max(self.max_offset[partition], offset)
                elif seen == offset:
                    self.redelivered += 1
                else:
                    self.duplicates += 1


def produce(
    kafka: Any, bootstrap: str, producer: int, rate: float, stop: threading.Event, ledger: Ledger
) -> None:
    """Offer `rate` messages/s until `stop`, then flush; message n goes to partition n % PARTITIONS."""
    client = kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "log_level": LOG_LEVEL,
        }
    )
    filler = bytes(VALUE_BYTES - HEADER.size)

    def report(error: Any, message: Any) -> None:
        _, number = HEADER.unpack_from(message.value())
        partition = number % PARTITIONS
        if error is not None:
            with ledger.lock:
                ledger.delivery_errors += 1
                ledger.failed_to[partition] = ledger.failed_to.get(partition, 0) + 1
            ledger.error(
                f"producer {producer}, message {number} to {message.topic()}-{message.partition()}: {error}"
            )
            return
        ledger.ack(producer, number, partition, message.offset())

    start = time.monotonic()
    number = 0
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        while number < due and not stop.is_set():
            partition = number % PARTITIONS
            value = HEADER.pack(producer, number) + filler
            try:
                client.produce(
                    topic_name(partition // PARTITIONS_PER_TOPIC),
                    value,
                    partition=partition % PARTITIONS_PER_TOPIC,
                    on_delivery=report,
                )
            except BufferError:
                client.poll(0.05)
                continue
            number += 1
            ledger.produced[producer] = number
        client.poll(0.02)
    left = client.flush(FLUSH_TIMEOUT_S)
    if left:
        ledger.error(f"producer {producer}: {left} messages not delivered after {FLUSH_TIMEOUT_S:g} s")


def consume(kafka: Any, bootstrap: str, member: int, stop: threading.Event, ledger: Ledger) -> None:
    client = kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "client.id": f"soak-consumer-{member}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "log_level": LOG_LEVEL,
        }
    )
    topic_index = {topic_name(n): n for n in range(TOPICS)}
    client.subscribe(list(topic_index))
    try:
        while not stop.is_set():
            messages = client.consume(1000, 0.5)
            if messages:
                ledger.consume(messages, topic_index)
    finally:
        client.close()


# -- sampling --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sample:
    t_s: float  # since the producers started
    phase: str  # "run" or "drain"
    fds: int
    fd_segments: int  # descriptors of segment .log files
    fd_sockets: int
    rss_mib: float  # VmRSS: RssAnon (the heap, numpy arrays) + RssFile (mapped file pages) + RssShmem
    rss_anon_mib: float
    rss_file_mib: float
    segment_files: int  # .log files under the root
    segments_made: int  # distinct .log files seen so far (retention deletes the oldest)
    files: int  # all files under the root's partition directories
    produced: int
    acked: int
    consumed: int
    server_cpu_s: float
    client_cpu_s: float  # this process: the producers and consumers
    load1: float


def descriptors(pid: int) -> tuple[int, int, int]:
    """(all, segment .log files, sockets) open in `pid`."""
    directory = f"/proc/{pid}/fd"
    total = segments = sockets = 0
    for name in os.listdir(directory):
        total += 1
        try:
            target = os.readlink(os.path.join(directory, name))
        except OSError:
            continue  # closed meanwhile
        if target.endswith(".log"):
            segments += 1
        elif target.startswith("socket:"):
            sockets += 1
    return total, segments, sockets


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of `pid`, MiB."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                found[name] = round(int(value.split()[0]) / 1024, 1)
    return found


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Every segment file any sample saw: retention (SOAK_RETENTION_MS, far longer than a sample's
# interval) deletes segments, so the rolls are counted from the names seen, not the files left.
SEEN_SEGMENTS: set[str] = set()


def files_on_disk(root: str) -> tuple[int, int]:
    """(segment .log files, all files) in the root's partition directories."""
    segments = files = 0
    with os.scandir(root) as entries:
        directories = [entry.path for entry in entries if entry.is_dir() and entry.name.startswith("soak-")]
    for directory in directories:
        with os.scandir(directory) as entries:
            for entry in entries:
                files += 1
                if entry.name.endswith(".log"):
                    segments += 1
                    SEEN_SEGMENTS.add(entry.path)
    return segments, files


def take_sample(pid: int, root: str, t_s: float, phase: str, ledger: Ledger) -> Sample:
    fds, fd_segments, fd_sockets = descriptors(pid)
    segment_files, files = files_on_disk(root)
    memory = memory_mib(pid)
    with ledger.lock:
        acked, consumed = ledger.acked_count, ledger.consumed_count
    return Sample(
        t_s=round(t_s, 1),
        phase=phase,
        fds=fds,
        fd_segments=fd_segments,
        fd_sockets=fd_sockets,
        rss_mib=memory["VmRSS"],
        rss_anon_mib=memory["RssAnon"],
        rss_file_mib=memory["RssFile"],
        segment_files=segment_files,
        segments_made=len(SEEN_SEGMENTS),
        files=files,
        produced=sum(ledger.produced),
        acked=acked,
        consumed=consumed,
        server_cpu_s=round(cpu_seconds(pid), 2),
        client_cpu_s=round(time.process_time(), 2),
        load1=os.getloadavg()[0],
    )


# -- analysis --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trend:
    """One quantity after the warm-up: first third's and last third's means, slope per minute."""

    name: str
    at_warmup: float  # the first sample after the warm-up
    at_end: float  # the last sample of the run (before the drain)
    first_third: float
    last_third: float
    slope_per_min: float

    @property
    def growth(self) -> float:
        return self.last_third - self.first_third

    def line(self, unit: str) -> str:
        return (
            f"{self.name}: {self.at_warmup:,.1f} {unit} after the warm-up, {self.at_end:,.1f} at the end; "
            f"mean of the first third {self.first_third:,.1f}, of the last third {self.last_third:,.1f} "
            f"({self.growth:+,.1f}, {self.growth / self.first_third:+.2%}); "
            f"slope {self.slope_per_min:+,.2f} {unit}/min"
        )


def trend(name: str, samples: Sequence[Sample], value: Callable[[Sample], float]) -> Trend:
    if len(samples) < 3:
        raise ValueError(f"{len(samples)} samples after the warm-up: run longer (SOAK_SECONDS)")
    third = len(samples) // 3
    values = np.array([value(s) for s in samples], dtype=float)
    minutes = np.array([s.t_s / 60 for s in samples])
    slope = float(np.polyfit(minutes, values, 1)[0])
    return Trend(
        name=name,
        at_warmup=float(values[0]),
        at_end=float(values[-1]),
        first_third=float(values[:third].mean()),
        last_third=float(values[-third:].mean()),
        slope_per_min=slope,
    )


def warmup_end(samples: Sequence[Sample], settings: Settings, cache_capacity: int) -> float | None:
    """When the warm-up ends: SOAK_WARMUP_SECONDS, or later, the first sample with the segment
    file cache full (a descriptor for each partition's active segment and `cache_capacity`
    sealed ones); None if the cache never filled."""
    for sample in samples:
        if sample.phase == "run" and sample.fd_segments >= PARTITIONS + cache_capacity:
            return max(settings.warmup_s, sample.t_s)
    return None


def _padded(numbers: array[int], count: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The first `count` numbers, -1 for those never written."""
    found = np.frombuffer(numbers, dtype=np.int64)[:count]
    return np.concatenate([found, np.full(count - len(found), -1, dtype=np.int64)])


def verify(ledger: Ledger, watermarks: Sequence[tuple[int, int]]) -> tuple[list[str], list[str]]:
    """What went wrong with the data: lost, duplicated or misplaced messages (empty: nothing); and
    warnings: messages whose delivery failed (a client-side timeout, say), which is no loss
    as long as none of them is in the log either."""
    problems, warnings = [], []
    for producer in range(PRODUCERS):
        count = ledger.produced[producer]
        acked = _padded(ledger.acked[producer], count)
        consumed = _padded(ledger.consumed[producer], count)
        not_acked = int((acked == -1).sum())
        lost = int(((acked != -1) & (consumed == -1)).sum())
        moved = int(((acked != -1) & (consumed != -1) & (consumed != acked)).sum())
        failed_but_stored = int(((acked == -1) & (consumed != -1)).sum())
        if not_acked:
            warnings.append(
                f"producer {producer}: {not_acked} of {count:,} messages not acknowledged (delivery failed), "
                f"{failed_but_stored} of them in the log"
            )
        if failed_but_stored:
            problems.append(
                f"producer {producer}: {failed_but_stored} messages in the log though their delivery failed"
            )
        if lost:
            problems.append(f"producer {producer}: {lost} acknowledged messages never consumed (lost)")
        if moved:
            problems.append(
                f"producer {producer}: {moved} messages consumed at another offset than acknowledged"
            )
        beyond = len(ledger.consumed[producer]) > count and int(
            (np.frombuffer(ledger.consumed[producer], dtype=np.int64)[count:] != -1).sum()
        )
        if beyond:
            problems.append(f"producer {producer}: {beyond} messages consumed that were never produced")
    if ledger.duplicates:
        problems.append(f"{ledger.duplicates} messages consumed at two offsets (duplicated in the log)")
    if ledger.misrouted:
        problems.append(f"{ledger.misrouted} messages found in a partition they were not sent to")
    bad = []
    for partition, (low, high) in enumerate(watermarks):
        acked_to, consumed_from = ledger.acked_to[partition], ledger.consumed_from[partition]
        # The low watermark is where retention left the log start (0 with SOAK_RETENTION_MS=0);
        # every offset below it was consumed before it went (the ledger above).
        if (
            not 0 <= low <= high
            or high != acked_to
            or consumed_from != high
            or ledger.max_offset[partition] != high - 1
        ):
            bad.append(
                f"partition {partition}: watermarks {low}..{high}, {acked_to} acknowledged, "
                f"{consumed_from} consumed, last offset consumed {ledger.max_offset[partition]}"
            )
    if bad:
        problems.append(f"{len(bad)} partitions disagree: " + "; ".join(bad[:5]))
    if ledger.failed_to:
        failed = ", ".join(f"{p} ({n})" for p, n in sorted(ledger.failed_to.items()))
        warnings.append(f"{ledger.delivery_errors} delivery errors, to partitions (of 0..999): {failed}")
    return problems, warnings


def watermarks_of(kafka: Any, bootstrap: str) -> list[tuple[int, int]]:
    client = kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": GROUP + "-check", "log_level": LOG_LEVEL}
    )
    try:
        found = []
        for partition in range(PARTITIONS):
            tp = kafka.TopicPartition(
                topic_name(partition // PARTITIONS_PER_TOPIC), partition % PARTITIONS_PER_TOPIC
            )
            low, high = client.get_watermark_offsets(tp, timeout=WATERMARK_TIMEOUT_S)
            found.append((int(low), int(high)))
        return found
    finally:
        client.close()


# -- output ----------------------------------------------------------------------------------


def write_samples(samples: Sequence[Sample], summary: dict[str, Any], out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "samples.csv")
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[f.name for f in dataclasses.fields(Sample)])
        writer.writeheader()
        for sample in samples:
            writer.writerow(dataclasses.asdict(sample))
    with open(os.path.join(out_dir, "summary.json"), "w") as out:
        json.dump({**summary, "samples": [dataclasses.asdict(s) for s in samples]}, out, indent=1)
    return path


def plot(
    samples: Sequence[Sample], settings: Settings, warmup_s: float, cache_capacity: int, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.t_s / 60 for s in samples]
    run_end = settings.seconds / 60
    figure, (fds_axis, rss_axis, disk_axis) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for axis in (fds_axis, rss_axis, disk_axis):
        axis.axvspan(0, warmup_s / 60, color="0.92", label="_warm-up")
        axis.axvspan(run_end, max(minutes[-1], run_end), color="#fde8d0", label="_drain")
        axis.grid(True, alpha=0.3)
    fds_axis.plot(minutes, [s.fds for s in samples], label="all descriptors of oncelog serve")
    fds_axis.plot(minutes, [s.fd_segments for s in samples], label="of which segment .log files")
    fds_axis.axhline(
        cache_capacity + PARTITIONS,
        color="0.5",
        linestyle="--",
        linewidth=1,
        label=f"sealed-segment cache ({cache_capacity:,}) + one active segment a partition ({PARTITIONS:,})",
    )
    fds_axis.axhline(
        samples[0].fds + cache_capacity,
        color="0.3",
        linestyle=":",
        linewidth=1,
        label=f"descriptors before the first roll ({samples[0].fds:,}) + the cache",
    )
    fds_axis.set_ylabel("open descriptors")
    fds_axis.set_ylim(bottom=0)
    fds_axis.legend(loc="lower right", fontsize="small")
    rss_axis.plot(minutes, [s.rss_mib for s in samples], color="tab:red", label="RSS")
    rss_axis.plot(
        minutes, [s.rss_anon_mib for s in samples], color="tab:brown", label="of which anonymous (heap)"
    )
    rss_axis.plot(
        minutes, [s.rss_file_mib for s in samples], color="tab:pink", label="of which mapped file pages"
    )
    rss_axis.legend(loc="lower right", fontsize="small")
    rss_axis.set_ylabel("RSS (MiB)")
    rss_axis.set_ylim(bottom=0)
    disk_axis.plot(minutes, [s.segment_files for s in samples], color="tab:green", label="segments on disk")
    disk_axis.set_ylabel("segment files (.log)", color="tab:green")
    disk_axis.set_ylim(bottom=0)
    messages_axis = disk_axis.twinx()
    messages_axis.plot(
        minutes,
        [s.produced / 1e6 for s in samples],
        color="tab:purple",
        alpha=0.4,
        label="produced (offered)",
    )
    messages_axis.plot(minutes, [s.acked / 1e6 for s in samples], color="tab:purple", label="acknowledged")
    messages_axis.plot(
        minutes, [s.consumed / 1e6 for s in samples], color="tab:purple", linestyle=":", label="consumed"
    )
    messages_axis.set_ylabel("messages (millions)", color="tab:purple")
    messages_axis.set_ylim(bottom=0)
    lines = disk_axis.get_legend_handles_labels()
    more = messages_axis.get_legend_handles_labels()
    messages_axis.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize="small")
    disk_axis.set_xlabel("minutes since the producers started (grey: warm-up; orange: drain)")
    fds_axis.set_title(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(settings.plot_path, dpi=100)
    plt.close(figure)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


# -- the run ---------------------------------------------------------------------------------


def prepare_root(root: str, settings: Settings) -> None:
    """Store every topic's segment overrides in the root before the server opens it."""
    manager = LogManager.open(root, progress=False)
    try:
        for topic in range(TOPICS):
            manager.set_topic_config(
                topic_name(topic),
                segment_ms=settings.segment_ms,
                segment_bytes=settings.segment_bytes,
                retention_ms=settings.retention_ms or None,
            )
    finally:
        manager.close()
    config = read_topic_config(root, topic_name(0))
    assert (config.segment_ms, config.segment_bytes) == (settings.segment_ms, settings.segment_bytes), config


def create_topics(kafka: Any, admin_module: Any, bootstrap: str, settings: Settings) -> str:
    """Create the topics over the wire; what the server says to a CreateTopics with segment configs."""
    admin = admin_module.AdminClient({"bootstrap.servers": bootstrap, "log_level": LOG_LEVEL})
    with_configs = admin_module.NewTopic(
        "probe-configs",
        num_partitions=1,
        replication_factor=1,
        config={"segment.ms": str(settings.segment_ms)},
    )
    try:
        admin.create_topics([with_configs], operation_timeout=ADMIN_TIMEOUT_S)["probe-configs"].result(
            ADMIN_TIMEOUT_S
        )
        configs_answer = "accepted"
    except kafka.KafkaException as exc:
        configs_answer = str(exc.args[0].str())
    topics = [
        admin_module.NewTopic(topic_name(n), num_partitions=PARTITIONS_PER_TOPIC, replication_factor=1)
        for n in range(TOPICS)
    ]
    for future in admin.create_topics(topics, operation_timeout=ADMIN_TIMEOUT_S).values():
        future.result(ADMIN_TIMEOUT_S)
    return configs_answer


@dataclasses.dataclass
class Outcome:
    """What a run left: its samples, the ledger, the watermarks and how the server stopped."""

    samples: list[Sample]
    ledger: Ledger
    watermarks: list[tuple[int, int]]
    exit_status: int
    server_log: str
    configs_answer: str


def sample_until(
    server: ServeProcess,
    root: str,
    settings: Settings,
    ledger: Ledger,
    stop_producers: threading.Event,
    producers: Sequence[threading.Thread],
) -> list[Sample]:
    """Sample every settings.sample_s for settings.seconds, stop the producers, sample the drain."""
    samples: list[Sample] = []
    start = time.monotonic()

    def sample(phase: str) -> None:
        taken = take_sample(server.pid, root, time.monotonic() - start, phase, ledger)
        samples.append(taken)
        print(
            f"  {taken.t_s:6.0f} s {phase:5} fds {taken.fds:5} (segments {taken.fd_segments:5}, "
            f"sockets {taken.fd_sockets:3})  RSS {taken.rss_mib:6.1f} MiB (anon {taken.rss_anon_mib:6.1f})  "
            f"segments on disk {taken.segment_files:7,}  acked {taken.acked:10,}  "
            f"consumed {taken.consumed:10,}  load {taken.load1:.2f}",
            flush=True,
        )

    sample("run")
    next_at = settings.sample_s
    while next_at <= settings.seconds:
        time.sleep(max(0.0, start + next_at - time.monotonic()))
        sample("run")
        next_at += settings.sample_s
    stop_producers.set()
    drain_until = time.monotonic() + settings.drain_s
    while time.monotonic() < drain_until:
        with ledger.lock:
            drained = ledger.consumed_count >= ledger.acked_count
        if drained and not any(thread.is_alive() for thread in producers):  # flushed, and all read
            break
        time.sleep(0.5)
        if time.monotonic() - start >= next_at:
            sample("drain")
            next_at += settings.sample_s
    sample("drain")
    return samples


def drive(settings: Settings, root: str) -> Outcome:
    """Serve the root, produce and consume for settings.seconds while sampling, then drain and stop."""
    import confluent_kafka
    import confluent_kafka.admin

    ledger = Ledger()
    with ServeProcess(
        root, "--partitions", str(PARTITIONS_PER_TOPIC), "--retention-check-ms", str(RETENTION_CHECK_MS)
    ) as server:
        try:
            configs_answer = create_topics(confluent_kafka, confluent_kafka.admin, server.bootstrap, settings)
            print(
                f"oncelog serve pid {server.pid} on {server.bootstrap}, root {root}; {TOPICS} topics x "
                f"{PARTITIONS_PER_TOPIC} partitions rolling at segment_ms={settings.segment_ms} or "
                f"segment_bytes={settings.segment_bytes} (topic overrides stored in the root; a CreateTopics "
                f"with segment.ms: {configs_answer})",
                flush=True,
            )
            stop_producers, stop_consumers = threading.Event(), threading.Event()
            consumers = [
                threading.Thread(
                    target=consume,
                    args=(confluent_kafka, server.bootstrap, n, stop_consumers, ledger),
                    name=f"consumer-{n}",
                )
                for n in range(CONSUMERS)
            ]
            producers = [
                threading.Thread(
                    target=produce,
                    args=(
                        confluent_kafka,
                        server.bootstrap,
                        n,
                        settings.rate / PRODUCERS,
                        stop_producers,
                        ledger,
                    ),
                    name=f"producer-{n}",
                )
                for n in range(PRODUCERS)
            ]
            threads = consumers + producers
            for thread in threads:
                thread.start()
            try:
                samples = sample_until(server, root, settings, ledger, stop_producers, producers)
            finally:
                stop_producers.set()
                stop_consumers.set()
                for thread in threads:
                    thread.join()
            watermarks = watermarks_of(confluent_kafka, server.bootstrap)
        except BaseException as exc:
            exc.add_note(f"oncelog serve's output:\n{server.log()}")
            raise
        status = server.terminate()
    return Outcome(samples, ledger, watermarks, status, server.log(lines=10_000), configs_answer)


def report(settings: Settings, outcome: Outcome, cache_capacity: int, loads: tuple[str, str]) -> int:
    """Check the data and the trends, write the samples and the plot, print the figures; the exit status."""
    samples, ledger = outcome.samples, outcome.ledger
    problems, warnings = verify(ledger, outcome.watermarks)
    if outcome.exit_status != 0:
        problems.append(f"oncelog serve exited {outcome.exit_status} on SIGTERM:\n{outcome.server_log}")
    warmup_s = warmup_end(samples, settings, cache_capacity)
    if warmup_s is None:
        warmup_s = settings.warmup_s
        problems.append(
            f"the segment file cache ({cache_capacity}) never filled: too few rolls for a plateau; run longer"
        )
    steady = [s for s in samples if s.phase == "run" and s.t_s >= warmup_s]
    fds = trend("descriptors", steady, lambda s: s.fds)
    rss = trend("RSS", steady, lambda s: s.rss_mib)
    anon = trend("RssAnon", steady, lambda s: s.rss_anon_mib)
    fds_flat = fds.growth <= settings.fd_tolerance * fds.first_third
    rss_flat = rss.growth <= RSS_FLAT_SHARE * rss.first_third
    last = samples[-1]
    rolled = last.segments_made - PARTITIONS  # every segment seen but the first of each partition
    run_end = [s for s in samples if s.phase == "run"][-1]
    cpu = run_end.server_cpu_s - samples[0].server_cpu_s
    client_cpu = run_end.client_cpu_s - samples[0].client_cpu_s
    # Seconds between two rolls of a partition, on average over the run (not the drain).
    rolled_in_run = run_end.segments_made - samples[0].segments_made
    roll_s = PARTITIONS * run_end.t_s / rolled_in_run if rolled_in_run else float("inf")
    per_segment = per_segment_added(steady, lambda s: s.rss_mib)
    anon_per_segment = per_segment_added(steady, lambda s: s.rss_anon_mib)
    figures = {
        **dataclasses.asdict(settings),
        "create_topics_with_configs": outcome.configs_answer,
        "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "cache_capacity": cache_capacity,
        "produced": sum(ledger.produced),
        "acked": ledger.acked_count,
        "consumed": ledger.consumed_count,
        "redelivered": ledger.redelivered,
        "duplicates": ledger.duplicates,
        "segments_on_disk": last.segment_files,
        "segments_rolled": rolled,
        "mean_roll_interval_s": round(roll_s, 1),
        "files_on_disk": last.files,
        "warmup_end_s": warmup_s,
        "server_cpu_s_during_run": round(cpu, 1),
        "client_cpu_s_during_run": round(client_cpu, 1),
        "descriptors": dataclasses.asdict(fds),
        "rss_mib": dataclasses.asdict(rss),
        "rss_anon_mib": dataclasses.asdict(anon),
        "rss_bytes_per_segment_after_warmup": per_segment,
        "rss_anon_bytes_per_segment_after_warmup": anon_per_segment,
        "descriptors_flat": fds_flat,
        "rss_flat": rss_flat,
        "load_before": loads[0],
        "load_after": loads[1],
        "problems": problems,
        "warnings": warnings,
        "first_errors": ledger.first_errors,
    }
    path = write_samples(samples, figures, settings.out_dir)
    with open(os.path.join(settings.out_dir, "serve.log"), "w") as out:
        out.write(outcome.server_log + "\n")
    plot(
        samples,
        settings,
        warmup_s,
        cache_capacity,
        f"oncelog serve, {PARTITIONS:,} partitions, segment.ms {settings.segment_ms / 1000:g} s, "
        f"{settings.seconds / 60:g} min at {settings.rate:,} msg/s offered: {rolled:,} rolls "
        f"(a partition every {roll_s:.0f} s)\n"
        f"descriptors {fds.first_third:,.0f} → {fds.last_third:,.0f}, "
        f"RSS {rss.first_third:,.0f} → {rss.last_third:,.0f} MiB (anonymous {anon.first_third:,.0f} → "
        f"{anon.last_third:,.0f}), first vs last third after the warm-up",
    )
    print(f"samples: {path} (summary.json and serve.log beside it); plot: {settings.plot_path}")
    print(
        f"messages: {sum(ledger.produced):,} produced, {ledger.acked_count:,} acknowledged, "
        f"{ledger.consumed_count:,} consumed ({ledger.redelivered:,} redelivered by the group, "
        f"{ledger.duplicates} duplicates in the log)"
    )
    print(
        f"segments: {last.segment_files:,} on disk ({rolled:,} rolled, {rolled / last.t_s:.0f}/s: "
        f"a partition rolled every {roll_s:.1f} s on average), "
        f"{last.files:,} files; in {settings.seconds:g} s oncelog serve used {cpu:.0f} s of CPU, "
        f"the clients {client_cpu:.0f} s"
    )
    print(
        f"warm-up: until {warmup_s:g} s (SOAK_WARMUP_SECONDS={settings.warmup_s:g}, or when the cache filled)"
    )
    verdict = " — flat" if fds_flat else f" — GROWS (tolerance {settings.fd_tolerance:.0%})"
    print(fds.line("descriptors") + verdict)
    print(rss.line("MiB") + (" — flat" if rss_flat else " — grows"))
    print(anon.line("MiB"))
    if per_segment is not None and anon_per_segment is not None:
        print(
            f"  per segment file added after the warm-up (least squares): {per_segment:,.0f} bytes of RSS, "
            f"{anon_per_segment:,.0f} of them anonymous"
        )
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    for error in ledger.first_errors:
        print(f"client error: {error}")
    if problems or not fds_flat:
        return 1
    print("ok: no message lost or duplicated, descriptors flat after the warm-up")
    return 0


def per_segment_added(steady: Sequence[Sample], mib: Callable[[Sample], float]) -> int | None:
    """Bytes gained per segment file added, least squares over the samples after the warm-up
    (None: no segment was added)."""
    segments = np.array([s.segment_files for s in steady], dtype=float)
    if segments.max() == segments.min():
        return None
    return round(float(np.polyfit(segments, np.array([mib(s) * MIB for s in steady]), 1)[0]))


def main() -> int:
    settings = Settings.from_env()
    soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # The server's cache is sized at its import, from the limit it inherits from this process.
    cache_capacity = file_cache.default_capacity(soft_limit)
    load_before = uptime()
    print(f"load before: {load_before}", flush=True)
    print(
        f"open-files limit {soft_limit}: the server's segment file cache holds {cache_capacity}", flush=True
    )
    root_parent = tempfile.mkdtemp(prefix="oncelog-soak-", dir=settings.scratch)
    try:
        root = os.path.join(root_parent, "root")
        prepare_root(root, settings)
        outcome = drive(settings, root)
    finally:
        shutil.rmtree(root_parent, ignore_errors=True)
    load_after = uptime()
    print(f"load after: {load_after}", flush=True)
    return report(settings, outcome, cache_capacity, (load_before, load_after))


if __name__ == "__main__":
    sys.exit(main())
