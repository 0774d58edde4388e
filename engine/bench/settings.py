"""How big and how long each figure of `oncelog bench` is: the full and the quick run.

Light on purpose: `oncelog bench --help` quotes these numbers (oncelog.cli.parsers.bench
formats its help text from them), and --help must load nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KIB = 1024
MIB = 1024 * 1024
APPEND_SIZES = (("170 B (1 record)", 170), ("1 KiB", KIB), ("16 KiB", 16 * KIB), ("1 MiB", MIB))
RECOVERY_SEGMENT_COUNTS = (10, 30, 100)
DURABLE_THREADS = 16


@dataclass(frozen=True)
class BenchSettings:
    mode: str  # "full" or "quick" (plus " x<scale>" when scaled)
    repeats: int
    append_counts: tuple[int, ...]  # batches per round, one per APPEND_SIZES entry
    codec_batches: int  # batches encoded / decoded per repeat
    recovery_segment_bytes: int
    recovery_rounds: int
    tail_scan_bytes: int  # size of the active segment the tail scan recovers
    producers: int
    durable_window_s: float  # each durable measurement runs this long
    partitions: int  # partitions a LogManager opens (bench_manager)
    partition_rounds: int
    spark_records: int = 1_000_000  # records the Spark figure reads (oncelog bench --spark)
    wire_messages: int = 160_000  # messages each wire throughput repeat sends (oncelog bench --wire)
    wire_repeats: int = 5  # wire repeats: each one starts clients and sends wire_messages
    wire_latency_s: float = 3.0  # each wire latency measurement offers its fixed rate this long
    # What the big-fetch client asks per Fetch (Kafka's default fetch.max.bytes is 50 MiB).
    wire_fetch_bytes: int = 50 * MIB
    spark_master: str = "local[2]"  # the Spark figures' master URL (a standalone cluster: spark://host:7077)
    append_rounds: int = 15  # rounds of each append row, engine and reference in turn
    # The compaction figures (oncelog bench --compaction, oncelog.bench.cleaner): a log of this
    # many bytes of keyed records over this many keys, cleaned this many rounds.
    cleaner_log_bytes: int = 64 * MIB
    cleaner_keys: int = 50_000
    cleaner_rounds: int = 7

    def scaled(self, scale: float) -> BenchSettings:
        if scale == 1:
            return self
        return replace(
            self,
            mode=f"{self.mode} x{scale:g}",
            repeats=max(2, min(self.repeats, round(self.repeats * scale))),
            append_rounds=max(4, min(self.append_rounds, round(self.append_rounds * scale))),
            append_counts=tuple(max(4, int(count * scale)) for count in self.append_counts),
            codec_batches=max(4, int(self.codec_batches * scale)),
            recovery_segment_bytes=max(64 * KIB, int(self.recovery_segment_bytes * scale)),
            recovery_rounds=max(2, min(self.recovery_rounds, round(self.recovery_rounds * scale))),
            tail_scan_bytes=max(MIB, int(self.tail_scan_bytes * scale)),
            producers=max(1000, int(self.producers * scale)),
            durable_window_s=max(0.02, self.durable_window_s * scale),
            partitions=max(10, int(self.partitions * scale)),
            partition_rounds=max(1, min(self.partition_rounds, round(self.partition_rounds * scale))),
            spark_records=max(10_000, int(self.spark_records * scale)),
            wire_messages=max(4000, int(self.wire_messages * scale)),
            wire_repeats=max(2, min(self.wire_repeats, round(self.wire_repeats * scale))),
            wire_latency_s=max(0.5, self.wire_latency_s * scale),
            wire_fetch_bytes=max(MIB, int(self.wire_fetch_bytes * scale)),
            cleaner_log_bytes=max(MIB, int(self.cleaner_log_bytes * scale)),
            cleaner_keys=max(100, int(self.cleaner_keys * scale)),
            cleaner_rounds=max(4, min(self.cleaner_rounds, round(self.cleaner_rounds * scale))),
        )


FULL = BenchSettings(
    "full", 7, (20_000, 10_000, 1024, 16), 500, 2 * MIB, 15, 64 * MIB, 1_000_000, 1.0, 1000, 5
)
QUICK = BenchSettings(
    "quick",
    3,
    (10_000, 5_000, 512, 8),
    150,
    2 * MIB,
    3,
    32 * MIB,
    1_000_000,
    0.3,
    200,
    1,
    200_000,
    wire_messages=40_000,
    wire_repeats=3,
    wire_latency_s=1.5,
    append_rounds=9,
    cleaner_log_bytes=16 * MIB,
    cleaner_keys=12_500,
    cleaner_rounds=5,
)


def settings_for(quick: bool, scale: float = 1.0) -> BenchSettings:
    return (QUICK if quick else FULL).scaled(scale)


# How long each part of a run took on the project's 2-core VM, from the elapsed seconds
# its progress lines print (`oncelog bench --wire --compaction --spark`, then `--quick` with
# the same, load average 0.7-2.4); `oncelog bench --help` quotes them, rounded. Opening
# 10,000 partitions is most of the full run (about 250 s).
TYPICAL_RUN_S = {
    "full": 305.0,
    "quick": 20.0,
    "wire": 140.0,
    "wire quick": 66.0,
    "compaction": 26.0,
    "compaction quick": 5.0,
    "spark": 64.0,
    "spark quick": 34.0,
}
