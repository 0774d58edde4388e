"""The arguments and help text of `oncelog bench`; the command itself is `oncelog.cli.bench`."""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from typing import Any

from oncelog.bench.settings import DURABLE_THREADS, FULL, MIB, QUICK, RECOVERY_SEGMENT_COUNTS, TYPICAL_RUN_S

F, Q = FULL, QUICK
FEW, MANY = RECOVERY_SEGMENT_COUNTS[0], RECOVERY_SEGMENT_COUNTS[-1]


def _mib(size_bytes: int) -> str:
    return f"{size_bytes // MIB} MiB"


def _thousands(count: int) -> str:
    return f"{count // 1000}k" if count < 1_000_000 else f"{count // 1_000_000}M"


def _reflowed(text: str, width: int = 84) -> str:
    """Each run of lines with one indentation re-wrapped to `width` (the numbers vary in length)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        joins = blocks and line and blocks[-1][1] and blocks[-1][0] == indent
        if joins and not blocks[-1][1][-1].endswith(":"):  # (a line ending in ":" heads a list)
            blocks[-1][1].append(line.strip())
        else:
            blocks.append((indent, [line.strip()] if line else []))
    fill = textwrap.fill
    return "\n".join(
        fill(" ".join(words), width, initial_indent=indent, subsequent_indent=indent) if words else ""
        for indent, words in blocks
    )


def _durations() -> str:
    """The typical durations of TYPICAL_RUN_S, each part given once."""
    said = [f"the full run {_duration(TYPICAL_RUN_S['full'])}"]
    said.append(f"--quick {_duration(TYPICAL_RUN_S['quick'])}")
    for part in ("wire", "compaction", "spark"):
        full, quick = TYPICAL_RUN_S[part], TYPICAL_RUN_S[f"{part} quick"]
        said.append(f"--{part} adds {_duration(full)} ({_duration(quick)} with --quick)")
    return ", ".join(said)


def _duration(seconds: float) -> str:
    """A typical duration, rounded as a person would say it."""
    if seconds < 90:
        return f"{round(seconds / 10) * 10 or 10} s"
    return f"{round(seconds / 60)} minutes"


DESCRIPTION = _reflowed(f"""\
Measure oncelog's performance figures, each against a reference measured
in the same process run (so the machine's noise cancels in the ratio), and print
one table: figure, oncelog, reference, ratio, target, result. Every number is the
median of several repeats, oncelog and its reference interleaved. Progress goes
to stderr, the table to stdout. The exit status is 0 even when targets are missed
(it is a report); it is 1 if a measurement fails, 2 for bad options and 130 if interrupted (Ctrl-C).

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
      directory; {F.append_rounds} rounds each side ({Q.append_rounds} with --quick), in turn,
      each after a sync (untimed) so that writeback throttling decides neither side. Targets: 170 B
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
      key and value touched on both sides; records/s, ratio ≥ 2.
  unclean recovery, {MANY} vs {FEW} sealed segments
      Opening a crash image (the directory copied while the log is open, then
      fsynced) with {MANY} sealed segments vs one with {FEW}, the same ~90%-full
      active segment of 16 KiB batches from 100 producers; {F.recovery_rounds} opens of each in
      turn ({Q.recovery_rounds} with --quick), every clone made and synced first and each open after
      a sync, as the disk is after a crash; ratio ≤ 1.1 across the spread of the
      per-round ratios.
  tail scan on recovery, 16 KiB batches
      Bytes of the active segment scanned by recovery / time of the unclean open,
      on a {_mib(F.tail_scan_bytes)} active segment ({_mib(Q.tail_scan_bytes)} with --quick)
      vs a plain chunked read + CRC-32C of the same file; ratio ≥ 0.8.
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
  durable appends, {DURABLE_THREADS} threads (group commit)
      {DURABLE_THREADS} threads each appending 170 B batches with Log.append(..., durable=True)
      (returns once fdatasynced; the recovery point follows at most every 1 s,
      LogConfig.recovery_point_interval_ms) vs one thread doing the same on the
      same log (a sync per append); appends/s, ratio ≥ 8. Run on the disk that
      holds --dir.
      Where Log.append has no durable= parameter, append() then flush() is
      measured instead, and a note says so.
  durable appends, 1 thread, vs raw os.write+fsync loop
      The one-thread figure above vs os.write + os.fsync per batch; ratio ≥ 0.9.
  open {F.partitions:,} partitions, clean / unclean (LogManager vs one Log.open at a time)
      LogManager.open of a root of {F.partitions:,} small partitions (a sealed segment, a
      short active one, 4 producers each), every marker present (clean) or a crash
      copy (unclean), vs the same partitions opened by one Log.open after another;
      {F.partition_rounds} rounds in turn ({Q.partitions} partitions, {Q.partition_rounds} round
      with --quick), each after a sync,
      each side first in every other round, clean ones after an untimed open of
      each. Clean: ≤ 0.5 s and ratio ≤ 0.5 across the spread; unclean: reported. Then descriptors and
      resident memory per idle partition (≤ 1, ≤ 64 KiB) and, in a full run,
      10,000 partitions opened clean (≤ 5 s), read from and closed.

With --compaction, the log cleaner's figures, on a compacted log of
keyed records (~150 B: a 14-byte key, a 120-byte random value, 16 a batch; one in
twenty a tombstone) over {F.cleaner_keys:,} keys, {_mib(F.cleaner_log_bytes)} in 8 sealed
segments ({_mib(Q.cleaner_log_bytes)} over {Q.cleaner_keys:,} keys with --quick), built
once; every round cleans a fresh copy (made and synced untimed); {F.cleaner_rounds} rounds
({Q.cleaner_rounds} with --quick):
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

With --wire, the Kafka wire figures of `oncelog serve`, each against
librdkafka's built-in mock cluster (test.mock.num.brokers=1: an in-memory broker
inside the bench process, no disk) with the same confluent-kafka client code.
oncelog serve runs as a subprocess on a free port over a fresh root in --dir
(acks=all answered from the page cache); both get 4-partition topics; {F.wire_repeats} repeats
({Q.wire_repeats} with --quick), each broker in turn:
  wire: idempotent produce, N x 100 B, acks=all
      enable.idempotence=true, acks=all, linger.ms=5; N messages
      ({_thousands(F.wire_messages)}, {_thousands(Q.wire_messages)} with --quick) sent as fast
      as the client can, until flush() returns with every delivery reported; messages/s,
      ratio ≥ 1 across the spread of the repeats' ratios. Also in MB/s of values.
  wire: fetch N from offset 0 (assign)
      A consumer assign()s every partition from offset 0 and reads all N;
      messages/s, ratio ≥ 1 across the spread.
  wire: produce latency p50 / p99 at 10k messages/s
      The same producer at a fixed offered rate of 10,000 messages/s for {F.wire_latency_s:g} s
      ({Q.wire_latency_s:g} s with --quick): delivery-report time minus produce() time, so
      linger.ms=5 is in it; reported.
  wire: transactional produce, N x 100 B, 1000 per transaction
      A producer with a transactional.id commits a transaction every 1,000
      messages (oncelog stores each end durably and fsyncs a marker in every
      partition; the mock keeps it in memory); messages/s, ratio ≥ 0.8 across
      the spread.
  wire: consumer group rebalance, 2 -> 3 members
      Two consumers share a topic; a third subscribes; the time until all
      three hold a complete, disjoint assignment; reported.
  wire: worst produce latency / p99 beside {_mib(F.wire_fetch_bytes)} fetches (oncelog serve only)
      An idempotent producer (linger.ms=0) offers 1,000 messages/s while a
      consumer in another process (fetch.max.bytes = max.partition.fetch.bytes
      = {_mib(F.wire_fetch_bytes)}) reads a preloaded 150 MiB partition from offset 0 over and over,
      against the same producer with no fetcher, alternating; the worst latency
      has target ratio ≤ 3 or ≤ 50 ms, p99 is reported.

