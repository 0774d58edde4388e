"""Another client's produce latency beside 50 MiB fetches, in `oncelog bench --wire` (issue 28).

Why: a fetch response is read, joined and framed somewhere, and where matters. On the
server's event loop (~4-7 ms per MB), one client fetching 50 MB at a time stalls every
other client's requests for the whole of it: an unrelated idempotent producer's p99
went from 1.4 ms to 37 ms beside 10 MB fetches, and to hundreds of ms beside 55 MB.
This figure watches for that.

What is measured, on oncelog serve only (librdkafka's mock keeps 5 MiB a partition, so
it cannot serve such fetches; the reference is the same producer on the same server
with no fetcher running, in the same run):

- a topic is preloaded with 3 x the fetch size in 64 KiB values on partition 0, so
  every fetch finds a full response waiting;
- each repeat runs an idle window, then a loaded window. In both, an idempotent
  producer (acks=all, linger.ms=0, so the latency is the broker's and the network's,
  not a linger) offers RATE messages/s of 100 bytes to a fresh topic, and each
  message's delivery-report time minus its produce() time is its latency. In the
  loaded window a fetcher subprocess (its own interpreter, so its work never holds
  this process's GIL) runs a confluent-kafka consumer with fetch.max.bytes and
  max.partition.fetch.bytes at the fetch size that reads the preloaded partition
  from offset 0 to its end over and over (fetch.wait.max.ms=100, so the empty fetch
  at the end of a pass is short). The window starts once the fetcher has received
  its first message.

Rows: the worst latency (target: within 3x the idle worst, or 50 ms) and p99
(informational), each the median over repeats, loaded against idle. Notes give the
spread over repeats and what the fetcher achieved (MB/s of values, and the mean bytes
per Fetch response from librdkafka's statistics, which shows the fetches were full).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from oncelog.bench.harness import MIB, BenchResults, BenchSettings, Progress, Target, make_row, median
from oncelog.bench.sigint import sigint_deferred
from oncelog.bench.wire_clients import (
    DELIVERY_TIMEOUT_S,
    LOG_LEVEL,
    Deliveries,
    produce_latencies_ms,
)

PRELOAD_TOPIC: Final = "bench-big-fetch"
PRELOAD_VALUE_BYTES: Final = 64 * 1024
PRELOAD_FETCHES: Final = 3  # the preload holds this many full fetches
RATE: Final = 1000  # messages/s the latency producer offers
MAX_RATIO: Final = 3.0
MAX_WORST_MS: Final = 50.0
FETCHER_START_TIMEOUT_S: Final = 60.0
STATISTICS_MS: Final = 200
FETCH_WAIT_MS: Final = 100
_READY = "fetching"
_DONE = "fetched "


@dataclass
class Samples:
    """Per-repeat figures of the idle and the loaded windows, and what the fetcher did."""

    idle_worst_ms: list[float] = field(default_factory=list)
    idle_p99_ms: list[float] = field(default_factory=list)
    loaded_worst_ms: list[float] = field(default_factory=list)
    loaded_p99_ms: list[float] = field(default_factory=list)
    fetched_bytes: int = 0
    fetch_requests: int = 0
    fetch_response_bytes: int = 0
    loaded_s: float = 0.0


def measure(kafka: Any, bootstrap: str, settings: BenchSettings, progress: Progress) -> Samples:
    """Every repeat's idle and loaded windows against the server at `bootstrap`."""
    fetch_bytes = settings.wire_fetch_bytes
    preload(kafka, bootstrap, PRELOAD_FETCHES * fetch_bytes)
    progress(
        f"  {settings.wire_repeats} x (idle, then beside {fetch_bytes / MIB:g} MiB fetches): "
        f"{settings.wire_latency_s:g} s at {RATE:,} messages/s, linger.ms=0"
    )
    samples = Samples()
    for repeat in range(settings.wire_repeats):
        idle_ms, _ = produce_latencies_ms(
            kafka, bootstrap, f"bench-beside-{repeat}-idle", settings.wire_latency_s, RATE, linger_ms=0
        )
        with Fetcher(bootstrap, PRELOAD_TOPIC, fetch_bytes) as fetcher:
            started = time.perf_counter()
            loaded_ms, _ = produce_latencies_ms(
                kafka, bootstrap, f"bench-beside-{repeat}-loaded", settings.wire_latency_s, RATE, linger_ms=0
            )
            samples.loaded_s += time.perf_counter() - started
        samples.fetched_bytes += fetcher.value_bytes
        samples.fetch_requests += fetcher.requests
        samples.fetch_response_bytes += fetcher.response_bytes
        for worst, p99, latencies in (
            (samples.idle_worst_ms, samples.idle_p99_ms, idle_ms),
            (samples.loaded_worst_ms, samples.loaded_p99_ms, loaded_ms),
        ):
            worst.append(max(latencies))
            p99.append(float(np.percentile(latencies, 99)))
        idle = f"worst {samples.idle_worst_ms[-1]:7.2f} ms  p99 {samples.idle_p99_ms[-1]:6.2f} ms"
        loaded = f"worst {samples.loaded_worst_ms[-1]:7.2f} ms  p99 {samples.loaded_p99_ms[-1]:6.2f} ms"
        progress(f"    idle {idle}  |  beside fetches {loaded}")
    return samples


