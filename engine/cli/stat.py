"""`oncelog stat ROOT`: the command line of the one-row-per-partition summary.

Argument parsing and printing only: partitions are found by `partition_dirs` and
each row is computed by `partition_stat`. Printed as a rich table on a terminal,
as aligned plain text otherwise, or as JSON. Strictly read-only: everything goes
through a `ReadOnlyFileSystem`, and no `Log` is opened.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Literal, TextIO

from oncelog.layout import TopicPartition
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import (
    KAFKA_CLEANER_CHECKPOINT,
    BadInputError,
    Partition,
    find_partitions,
    read_kafka_checkpoint,
    read_kafka_log_starts,
    root_store_error,
    topic_cleanup_policy,
)
from oncelog.tools.partition_stat import PartitionStat, stat_partition

EXIT_OK, EXIT_BAD_INPUT = 0, 2


COLUMNS = (
    "topic",
    "partition",
    "segments",
    "bytes",
    "start",
    "end",
    "producers",
    "open txns",
    "clean",
    "dirty",
    "cleaned to",
)
_LEFT = (0, 8)  # the columns of text, left-aligned; the others are numbers
_COMPACTION_COLUMNS = 2  # the last two: shown only when some partition is compacted


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs = ReadOnlyFileSystem(DEFAULT_FS)
    try:
        partitions = find_partitions(args.root, fs)
    except BadInputError as exc:
        print(f"oncelog stat: {exc}", file=err)
        return EXIT_BAD_INPUT
    status = EXIT_OK
    root_error = root_store_error(fs, args.root)
    if root_error is not None:
        print(f"oncelog stat: {root_error}", file=err)
        status = EXIT_BAD_INPUT
    roots = _RootFacts(fs)
    stats = []
    for partition in partitions:
        try:
            stat = roots.stat(partition)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else partition.path
            print(f"oncelog stat: {partition.label}: cannot read {where}: {exc.strerror or exc}", file=err)
            status = EXIT_BAD_INPUT
            continue
        for note in stat.notes:
            print(f"oncelog stat: {partition.label}: {note}", file=err)
        if stat.metadata_unreadable:
            status = EXIT_BAD_INPUT
        stats.append(stat)
    if args.json:
        print(json.dumps([dataclasses.asdict(stat) for stat in stats], indent=2), file=out)
    elif out.isatty():
        _print_rich(table_columns(stats), table_rows(stats), out)
    else:
        for line in plain_table(table_columns(stats), table_rows(stats)):
            print(line, file=out)
    return status


class _RootFacts:
    """What each root holding partitions says about them, read once per root (and topic)."""

    def __init__(self, fs: ReadOnlyFileSystem):
        self._fs = fs
        self._starts: dict[str, dict[TopicPartition, int]] = {}
        self._cleaned_to: dict[str, dict[TopicPartition, int]] = {}
        self._policies: dict[tuple[str, str], str | None] = {}

    def stat(self, partition: Partition) -> PartitionStat:
        root = partition.root
        if root not in self._starts:
            self._starts[root] = read_kafka_log_starts(self._fs, root)
            self._cleaned_to[root] = read_kafka_checkpoint(self._fs, root, KAFKA_CLEANER_CHECKPOINT)
        policy = None
        if partition.tp is not None:
            key = (root, partition.tp.topic)
            if key not in self._policies:
                self._policies[key] = topic_cleanup_policy(self._fs, root, partition.tp.topic)
            policy = self._policies[key]
        return stat_partition(
            self._fs,
            partition,
            self._starts[root],
            kafka_cleaned_to=self._cleaned_to[root],
            cleanup_policy=policy,
        )


def table_columns(stats: list[PartitionStat]) -> tuple[str, ...]:
    """The table's columns: dirty and cleaned to only when some partition is compacted."""
    return COLUMNS if any(s.compacted for s in stats) else COLUMNS[:-_COMPACTION_COLUMNS]


def table_rows(stats: list[PartitionStat]) -> list[list[str]]:
    """The cells of each row (those of table_columns), the total row last."""
    rows = [
        [
            s.topic,
            "-" if s.partition is None else str(s.partition),
            str(s.segments),
            str(s.size_bytes),
            str(s.log_start_offset),
            str(s.log_end_offset),
            str(s.producers),
            str(s.open_transactions),
            "yes" if s.clean_shutdown else "no",
            f"{s.dirty_ratio:.2f}" if s.compacted else "-",
            "-" if s.cleaner_checkpoint is None else str(s.cleaner_checkpoint),
        ]
        for s in stats
    ]
    total = ["total", "", str(sum(s.segments for s in stats))]
    total += [str(sum(s.size_bytes for s in stats)), "", "", str(sum(s.producers for s in stats))]
    total += [str(sum(s.open_transactions for s in stats)), "", "", ""]
    shown = len(table_columns(stats))
    return [row[:shown] for row in [*rows, total]]


def plain_table(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """Aligned columns: text left, numbers right."""
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows, strict=True)]
    lines = []
    for row in [list(columns), *rows]:
        cells = [
            c.ljust(w) if n in _LEFT else c.rjust(w) for n, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _print_rich(columns: tuple[str, ...], rows: list[list[str]], out: TextIO) -> None:
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for n, name in enumerate(columns):
        # Headers whole: a narrow terminal folds the long topic names instead.
        justify: Literal["left", "right"] = "left" if n in _LEFT else "right"
        table.add_column(
            name, justify=justify, overflow="fold", no_wrap=n > 0, min_width=8 if n == 0 else None
        )
    for row in rows[:-1]:
        table.add_row(*row)
    table.add_section()
    table.add_row(*rows[-1], style="bold")
    console = Console(file=out)
    unbounded = console.options.update(max_width=sys.maxsize)
    if Measurement.get(console, unbounded, table).minimum > console.width:
        # Too narrow even with the topics folded: rich would cut numbers short. Plain lines
        # wrap on the terminal but keep every figure whole.
        for line in plain_table(columns, rows):
            print(line, file=out)
        return
    console.print(table)