How long it takes on a 2-core VM, roughly: {_durations()}.""")


EPILOG = """\
examples:
  oncelog bench --quick
  oncelog bench --json bench.json --plot bench.png
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
        help=f"{Q.repeats} repeats instead of {F.repeats} and smaller sizes "
        f"({_mib(Q.tail_scan_bytes)} tail scan, shorter durable windows); the figures are noisier and "
        "the header says so",
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
        "os.write loop (needs matplotlib: pip install 'oncelog[plot]')",
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
        help=f"also read {_thousands(F.spark_records)} records ({_thousands(Q.spark_records)} with --quick) "
        f"through the Spark data source on {F.spark_master} against spark.read.parquet of the same rows "
        "(needs pip install 'oncelog[spark]' and Java 17+)",
    )
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        help=f"the Spark master for --spark (default: {F.spark_master}); a standalone cluster's "
        "spark://host:7077 needs --dir on a filesystem its workers share and oncelog installed there",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="also measure oncelog serve over Kafka's wire protocol (a subprocess on a free port) against "
        "librdkafka's in-memory mock cluster with the same confluent-kafka client: idempotent produce and "
        "fetch throughput (target ratio ≥ 1 each), transactional produce (≥ 0.8) "
        "and produce latency p50/p99 at 10,000 messages/s "
        "(needs confluent-kafka: pip install 'oncelog[kafka]')",
    )
    parser.add_argument(
        "--compaction",
        action="store_true",
        help=f"also measure the log cleaner: Log.clean() of a {_mib(F.cleaner_log_bytes)} compacted log over "
        f"{F.cleaner_keys:,} keys ({_mib(Q.cleaner_log_bytes)} with --quick), a fresh copy each round, "
        "against a plain read + CRC-32C of the same segments, and the key map's memory per key "
        "(target ≤ 24 B, as Kafka's offset map)",
    )
    parser.set_defaults(handler="oncelog.cli.bench")
