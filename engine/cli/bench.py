"""`oncelog bench`: the comparative benchmark report, every figure against a same-process reference."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import logging
import os
import platform
import tempfile
import time
import traceback
from typing import Any, TextIO

from oncelog.bench.harness import BenchSettings, Progress, settings_for
from oncelog.bench.report import load_average_text, print_report, write_json, write_plot
from oncelog.bench.run import run_benchmarks

# Internal: scales every size and duration (the test suite runs at about 0.01).
SCALE_ENV = "ONCELOG_BENCH_SCALE"
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}

DESCRIPTION = """\
Measure oncelog's performance figures, each against a reference measured
in the same process run (so the machine's noise cancels in the ratio), and print
one table: figure, oncelog, reference, ratio, target, result. Every number is the
median of several repeats, oncelog and its reference interleaved. Progress goes
to stderr, the table to stdout. The exit status is 0 even when targets are missed
(it is a report); it is 1 if a measurement fails and 2 for bad options.

Ratio = oncelog / reference, both in the row's unit: for rates (appends/s,
GB/s, batches/s, records/s) higher is better, for times (ms, s) lower is better.
The target column bounds the ratio ("ratio ≥ 2") or the oncelog value itself
("≤ 2 ms"); "report" rows are informational. Rows timed in rounds (engine and
reference in turn) show the spread of the per-round ratios (interquartile range);
a target met at the median but not across the spread is "unclear (spread)", not
met. The load average is printed at the start and the end: rerun on a quiet
machine before believing a ratio. Where a figure has no natural
reference, the nearest raw operation on the same bytes is the reference, so the
ratio shows the engine's overhead over it.

Figures, and the reference each is measured against:
  append 170 B (1 record) / 1 KiB / 16 KiB / 1 MiB batches, no fsync
      Log.append of pre-encoded batches, one call per batch, vs a plain loop doing
      one os.write per batch of the same bytes to an O_APPEND file in the same
      directory; 15 rounds each side (9 with --quick), in turn, each after a sync
      (untimed) so that writeback throttling decides neither side. Targets: 170 B
      ratio ≥ 1; 16 KiB ratio ≥ 1 and ≥ 1.5 GB/s; 1 KiB and 1 MiB are reported.
  append 170 B idempotent batches (1 producer), no fsync
      The same, each batch the producer's next sequence (the producer rules
      checked on every append) vs the same os.write loop; ratio ≥ 0.8.
  append_batches of 10 x 170 B vs 10 single appends
      One Log.append_batches call of 10 batches vs the same 10 through
      Log.append; µs per call, ratio ≤ 1.
  build a batch of 100 x 100 B records
      oncelog.segments.encode_batch vs kafka-python's DefaultRecordBatchBuilder
      (same bytes out); batches/s, ratio ≥ 2.
  decode the records of that batch
      RecordBatch(buf).records() vs iterating kafka-python's DefaultRecordBatch,
      key and value touched on both sides; records/s, ratio ≥ 2. Both codec rows
      are skipped, with a note, when kafka-python (a dev extra) is missing.
  unclean recovery, 100 vs 10 sealed segments
      Opening a crash image (the directory copied while the log is open, then
      fsynced) with 100 sealed segments vs one with 10, the same ~90%-full
      active segment of 16 KiB batches from 100 producers; 15 opens of each in
      turn (3 with --quick), every clone made and synced first and each open after
      a sync, as the disk is after a crash; ratio ≤ 1.1 across the spread of the
      per-round ratios.
  tail scan on recovery, 16 KiB batches
      Bytes of the active segment scanned by recovery / time of the unclean open,
      on a 64 MiB active segment (16 MiB with --quick) vs a plain chunked read +
      CRC-32C of the same file; ratio ≥ 0.8.
  snapshot write / snapshot load, 1M producers (full 5-batch windows)
      write_snapshot (tmp, fsync, rename, fsync dir) vs one os.write + fsync of
      the same bytes, ≤ 0.5 s; read into the producer table vs one read of the
      file, ≤ 0.25 s.
  memory per producer, 1M producers
      Resident-set growth of a table filled with 1M producers (every row written,
      pid map included) per producer vs the 160-byte row; ≤ 200 B.
  expire 1% of 1M producers
      The ring's expiry (only the due head is examined) vs a full numpy scan of
      every producer, Kafka's method; ≤ 1 ms.
  durable appends, 16 threads (group commit)
      16 threads each appending 170 B batches with Log.append(..., durable=True)
      (returns once fdatasynced; the recovery point follows at most every 1 s,
      LogConfig.recovery_point_interval_ms) vs one thread doing the same on the
      same log (a sync per append); appends/s, ratio ≥ 8. Run on the disk that
      holds --dir.
      Where Log.append has no durable= parameter, append() then flush() is
      measured instead, and a note says so.
  durable appends, 1 thread, vs raw os.write+fsync loop
      The one-thread figure above vs os.write + os.fsync per batch; ratio ≥ 0.9.
  open 1,000 partitions, clean / unclean (LogManager vs one Log.open at a time)
      LogManager.open of a root of 1,000 small partitions (a sealed segment, a
      short active one, 4 producers each), every marker present (clean) or a crash
      copy (unclean), vs the same partitions opened by one Log.open after another;
      5 rounds in turn (200 partitions, 1 round with --quick), each after a sync,
      each side first in every other round, clean ones after an untimed open of
      each. Clean: ≤ 0.5 s and ratio ≤ 0.5 across the spread; unclean: reported. Then descriptors and
      resident memory per idle partition (≤ 1, ≤ 64 KiB) and, in a full run,
      10,000 partitions opened clean (≤ 5 s), read from and closed.

