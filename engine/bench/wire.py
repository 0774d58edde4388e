"""The Kafka wire figures of `oncelog bench --wire`: `oncelog serve` against librdkafka's mock cluster.

The same confluent-kafka (librdkafka) client code runs against two brokers in the
same bench run, interleaved repeat by repeat:

- oncelog: `python -m oncelog.cli serve ROOT --listen 127.0.0.1:PORT --no-progress
  --partitions 4` as a subprocess, on a free port, over a fresh root in the bench's
  scratch directory (on the disk of --dir; acks=all is answered once the batch is in
  the page cache, as without --fsync-acks). The bench waits for its "listening on"
  line and stops it with SIGTERM at the end (it must exit 0).
- reference: librdkafka's built-in mock cluster, an in-memory broker that lives
  inside a client. What works (pinned down with confluent-kafka 2.x): a Producer
  created with {"test.mock.num.brokers": 1} starts the cluster and owns it for as
  long as it lives; `owner.list_topics().brokers` names the mock broker's host and
  port, a real TCP listener on 127.0.0.1, so every measuring client connects to it
  through an ordinary "bootstrap.servers" exactly as it connects to oncelog serve.
  (confluent-kafka exposes no mock-cluster API of its own, and an AdminClient's
  CreateTopics against the mock times out waiting for a controller, so topics are
  created on first use on both sides.) The mock auto-creates a topic with 4
  partitions, hence --partitions 4 for oncelog serve.

What is measured, each repeat on a fresh topic, messages sent to partition n % 4:

1. idempotent produce throughput: a Producer with enable.idempotence=true,
   acks=all, linger.ms=5 sends N messages of 100-byte values (no key) as fast as
   it can, from the first produce() to flush() returning, every delivery report
   checked; messages/s, and MB/s of values (10^6 bytes/s). The producer first
   sends one message to each partition (connection, producer id, topic creation
   and metadata stay out of the timed region).
2. fetch throughput: a Consumer reads the watermarks, then assign()s every
   partition from offset 0 and consume()s until it has read all N + 4 messages
   (each value's length is summed and checked); messages/s.
3. produce latency: the same producer configuration offers a fixed 10,000
   messages/s for a few seconds; latency is the time the delivery report reaches
   the application (the callback) minus the time produce() was called, so it
   includes linger.ms=5. p50 and p99 per repeat.
4. transactional produce throughput and a consumer group's rebalance time (see
   wire_groups).
5. on oncelog serve alone, another client's produce latency beside 50 MiB fetches,
   against the same client idle (see wire_fetch).

Throughput rows are medians over the repeats with target ratio oncelog / mock
≥ 1 (transactional produce ≥ 0.8: issue 30), met only across the spread of the
repeats' ratios; the latency rows are the medians of the per-repeat percentiles,
informational. A note gives the CPU time oncelog serve itself used per message
produced and fetched (from /proc/PID/stat), to tell its cost from the client's.

The mock keeps at most 5 MiB of batches per partition (rd_kafka_mock_partition_init's
max_size) and drops the oldest beyond it, so N is 160k in the full run (40k a
partition, ~4.4 MB), not more, and a fetch checks that every partition still starts
at offset 0. The mock runs in the bench's own process, so it shares the machine's
CPUs with the client as oncelog serve does; it writes no disk and checks no record,
so it is a fast floor to measure against, not a peer. With 100-byte values the
client itself is the bottleneck on the mock side (its produce() loop); oncelog serve
needs CPU of its own beside it, which a machine with few CPUs shows in the ratio.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from oncelog.bench import wire_fetch, wire_groups
from oncelog.bench.harness import BenchResults, BenchSettings, Progress, Target, count_label, make_row, median
from oncelog.bench.serve_process import ServeProcess
from oncelog.bench.wire_clients import (
    LATENCY_RATE,
    PARTITIONS,
    VALUE_BYTES,
    fetch_seconds,
    mock_cluster,
    process_cpu_s,
    produce_latencies_ms,
    produce_seconds,
)

# Issue 30's targets against the mock: idempotent produce and fetch at its rate or better.
MIN_RATIO: Final = 1.0
MB: Final = 1e6
# The mock drops a partition's oldest batches beyond this (rd_kafka_mock_partition_init's max_size).
MOCK_PARTITION_BYTES: Final = 5 * 1024 * 1024
# Bytes a 100-byte value takes in a batch, record framing included, rounded up.
RECORD_BYTES: Final = 112


@dataclass
class Side:
    """One broker's samples: seconds per produce and per fetch, latency percentiles per repeat."""

    name: str
    bootstrap: str
    pid: int | None = None  # the broker's own process, whose CPU time is read (oncelog serve)
    produce_s: list[float] = field(default_factory=list)
    fetch_rates: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    offered_rates: list[float] = field(default_factory=list)
    txn_s: list[float] = field(default_factory=list)
    rebalance_s: list[float] = field(default_factory=list)
    produce_cpu_s: float = 0.0  # CPU seconds of process `pid` while producing, over every repeat
    fetch_cpu_s: float = 0.0


