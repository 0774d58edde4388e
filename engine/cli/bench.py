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
from typing import TextIO

from oncelog.bench.harness import BenchSettings, Progress, settings_for
from oncelog.bench.report import load_average_text, print_report, write_json, write_plot
from oncelog.bench.run import run_benchmarks
from oncelog.cli.interrupts import interrupts_win

# Internal: scales every size and duration (the test suite runs at about 0.01).
SCALE_ENV = "ONCELOG_BENCH_SCALE"
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        scale = float(os.environ.get(SCALE_ENV, "1"))
    except ValueError:
        scale = 0.0
    if not 0 < scale <= 1:
        print(f"oncelog bench: {SCALE_ENV} must be a number in (0, 1]", file=err)
        return 2
    missing = _missing_extras(args)
    if missing:
        needs = "; ".join(f"{option} needs {what}" for option, what, _ in missing)
        extras = ",".join(extra for _, _, extra in missing)
        print(f"oncelog bench: {needs}: pip install 'oncelog[{extras}]'", file=err)
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
                # (A log a Ctrl-C failed refuses a clean close: still a Ctrl-C, not a failure.)
                with interrupts_win():
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


# Each option needing an extra: the module it imports, what to call it, the extra.
_EXTRAS = (
    ("--wire", "confluent_kafka", "confluent-kafka", "kafka"),
    ("--spark", "pyspark", "pyspark and pyarrow", "spark"),
    ("--plot", "matplotlib", "matplotlib", "plot"),
)


def _missing_extras(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(option, what it needs, extra) for every option given whose extra is not installed: all at once."""
    return [
        (option, what, extra)
        for option, module, what, extra in _EXTRAS
        if getattr(args, option[2:]) and importlib.util.find_spec(module) is None
    ]


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