With --compaction, the log cleaner's figures, on a compacted log of
keyed records (~150 B: a 14-byte key, a 120-byte random value, 16 a batch; one in
twenty a tombstone) over 50,000 keys, 64 MiB in 8 sealed segments (16 MiB over
12,500 keys with --quick), built once; every round cleans a fresh copy (made and
synced untimed); 7 rounds (5 with --quick):
  log cleaning, N MiB dirty over K keys (vs read + CRC-32C)
      Log.clean() of the whole dirty log (its first pass: the key map, then every
      segment rewritten and swapped in, fsynced) vs a plain chunked read +
      CRC-32C of the same segment files of the same copy, just before; MB/s of
      dirty log, reported with the spread of the per-round ratios.
  key map memory per key, K keys (vs Kafka's offset map entry)
      KeyMap.memory_bytes / keys after the pass vs the 24 bytes of an entry of
      Kafka's offset map (16-byte MD5, 8-byte offset); ≤ 24 B.
  key map peak while merging, per key, K keys
      The most tracemalloc sees while the same digests are put into a fresh map
      segment by segment, as the pass does (the map grows by a sorted merge);
      reported.

With --wire, the Kafka wire figures of `oncelog serve` (issue 17), each against
librdkafka's built-in mock cluster (test.mock.num.brokers=1: an in-memory broker
inside the bench process, no disk) with the same confluent-kafka client code.
oncelog serve runs as a subprocess on a free port over a fresh root in --dir
(acks=all answered from the page cache); both get 4-partition topics; 5 repeats
(3 with --quick), each broker in turn:
  wire: idempotent produce, N x 100 B, acks=all
      enable.idempotence=true, acks=all, linger.ms=5; N messages (160k, 40k with
      --quick) sent as fast as the client can, until flush() returns with every
      delivery reported; messages/s, ratio ≥ 1 across the spread of the
      repeats' ratios. Also in MB/s of values.
  wire: fetch N from offset 0 (assign)
      A consumer assign()s every partition from offset 0 and reads all N;
      messages/s, ratio ≥ 1 across the spread.
  wire: produce latency p50 / p99 at 10k messages/s
      The same producer at a fixed offered rate of 10,000 messages/s for 3 s
      (1.5 s with --quick): delivery-report time minus produce() time, so
      linger.ms=5 is in it; reported.
  wire: transactional produce, N x 100 B, 1000 per transaction
      A producer with a transactional.id commits a transaction every 1,000
      messages (oncelog stores each end durably and fsyncs a marker in every
      partition; the mock keeps it in memory); messages/s, ratio ≥ 0.8 across
      the spread.
  wire: consumer group rebalance, 2 -> 3 members
      Two consumers share a topic; a third subscribes; the time until all
      three hold a complete, disjoint assignment; reported.
  wire: worst produce latency / p99 beside 50 MiB fetches (oncelog serve only)
      An idempotent producer (linger.ms=0) offers 1,000 messages/s while a
      consumer in another process (fetch.max.bytes = max.partition.fetch.bytes
      = 50 MiB) reads a preloaded 150 MiB partition from offset 0 over and over,
      against the same producer with no fetcher, alternating; the worst latency
      has target ratio ≤ 3 or ≤ 50 ms, p99 is reported.

