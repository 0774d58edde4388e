"""`oncelog bench`'s run: every figure step in turn, each in a scratch directory of its own."""

from __future__ import annotations

import time

from oncelog.bench import cleaner as bench_cleaner
from oncelog.bench import manager as bench_manager
from oncelog.bench import recovery as bench_recovery
from oncelog.bench.harness import (
    BenchResults,
    BenchSettings,
    Progress,
    Step,
    append_figures,
    codec_figures,
    count_label,
    durable_figures,
    scratch_dir,
)


def benchmark_steps(
    settings: BenchSettings, *, spark: bool = False, wire: bool = False, compaction: bool = False
) -> list[tuple[str, Step]]:
    """The steps of a run, each with its progress label: the default ones, then the optional."""
    steps: list[tuple[str, Step]] = [
        ("append, no fsync", append_figures),
        ("batch encode and decode vs kafka-python", codec_figures),
        ("unclean recovery", bench_recovery.recovery_figures),
        ("tail scan on recovery", bench_recovery.tail_scan_figure),
        (f"producer table at {count_label(settings.producers)} producers", bench_recovery.producer_figures),
        ("durable appends", durable_figures),
        (f"opening {settings.partitions:,} partitions", bench_manager.partition_open_figures),
    ]
    if compaction:
        steps.append(("log compaction: Log.clean() vs read + CRC-32C", bench_cleaner.cleaner_figures))
    if spark:
        from oncelog.bench import spark as spark_bench  # here: pyspark is the spark extra

        steps.append(("Spark read vs parquet", spark_bench.spark_read_figures))
    if wire:
        from oncelog.bench import wire as wire_bench  # here: confluent-kafka is the kafka extra

        steps.append(("Kafka wire: oncelog serve vs librdkafka's mock cluster", wire_bench.wire_figures))
    return steps


def run_benchmarks(
    settings: BenchSettings,
    directory: str,
    progress: Progress,
    *,
    spark: bool = False,
    wire: bool = False,
    compaction: bool = False,
) -> BenchResults:
    """Measure every performance figure in scratch directories under `directory` (removed after);
    `spark` adds the Spark read figure (needs the spark extra and Java 17+), `wire` the Kafka wire
    figures of `oncelog serve` against librdkafka's mock cluster (needs confluent-kafka),
    `compaction` the log cleaner's figures (oncelog.bench.cleaner)."""
    steps = benchmark_steps(settings, spark=spark, wire=wire, compaction=compaction)
    results = BenchResults(settings)
    started = time.perf_counter()
    for n, (label, step) in enumerate(steps, 1):
        progress(f"[{n}/{len(steps)}] {label}")
        with scratch_dir(directory, f"step{n}") as scratch:
            step(settings, scratch, results, progress)
    results.elapsed_s = time.perf_counter() - started
    return results