def wire_figures(settings: BenchSettings, directory: str, results: BenchResults, progress: Progress) -> None:
    import confluent_kafka

    count = settings.wire_messages
    if count // PARTITIONS * RECORD_BYTES > MOCK_PARTITION_BYTES * 0.9:
        raise ValueError(f"{count} messages would overflow the mock's {MOCK_PARTITION_BYTES} B per partition")
    repeats = settings.wire_repeats
    root = os.path.join(directory, "root")
    # No initial rebalance delay: the rebalance measured is of a non-empty group, which has none anyway.
    serve_args = ("--partitions", str(PARTITIONS), "--group-initial-rebalance-delay-ms", "0")
    with ServeProcess(root, *serve_args) as server, mock_cluster(confluent_kafka) as mock:
        progress(f"  oncelog serve (pid {server.pid}) on {server.bootstrap}, librdkafka's mock on {mock}")
        sides = [Side("oncelog", server.bootstrap, server.pid), Side("mock", mock)]
        progress(
            f"  {repeats} x ({count:,} messages produced then fetched, "
            f"{settings.wire_latency_s:g} s at {LATENCY_RATE:,} messages/s), each broker in turn"
        )
        try:
            for repeat in range(repeats):
                for side in sides:  # interleaved, so drift in the machine hits both alike
                    _measure_once(confluent_kafka, side, f"bench-{repeat}", count, settings.wire_latency_s)
                    _measure_groups_once(confluent_kafka, side, f"bench-{repeat}", count)
                    progress(
                        f"    {side.name:8} produce {count / side.produce_s[-1]:9,.0f}/s  "
                        f"fetch {side.fetch_rates[-1]:9,.0f}/s  "
                        f"latency p50 {side.p50_ms[-1]:6.2f} ms  p99 {side.p99_ms[-1]:6.2f} ms  "
                        f"transactional {count / side.txn_s[-1]:9,.0f}/s  "
                        f"rebalance {side.rebalance_s[-1] * 1000:6.0f} ms"
                    )
            beside_fetches = wire_fetch.measure(confluent_kafka, server.bootstrap, settings, progress)
        except BaseException as exc:  # a failure, or a Ctrl-C
            if isinstance(exc, Exception):
                exc.add_note(f"oncelog serve's output:\n{server.log()}")
            # The clients in the frames it left are destroyed now, before both brokers stop
            # (else librdkafka logs their connections being refused).
            traceback.clear_frames(exc.__traceback__)
            raise
        status = server.terminate()
    if status != 0:
        raise RuntimeError(f"oncelog serve exited {status} on SIGTERM:\n{server.log()}")
    _add_rows(results, sides, count)
    ours, reference = sides
    wire_groups.add_rows(
        results, count, (ours.txn_s, reference.txn_s), (ours.rebalance_s, reference.rebalance_s)
    )
    wire_fetch.add_rows(results, beside_fetches, settings.wire_fetch_bytes)
    results.notes.append(
        f"wire: reference is librdkafka {confluent_kafka.libversion()[0]}'s mock cluster "
        "(test.mock.num.brokers=1: in memory, in the bench process, no disk); oncelog serve ran as a "
        f"subprocess on a root in the scratch directory, acks on the page cache; {PARTITIONS} partitions"
    )
    ours, messages = sides[0], count * repeats
    if ours.produce_cpu_s > 0:  # where /proc tells
        results.notes.append(
            f"wire: oncelog serve used {ours.produce_cpu_s / messages * 1e6:.2f} µs of CPU per message "
            f"produced and {ours.fetch_cpu_s / messages * 1e6:.2f} µs per message fetched, on CPUs it "
            f"shares with the client ({os.cpu_count()} here)"
        )
    for side in sides:
        offered = median(side.offered_rates)
        if offered < LATENCY_RATE * 0.95:
            results.notes.append(
                f"wire: the latency client offered {side.name} only {offered:,.0f} messages/s, "
                f"not {LATENCY_RATE:,}: it could not keep up"
            )


