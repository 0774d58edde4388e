"""The comparative benchmark behind `oncelog bench`: each figure against a same-process reference.

Every figure is measured against a reference run in the same process, so the
machine's noise cancels in the ratio; each number is the median of several
repeats, oncelog and reference interleaved.

Ratio convention: `ratio = value / reference`, both in the row's unit. Rates
(appends/s, GB/s, batches/s) are higher-is-better, so a ratio of 2 means twice the
reference; times (ms, s) are lower-is-better. Figures that the targets give no
reference for get the nearest raw operation on the same bytes (a read + CRC-32C,
an os.write + fsync, one table row), so their ratio shows the engine's overhead.
The target column says what is bounded: "ratio ≥ X", "≥ X <unit>" (the value)
or "report" (informational, always met).

The hidden environment variable ONCELOG_BENCH_SCALE (a float, default 1) scales
every size and duration down for the test suite's smoke run.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from oncelog.bench.references import kafka_python_batch
from oncelog.bench.settings import APPEND_SIZES as APPEND_SIZES
from oncelog.bench.settings import DURABLE_THREADS as DURABLE_THREADS
from oncelog.bench.settings import FULL as FULL
from oncelog.bench.settings import KIB as KIB
from oncelog.bench.settings import MIB as MIB
from oncelog.bench.settings import QUICK as QUICK
from oncelog.bench.settings import RECOVERY_SEGMENT_COUNTS as RECOVERY_SEGMENT_COUNTS
from oncelog.bench.settings import BenchSettings as BenchSettings
from oncelog.bench.settings import settings_for as settings_for
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import RecordBatch, encode_batch

REPORT = "report"
GB = 1e9  # decimal: GB/s and MB/s are 10^9 and 10^6 bytes per second
# No roll inside a timed loop: one segment as large as an i32 position allows.
APPEND_CONFIG = LogConfig(segment_bytes=2**31 - 1)


@dataclass(frozen=True)
class BenchRow:
    figure: str
    value: float
    unit: str
    reference: float
    ratio: float
    target: str
    met: bool
    # The spread of the per-round ratios (engine and reference alternating): their
    # interquartile range from 4 rounds on, else min-max; None for rows of one measure.
    spread_low: float | None = None
    spread_high: float | None = None
    # The median meets the target, yet the spread reaches the wrong side of it: the
    # figure is not called met (the margin is smaller than the noise).
    unclear: bool = False


@dataclass(frozen=True)
class Target:
    """Bounds on the ratio and on the value; none at all means an informational row.

    All bounds must hold, or with `either` any one of them (the brief's "≤ 3x or ≤ 50 ms").
    """

    min_ratio: float | None = None
    max_ratio: float | None = None
    min_value: float | None = None
    max_value: float | None = None
    either: bool = False

    def text(self, unit: str) -> str:
        clauses = []
        if self.min_ratio is not None:
            clauses.append(f"ratio ≥ {self.min_ratio:,g}")
        if self.max_ratio is not None:
            clauses.append(f"ratio ≤ {self.max_ratio:,g}")
        if self.min_value is not None:
            clauses.append(f"≥ {self.min_value:,g} {unit}")
        if self.max_value is not None:
            clauses.append(f"≤ {self.max_value:,g} {unit}")
        return (" or " if self.either else " and ").join(clauses) or REPORT

    def met(self, value: float, ratio: float) -> bool:
        checks = []
        if self.min_ratio is not None:
            checks.append(ratio >= self.min_ratio)
        if self.max_ratio is not None:
            checks.append(ratio <= self.max_ratio)
        if self.min_value is not None:
            checks.append(value >= self.min_value)
        if self.max_value is not None:
            checks.append(value <= self.max_value)
        if not checks:
            return True
        return any(checks) if self.either else all(checks)


def make_row(
    figure: str,
    value: float,
    unit: str,
    reference: float,
    target: Target,
    round_ratios: Sequence[float] = (),
) -> BenchRow:
    """A row; given each round's ratio (engine and reference timed in turn), with their
    spread, and met only if the target holds across it as well as at the median."""
    ratio = value / reference
    met = target.met(value, ratio)
    low = high = None
    unclear = False
    if round_ratios:
        low, high = ratio_spread(round_ratios)
        # Each end of the spread as a value, at the median reference.
        ends_met = all(target.met(end * reference, end) for end in (low, high))
        unclear = met and not ends_met
        met = met and ends_met
    return BenchRow(
        figure, float(value), unit, float(reference), ratio, target.text(unit), met, low, high, unclear
    )


def ratio_spread(ratios: Sequence[float]) -> tuple[float, float]:
    """The interquartile range of per-round ratios from 4 rounds on (one stalled round
    does not decide), else their min and max."""
    if len(ratios) >= 4:
        quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
        return quartiles[0], quartiles[2]
    return min(ratios), max(ratios)


@dataclass(frozen=True)
class RecoveryPoint:
    sealed_segments: int
    log_bytes: int
    bytes_scanned: int
    times_s: tuple[float, ...]


@dataclass(frozen=True)
class ThroughputPoint:
    batch_bytes: int
    oncelog_bytes_per_s: float
    reference_bytes_per_s: float


@dataclass
class BenchResults:
    settings: BenchSettings
    rows: list[BenchRow] = field(default_factory=list)
    recovery: list[RecoveryPoint] = field(default_factory=list)
    throughput: list[ThroughputPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


Progress = Callable[[str], None]
Step = Callable[[BenchSettings, str, BenchResults, Progress], None]


# -- helpers -------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_dir(parent: str, name: str) -> Iterator[str]:
    path = os.path.join(parent, name)
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def timed(action: Callable[[], object]) -> float:
    gc.collect()  # a collection left over from setup should not land in the timed region
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median(samples: list[float]) -> float:
    return float(statistics.median(samples))


def count_label(count: int) -> str:
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count % 1000 == 0:
        return f"{count // 1000}k"
    return str(count)


def now_ms() -> int:
    # Current timestamps: a producer stamped more than producer_expiration_ms ago expires on sight.
    return int(time.time() * 1000)


def batch_of_size(total_bytes: int) -> bytes:
    """A 1-record batch of exactly `total_bytes` (value sized to fit)."""
    value_bytes = total_bytes - 80
    for _ in range(3):  # the varints around the value may change size once
        batch = encode_batch([(b"key-0000", b"v" * value_bytes)], timestamp_ms=now_ms())
        if len(batch) == total_bytes:
            return batch
        value_bytes += total_bytes - len(batch)
    raise AssertionError(f"cannot build a batch of {total_bytes} bytes")


# -- append, no fsync ----------------------------------------------------------------


def append_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    """The append rows: engine and reference alternate in short rounds (`append_rounds`),
    each round starting with nothing dirty in the page cache (a sync, not timed), so the
    kernel's writeback throttling, which both sides hit once some GB are dirty, does not
    decide a ratio; each row carries the spread of its per-round ratios."""
    targets = {
        170: Target(min_ratio=1.0),
        16 * KIB: Target(min_ratio=1.0, min_value=1.5),
    }
    rounds = settings.append_rounds
    for (label, size), count in zip(APPEND_SIZES, settings.append_counts, strict=True):
        progress(f"  append {label} batches: {rounds} rounds of {count} each side")
        timed_rounds = _append_times(directory, batch_of_size(size), count, rounds)
        oncelog_rate, reference_rate = timed_rounds.rates(count)
        results.throughput.append(ThroughputPoint(size, oncelog_rate * size, reference_rate * size))
        figure = f"append {label} batches, no fsync"
        target = targets.get(size, Target())
        scale, unit = (1.0, "appends/s") if size == 170 else (size / GB, "GB/s")
        results.rows.append(
            make_row(
                figure, oncelog_rate * scale, unit, reference_rate * scale, target, timed_rounds.rate_ratios()
            )
        )
    count = settings.append_counts[0]
    progress(f"  append 170 B idempotent batches: {rounds} rounds of {count} each side")
    timed_rounds = _idempotent_append_times(directory, count, rounds)
    idempotent_rate, reference_rate = timed_rounds.rates(count)
    results.rows.append(
        make_row(
            "append 170 B idempotent batches (1 producer), no fsync",
            idempotent_rate,
            "appends/s",
            reference_rate,
            Target(min_ratio=0.8),
            timed_rounds.rate_ratios(),
        )
    )
    calls = count // REQUEST_BATCHES
    progress(f"  append_batches, {REQUEST_BATCHES} x 170 B per call: {rounds} rounds of {calls} calls")
    timed_rounds = _request_append_times(directory, calls, rounds)
    results.rows.append(
        make_row(
            f"append_batches of {REQUEST_BATCHES} x 170 B vs {REQUEST_BATCHES} single appends",
            median(timed_rounds.engine_s) / calls * 1e6,
            "µs/call",
            median(timed_rounds.reference_s) / calls * 1e6,
            Target(max_ratio=1.0),
            timed_rounds.time_ratios(),
        )
    )


REQUEST_BATCHES = 10


@dataclass(frozen=True)
class TimedRounds:
    """Seconds of each round of the engine and of its reference, timed in turn."""

    engine_s: list[float]
    reference_s: list[float]

    def rates(self, count: int) -> tuple[float, float]:
        """Median rates, per second, of `count` operations a round."""
        return count / median(self.engine_s), count / median(self.reference_s)

    def rate_ratios(self) -> list[float]:
        """Each round's engine rate over the reference's (the round after it)."""
        return [reference / engine for engine, reference in zip(self.engine_s, self.reference_s, strict=True)]

    def time_ratios(self) -> list[float]:
        return [engine / reference for engine, reference in zip(self.engine_s, self.reference_s, strict=True)]


def idempotent_batches(count: int, first_sequence: int) -> list[bytes]:
    """`count` 170-byte batches of one producer, in sequence from `first_sequence`."""
    timestamp_ms = now_ms()
    return [
        encode_batch(
            [(b"key-0000", b"v" * 92)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=first_sequence + n,
            timestamp_ms=timestamp_ms,
        )
        for n in range(count)
    ]


def _idempotent_append_times(directory: str, count: int, rounds: int) -> TimedRounds:
    """As _append_times, for one idempotent producer: every batch is the next in sequence."""
    batches = iter([idempotent_batches(count, count * n) for n in range(rounds + 1)])
    assert len(idempotent_batches(1, 0)[0]) == 170
    with (
        scratch_dir(directory, "log-idempotent") as path,
        Log.open(path, APPEND_CONFIG) as log,
        _reference_file(directory) as fd,
    ):
        append, write = log.append, os.write

        def run_log(_: int) -> None:
            for batch in next(batches):
                append(batch)

        reference_batches = idempotent_batches(count, 0)

        def run_reference(_: int) -> None:
            for batch in reference_batches:
                write(fd, batch)

        return _interleaved(run_log, run_reference, count, rounds)


def _request_append_times(directory: str, calls: int, rounds: int) -> TimedRounds:
    """Seconds for `calls` append_batches of 10 batches, and for the same batches appended one
    by one, into one log (plain batches: the producer rules are timed in the idempotent row)."""
    batch = batch_of_size(170)
    request = [batch] * REQUEST_BATCHES
    with scratch_dir(directory, "log-request") as path, Log.open(path, APPEND_CONFIG) as log:
        append, append_batches = log.append, log.append_batches

        def run_requests(n: int) -> None:
            for _ in range(n):
                append_batches(request)

        def run_singles(n: int) -> None:
            for _ in range(n):
                for one in request:
                    append(one)

        return _interleaved(run_requests, run_singles, calls, rounds)


def _append_times(directory: str, batch: bytes, count: int, rounds: int) -> TimedRounds:
    """`rounds` rounds of `count` appends for oncelog and for the reference loop, in turn.

    Steady state on both sides: one log and one reference file, each warmed up, then
    timed rounds that keep appending to them.
    """
    with (
        scratch_dir(directory, "log-0") as path,
        Log.open(path, APPEND_CONFIG) as log,
        _reference_file(directory) as fd,
    ):
        append, write = log.append, os.write

        def run_log(n: int) -> None:
            for _ in range(n):
                append(batch)

        def run_reference(n: int) -> None:
            for _ in range(n):
                write(fd, batch)

        return _interleaved(run_log, run_reference, count, rounds)


def _interleaved(
    run: Callable[[int], None], reference: Callable[[int], None], count: int, rounds: int
) -> TimedRounds:
    """Seconds of `rounds` rounds of `run(count)` and `reference(count)`, in turn, after one
    warm-up round of each; every timed round starts with nothing dirty (os.sync, untimed)."""
    run(count)
    reference(count)
    run_s: list[float] = []
    reference_s: list[float] = []
    for _ in range(rounds):
        os.sync()
        run_s.append(timed(lambda: run(count)))
        os.sync()
        reference_s.append(timed(lambda: reference(count)))
    return TimedRounds(run_s, reference_s)


@contextlib.contextmanager
def _reference_file(directory: str) -> Iterator[int]:
    """The reference: a file for one os.write per batch (O_APPEND), in the same directory."""
    path = os.path.join(directory, "reference.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)
        os.unlink(path)


# -- codec ---------------------------------------------------------------------------


def codec_figures(settings: BenchSettings, directory: str, results: BenchResults, progress: Progress) -> None:
    try:
        from kafka.record.default_records import DefaultRecordBatch
    except ImportError:
        # A dependency of oncelog (the server's fallback codec): missing only from a broken install.
        results.notes.append(
            "kafka-python, a dependency of oncelog, cannot be imported (pip install --force-reinstall "
            "oncelog brings it back): the encode and decode rows are skipped"
        )
        progress("  kafka-python cannot be imported: skipping encode and decode")
        return
    stamp_ms = now_ms()
    records = [(b"key-%04d" % i, bytes(100)) for i in range(100)]
    count = settings.codec_batches

    def ours_encode() -> bytes:
        return encode_batch(records, timestamp_ms=stamp_ms)

    def kafka_encode() -> bytes:
        return kafka_python_batch(records, stamp_ms)

    encoded = ours_encode()
    # The same work on both sides: identical bytes after the leader epoch (Kafka's builder stamps 0).
    if encoded[16:] != kafka_encode()[16:]:
        raise AssertionError("oncelog and kafka-python encode the benchmark batch differently")

    def ours_decode() -> int:
        return sum(len(r.key or b"") + len(r.value or b"") for r in RecordBatch(encoded).records())

    def kafka_decode() -> int:
        return sum(len(r.key or b"") + len(r.value or b"") for r in DefaultRecordBatch(encoded))

    pairs: list[tuple[str, str, int, Callable[[], object], Callable[[], object]]] = [
        ("build a batch of 100 x 100 B records", "batches/s", 1, ours_encode, kafka_encode),
        ("decode the records of that batch", "records/s", len(records), ours_decode, kafka_decode),
    ]
    for figure, unit, per_call, ours, theirs in pairs:
        progress(f"  {figure}: {settings.repeats} x {count}")
        ours_s, theirs_s = [], []
        for _ in range(settings.repeats):
            ours_s.append(_time_calls(ours, count))
            theirs_s.append(_time_calls(theirs, count))
        ours_rate, theirs_rate = count * per_call / median(ours_s), count * per_call / median(theirs_s)
        results.rows.append(make_row(figure, ours_rate, unit, theirs_rate, Target(min_ratio=2.0)))


def _time_calls(action: Callable[[], object], count: int) -> float:
    def run() -> None:
        for _ in range(count):
            action()

    return timed(run)


# -- durable appends (group commit) ---------------------------------------------------


def durable_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    batch = batch_of_size(170)
    window_s = settings.durable_window_s
    with_threads, one_thread, raw = [], [], []
    with scratch_dir(directory, "log-0") as path, Log.open(path) as log:
        append, note = durable_append(log)
        if note is not None:
            results.notes.append(note)
            progress(f"  {note}")
        progress(
            f"  {settings.repeats} x ({DURABLE_THREADS} threads, 1 thread, raw loop), {window_s:g} s each"
        )
        for _ in range(settings.repeats):
            with_threads.append(_durable_rate(append, batch, DURABLE_THREADS, window_s))
            one_thread.append(_durable_rate(append, batch, 1, window_s))
            raw.append(_raw_fsync_rate(directory, batch, window_s))
    results.rows.append(
        make_row(
            f"durable appends, {DURABLE_THREADS} threads (group commit)",
            median(with_threads),
            "appends/s",
            median(one_thread),
            Target(min_ratio=8.0),  # issue 30
            [many / one for many, one in zip(with_threads, one_thread, strict=True)],
        )
    )
    results.rows.append(
        make_row(
            "durable appends, 1 thread, vs raw os.write+fsync loop",
            median(one_thread),
            "appends/s",
            median(raw),
            Target(min_ratio=0.9),  # issue 30
            [ours / theirs for ours, theirs in zip(one_thread, raw, strict=True)],
        )
    )


def durable_append(log: Log) -> tuple[Callable[[bytes], object], str | None]:
    """`append(batch, durable=True)`, or append + flush where the Log has no such parameter."""
    if "durable" in inspect.signature(log.append).parameters:
        append: Callable[..., object] = log.append
        return (lambda batch: append(batch, durable=True)), None

    def append_then_flush(batch: bytes) -> None:
        log.append(batch)
        log.flush()

    return append_then_flush, "Log.append has no durable= parameter: measured append() then flush() instead"


def _durable_rate(append: Callable[[bytes], object], batch: bytes, threads: int, window_s: float) -> float:
    """Appends per second completed by `threads` threads appending for `window_s`."""
    stop = threading.Event()
    ready = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            ready.wait()
            while not stop.is_set():
                append(batch)
                counts[n] += 1
        except threading.BrokenBarrierError:
            pass  # stopped before the start (a Ctrl-C)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
    try:
        for thread in workers:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        time.sleep(window_s)
    finally:
        # Also on a Ctrl-C: the workers stop before the log they append to is closed.
        stop.set()
        ready.abort()  # (a worker still at the barrier leaves it)
        for thread in workers:
            if thread.ident is not None:
                thread.join()
    elapsed_s = time.perf_counter() - start  # includes the last appends, finished after stop
    if errors:
        raise errors[0]
    return sum(counts) / elapsed_s


def _raw_fsync_rate(directory: str, batch: bytes, window_s: float) -> float:
    path = os.path.join(directory, "reference.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        count = 0
        start = time.perf_counter()
        deadline = start + window_s
        while time.perf_counter() < deadline:
            os.write(fd, batch)
            os.fsync(fd)
            count += 1
        return count / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