The full run takes a minute or two here; --quick under a minute (at most two);
--wire adds about three minutes (a minute with --quick), --compaction about
40 s (10 s with --quick)."""

EPILOG = """\
examples:
  oncelog bench --quick
  oncelog bench --json bench.json --plot bench/bench.png
  oncelog bench --wire               # add oncelog serve vs librdkafka's mock
  oncelog bench --compaction         # add the log cleaner's throughput and key map
  oncelog bench --dir /mnt/data      # measure on that disk"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure oncelog's performance figures against same-run references",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="3 repeats instead of 7 and smaller sizes (16 MiB tail scan, shorter durable windows), "
        "under 2 minutes; the figures are noisier and the header says so",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help='also write the rows to FILE as a JSON list of {"figure", "value", "unit", "reference", '
        '"ratio", "target", "met"} objects, one per table row',
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw one PNG with two panels: unclean recovery time against log size (10, 30 and "
        "100 sealed segments, same tail) and append throughput against batch size beside the "
        "os.write loop (needs matplotlib, a dev extra)",
    )
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="where the scratch logs go, in a temporary subdirectory removed afterwards; put it on the "
        "disk to measure, not tmpfs, or the durable figures mean nothing "
        f"(default: {tempfile.gettempdir()})",
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="also read 1M records (200k with --quick) through the Spark data source on local[2] against "
        "spark.read.parquet of the same rows (needs the spark extra and Java 17+; adds about a minute)",
    )
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        help="the Spark master for --spark (default: local[2]); a standalone cluster's spark://host:7077 "
        "needs --dir on a filesystem its workers share and oncelog installed there",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="also measure oncelog serve over Kafka's wire protocol (a subprocess on a free port) against "
        "librdkafka's in-memory mock cluster with the same confluent-kafka client: idempotent produce and "
        "fetch throughput (target ratio ≥ 1 each), transactional produce (≥ 0.8) "
        "and produce latency p50/p99 at 10,000 messages/s "
        "(needs confluent-kafka, a dev extra; adds about a minute)",
    )
    parser.add_argument(
        "--compaction",
        action="store_true",
        help="also measure the log cleaner: Log.clean() of a 64 MiB compacted log over 50,000 keys (16 MiB "
        "with --quick), a fresh copy each round, against a plain read + CRC-32C of the same segments, and "
        "the key map's memory per key (target ≤ 24 B, as Kafka's offset map); adds about 40 s",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        scale = float(os.environ.get(SCALE_ENV, "1"))
    except ValueError:
        scale = 0.0
    if not 0 < scale <= 1:
        print(f"oncelog bench: {SCALE_ENV} must be a number in (0, 1]", file=err)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("oncelog bench: --plot needs matplotlib (pip install -e '.[dev]')", file=err)
        return 2
    if args.spark and importlib.util.find_spec("pyspark") is None:
        print("oncelog bench: --spark needs pyspark and pyarrow (pip install -e '.[spark]')", file=err)
        return 2
    if args.wire and importlib.util.find_spec("confluent_kafka") is None:
        print("oncelog bench: --wire needs confluent-kafka (pip install -e '.[dev]')", file=err)
        return 2
    if args.dir is not None and not os.path.isdir(args.dir):
        print(f"oncelog bench: --dir {args.dir} is not a directory", file=err)
        return 2
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        # Checked now, not after minutes of measuring.
        if path is not None and (os.path.isdir(path) or not os.path.isdir(os.path.dirname(path) or ".")):
            print(f"oncelog bench: {option} {path} cannot be written (a directory, or no parent)", file=err)
            return 2
    settings = settings_for(args.quick, scale)
    if args.spark_master:
        settings = dataclasses.replace(settings, spark_master=args.spark_master)
    # Each unclean open logs the tail it cuts; dozens of them would drown the progress lines.
    engine_logger = logging.getLogger("oncelog")
    level = engine_logger.level
    engine_logger.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="oncelog-bench-", dir=args.dir) as scratch:
            header = _header(settings, scratch)
            for line in header:
                print(f"bench: {line}", file=err)
            try:
                results = run_benchmarks(
                    settings,
                    scratch,
                    _progress(err),
                    spark=args.spark,
                    wire=args.wire,
                    compaction=args.compaction,
                )
            except Exception:
                print("oncelog bench: a measurement failed:", file=err)
                traceback.print_exc(file=err)
                return 1
    finally:
        engine_logger.setLevel(level)
    print_report(results, header, out)
    try:
        if args.json:
            write_json(results.rows, args.json)
            print(f"bench: wrote {args.json}", file=err)
        if args.plot:
            write_plot(results, args.plot)
            print(f"bench: wrote {args.plot}", file=err)
    except OSError as exc:
        print(f"oncelog bench: cannot write {exc.filename}: {exc.strerror or exc}", file=err)
        return 1
    return 0


def _header(settings: BenchSettings, scratch: str) -> list[str]:
    if settings.mode.startswith("quick"):
        mode = f"{settings.mode} run: {settings.repeats} repeats and smaller sizes, so noisier figures"
    else:
        mode = f"{settings.mode} run: {settings.repeats} repeats"
    filesystem = _filesystem_type(scratch)
    lines = [
        f"oncelog bench, {mode}",
        f"{datetime.date.today()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"scratch directory {scratch} ({filesystem}), {load_average_text()} at the start",
    ]
    if filesystem in MEMORY_FILESYSTEMS:
        lines.append(f"warning: {filesystem} is memory, not a disk: fsync costs nothing there")
    return lines


def _filesystem_type(path: str) -> str:
    """The type of the filesystem holding `path`, from /proc/self/mounts (Linux), or 'unknown'."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount_point = fields[1].replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, kind = mount_point, fields[2]
    except OSError:
        pass
    return kind


def _progress(err: TextIO) -> Progress:
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"bench: {time.perf_counter() - started:6.1f} s  {message}", file=err)
        err.flush()

    return progress
