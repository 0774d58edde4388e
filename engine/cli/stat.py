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
from typing import Any, Literal, TextIO

from oncelog.layout import TopicPartition
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import (
    BadInputError,
    find_partitions,
    read_kafka_log_starts,
    root_store_error,
)
from oncelog.tools.partition_stat import PartitionStat, stat_partition

EXIT_OK, EXIT_BAD_INPUT = 0, 2

DESCRIPTION = """\
Print one row per partition under ROOT: topic, partition, segments, bytes of
segment data, log start and end offsets, producers, open transactions and whether
the last shutdown was clean, then a total row. ROOT is a partition directory (it
holds %020d.log segments) or a root of <topic>-<partition> directories (an
oncelog LogManager root, or a Kafka log.dir).

- start: oncelog's stored log start offset (moved by delete_records and
  retention); in a Kafka log.dir, its log-start-offset-checkpoint; else the first
  segment's base offset.
- end: one past the last batch of the last segment, from a scan of its headers.
- producers, open txns: the newest readable producer snapshot at or below the end
  (oncelog's or Kafka's v1), then the batch headers after it, as opening the log
  would rebuild them, but without expiry (stat does not know the log's
  producer_expiration_ms). An open transaction is a producer's transactional data
  not yet closed by a COMMIT or ABORT marker.
- clean: oncelog's .clean_shutdown marker, or Kafka's .kafka_cleanshutdown in the
  log.dir; "no" also for a log that is open right now.

A torn tail or an unreadable snapshot ends the scan where it is and is noted on
stderr (`oncelog verify` tells corruption from a torn tail). Strictly read-only:
files are opened read-only and no log is opened, so it is safe on a live log.

The table is drawn with rich on a terminal and as aligned plain text otherwise;
--json prints a list of objects, one per partition (with last_stable_offset,
format, path and notes besides the columns).

Exit status: 0, or 2 for bad input: ROOT missing, or holding neither segments nor
partition directories, or a file that cannot be read at all (a metadata store,
a directory named like a segment); the rows that could be read are still printed."""

EPILOG = """\
examples:
  oncelog stat data/orders-0
  oncelog stat /var/lib/kafka/data
  oncelog stat --json data | jq '.[] | select(.open_transactions > 0)'"""

COLUMNS = ("topic", "partition", "segments", "bytes", "start", "end", "producers", "open txns", "clean")


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "stat",
        help="one row per partition: segments, bytes, start/end offsets, producers, open transactions",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a partition directory or a root of them")
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects, one per partition")
    parser.set_defaults(handler=run)


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
    starts: dict[str, dict[TopicPartition, int]] = {}
    stats = []
    for partition in partitions:
        try:
            if partition.root not in starts:
                starts[partition.root] = read_kafka_log_starts(fs, partition.root)
            stat = stat_partition(fs, partition, starts[partition.root])
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
        _print_rich(table_rows(stats), out)
    else:
        for line in plain_table(table_rows(stats)):
            print(line, file=out)
    return status


def table_rows(stats: list[PartitionStat]) -> list[list[str]]:
    """The cells of each row, the total row last."""
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
        ]
        for s in stats
    ]
    total = ["total", "", str(sum(s.segments for s in stats))]
    total += [str(sum(s.size_bytes for s in stats)), "", "", str(sum(s.producers for s in stats))]
    total += [str(sum(s.open_transactions for s in stats)), ""]
    return [*rows, total]


def plain_table(rows: list[list[str]]) -> list[str]:
    """Aligned columns: text left, numbers right."""
    widths = [max(len(cell) for cell in column) for column in zip(COLUMNS, *rows, strict=True)]
    lines = []
    for row in [list(COLUMNS), *rows]:
        cells = [
            c.ljust(w) if n in (0, 8) else c.rjust(w)
            for n, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _print_rich(rows: list[list[str]], out: TextIO) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for n, name in enumerate(COLUMNS):
        # Headers whole: a narrow terminal folds the long topic names instead.
        justify: Literal["left", "right"] = "right" if 0 < n < 8 else "left"
        table.add_column(
            name, justify=justify, overflow="fold", no_wrap=n > 0, min_width=8 if n == 0 else None
        )
    for row in rows[:-1]:
        table.add_row(*row)
    table.add_section()
    table.add_row(*rows[-1], style="bold")
    Console(file=out).print(table)