def add_rows(results: BenchResults, samples: Samples, fetch_bytes: int) -> None:
    size = f"{fetch_bytes / MIB:g} MiB"
    results.rows.append(
        make_row(
            f"wire: worst produce latency beside {size} fetches",
            median(samples.loaded_worst_ms),
            "ms",
            median(samples.idle_worst_ms),
            Target(max_ratio=MAX_RATIO, max_value=MAX_WORST_MS, either=True),
        )
    )
    results.rows.append(
        make_row(
            f"wire: produce latency p99 beside {size} fetches",
            median(samples.loaded_p99_ms),
            "ms",
            median(samples.idle_p99_ms),
            Target(),
        )
    )

    def spread(values: list[float]) -> str:
        return f"{min(values):.1f}-{max(values):.1f}"

    mean_response = samples.fetch_response_bytes / max(samples.fetch_requests, 1)
    results.notes.append(
        f"wire beside {size} fetches: reference is the same idempotent producer (linger.ms=0, {RATE:,} "
        "messages/s) on the same server with no fetcher; spread over repeats, worst "
        f"{spread(samples.loaded_worst_ms)} ms beside fetches vs {spread(samples.idle_worst_ms)} ms idle, "
        f"p99 {spread(samples.loaded_p99_ms)} vs {spread(samples.idle_p99_ms)} ms; the fetcher read "
        f"{samples.fetched_bytes / max(samples.loaded_s, 1e-9) / 1e6:,.0f} MB/s of values, "
        f"{mean_response / MIB:.1f} MiB per Fetch response on average ({samples.fetch_requests} Fetches, "
        "the empty ones at the end of each pass included)"
    )