def _measure_once(kafka: Any, side: Side, topic: str, count: int, latency_s: float) -> None:
    cpu_before = process_cpu_s(side.pid)
    side.produce_s.append(produce_seconds(kafka, side.bootstrap, topic, count))
    cpu_between = process_cpu_s(side.pid)
    read, fetch_s = fetch_seconds(kafka, side.bootstrap, topic)
    side.produce_cpu_s += cpu_between - cpu_before
    side.fetch_cpu_s += process_cpu_s(side.pid) - cpu_between
    if read != count + PARTITIONS:
        raise AssertionError(f"{side.name}: fetched {read} messages from {topic}, not {count + PARTITIONS}")
    side.fetch_rates.append(read / fetch_s)
    latencies_ms, offered = produce_latencies_ms(kafka, side.bootstrap, topic + "-latency", latency_s)
    p50, p99 = np.percentile(latencies_ms, [50, 99])
    side.p50_ms.append(float(p50))
    side.p99_ms.append(float(p99))
    side.offered_rates.append(offered)


def _measure_groups_once(kafka: Any, side: Side, topic: str, count: int) -> None:
    seconds = wire_groups.transactional_produce_seconds(
        kafka, side.bootstrap, topic + "-txn", count, PARTITIONS
    )
    side.txn_s.append(seconds)
    side.rebalance_s.append(
        wire_groups.rebalance_seconds(kafka, side.bootstrap, topic + "-group", PARTITIONS)
    )


def _add_rows(results: BenchResults, sides: list[Side], count: int) -> None:
    ours, mock = sides
    label = count_label(count)
    produce_rate, mock_produce_rate = count / median(ours.produce_s), count / median(mock.produce_s)
    rows = results.rows
    figure = f"wire: idempotent produce, {label} x {VALUE_BYTES} B, acks=all"
    # Each repeat runs both brokers in turn: its ratio is one round's.
    produce_ratios = [mock_s / ours_s for ours_s, mock_s in zip(ours.produce_s, mock.produce_s, strict=True)]
    rows.append(
        make_row(
            figure, produce_rate, "messages/s", mock_produce_rate, Target(min_ratio=MIN_RATIO), produce_ratios
        )
    )
    mb = VALUE_BYTES / MB
    figure = "wire: idempotent produce, MB/s of values"
    rows.append(make_row(figure, produce_rate * mb, "MB/s", mock_produce_rate * mb, Target()))
    figure = f"wire: fetch {label} from offset 0 (assign)"
    fetch_target = Target(min_ratio=MIN_RATIO)
    fetch_rate, mock_fetch_rate = median(ours.fetch_rates), median(mock.fetch_rates)
    fetch_ratios = [o / m for o, m in zip(ours.fetch_rates, mock.fetch_rates, strict=True)]
    rows.append(make_row(figure, fetch_rate, "messages/s", mock_fetch_rate, fetch_target, fetch_ratios))
    rate = count_label(LATENCY_RATE)
    for name, ours_ms, mock_ms in (("p50", ours.p50_ms, mock.p50_ms), ("p99", ours.p99_ms, mock.p99_ms)):
        figure = f"wire: produce latency {name} at {rate} messages/s"
        rows.append(make_row(figure, median(ours_ms), "ms", median(mock_ms), Target()))


# -- the clients -----------------------------------------------------------------------