def preload(kafka: Any, bootstrap: str, total_bytes: int) -> None:
    """Write `total_bytes` of PRELOAD_VALUE_BYTES values to partition 0 of PRELOAD_TOPIC."""
    producer = kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": LOG_LEVEL})
    deliveries = Deliveries()
    value = b"f" * PRELOAD_VALUE_BYTES
    count = -(-total_bytes // PRELOAD_VALUE_BYTES)
    for _ in range(count):
        while True:
            try:
                producer.produce(PRELOAD_TOPIC, value, partition=0, on_delivery=deliveries.report)
                break
            except BufferError:
                producer.poll(0.01)
    deliveries.check(count, producer.flush(DELIVERY_TIMEOUT_S), f"preloading {PRELOAD_TOPIC} on {bootstrap}")


class Fetcher:
    """The fetching client, in a subprocess: `python -m oncelog.bench.wire_fetch BOOTSTRAP TOPIC BYTES`."""

    def __init__(self, bootstrap: str, topic: str, fetch_bytes: int):
        self.command = [sys.executable, "-m", "oncelog.bench.wire_fetch", bootstrap, topic, str(fetch_bytes)]
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.value_bytes = self.requests = self.response_bytes = 0

    def __enter__(self) -> Fetcher:
        with sigint_deferred():  # a Ctrl-C during the spawn comes once `self.proc` is held
            self.proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        try:
            threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
            if not self._ready.wait(FETCHER_START_TIMEOUT_S):
                raise RuntimeError("the fetcher received nothing:\n" + "\n".join(self.lines[-40:]))
        except BaseException:  # (a Ctrl-C included: no `with` owns it yet)
            self.proc.kill()
            self.proc.wait()
            raise
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(_READY):
                self._ready.set()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        assert self.proc is not None
        if exc_type is not None:
            # On the way out of an error or a Ctrl-C: ended, not summed up (nor a second error).
            self.proc.kill()
            self.proc.wait()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(DELIVERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        # The pump thread reads to EOF; the last line is the summary.
        deadline = time.monotonic() + 10
        while not any(line.startswith(_DONE) for line in self.lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        done = [line for line in self.lines if line.startswith(_DONE)]
        if status != 0 or not done:
            raise RuntimeError(f"the fetcher exited {status}:\n" + "\n".join(self.lines[-40:]))
        summary = json.loads(done[-1][len(_DONE) :])
        self.value_bytes = int(summary["value_bytes"])
        self.requests = int(summary["requests"])
        self.response_bytes = int(summary["response_bytes"])


# -- the fetcher's side (its own process) -------------------------------------------------


def fetch_forever(bootstrap: str, topic: str, fetch_bytes: int) -> None:
    """Read partition 0 of `topic` from offset 0 to its end, over and over, until SIGTERM.

    Prints READY after the first message, and on SIGTERM a JSON summary of what was
    fetched since then (values, Fetch requests and response bytes per librdkafka's
    statistics).
    """
    import confluent_kafka as kafka

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    latest: dict[str, int] = {}

    def on_stats(text: str) -> None:
        brokers = [b for b in json.loads(text)["brokers"].values() if b.get("nodeid", -1) >= 0]
        latest["requests"] = sum(int(b.get("req", {}).get("Fetch", 0)) for b in brokers)
        latest["response_bytes"] = sum(int(b.get("rxbytes", 0)) for b in brokers)

    consumer = kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "oncelog-bench-big-fetch",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": fetch_bytes,
            "max.partition.fetch.bytes": fetch_bytes,
            # At the partition's end a fetch waits for data that never comes: keep that short.
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "statistics.interval.ms": STATISTICS_MS,
            "stats_cb": on_stats,
            "log_level": LOG_LEVEL,
        }
    )
    start = [kafka.TopicPartition(topic, 0, 0)]
    consumer.assign(start)
    value_bytes = 0
    at_ready: dict[str, int] | None = None
    try:
        while not stop.is_set():
            for message in consumer.consume(1000, 0.2):
                error = message.error()
                if error is not None:
                    if error.code() != kafka.KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"fetching {topic}: {error}")
                    consumer.assign(start)  # from offset 0 again
                    continue
                if at_ready is None:
                    at_ready = dict(latest)
                    print(_READY, flush=True)
                value_bytes += len(message.value() or b"")
        # One more statistics callback, so the summary covers the whole window.
        deadline = time.monotonic() + 2 * STATISTICS_MS / 1000
        while time.monotonic() < deadline:
            consumer.poll(0.05)
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
    first = at_ready or {}
    summary = {
        "value_bytes": value_bytes,
        "requests": latest.get("requests", 0) - first.get("requests", 0),
        "response_bytes": latest.get("response_bytes", 0) - first.get("response_bytes", 0),
    }
    print(_DONE + json.dumps(summary), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(f"usage: {os.path.basename(sys.executable)} -m oncelog.bench.wire_fetch BOOTSTRAP TOPIC BYTES")
        sys.exit(2)
    fetch_forever(sys.argv[1], sys.argv[2], int(sys.argv[3]))
