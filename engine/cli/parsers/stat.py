"""The arguments and help text of `oncelog stat`; the command itself is `oncelog.cli.stat`."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = """\
Print one row per partition under ROOT: topic, partition, segments, bytes of
segment data, log start and end offsets, producers, open transactions, whether
the last shutdown was clean and, for a compacted log, its dirty ratio and where
its last cleaning ended, then a total row. ROOT is a partition directory (it
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
- dirty (shown, with the next column, when some partition is compacted): the
  share of a compacted log's cleanable bytes past its cleaner checkpoint (what
  the cleaner compares with min.cleanable.dirty.ratio). Cleanable are the sealed
  segments below the last stable offset and (oncelog) the recovery point, as the
  cleaner takes them, but as the files show them: the recovery point as of the
  last flush, the last stable offset as replayed above, and no
  min_compaction_lag_ms (the directory does not say it). "-" for a log never
  cleaned whose LogManager root does not give its topic cleanup_policy compact
  (or compact,delete).
- cleaned to: the cleaner checkpoint, where the last cleaning pass ended (below
  it each key has at most one record): oncelog's, stored with the partition, or
  Kafka's cleaner-offset-checkpoint in the log.dir; "-" if never cleaned.

A torn tail or an unreadable snapshot ends the scan where it is and is noted on
stderr (`oncelog verify` tells corruption from a torn tail). Strictly read-only:
files are opened read-only and no log is opened, so it is safe on a live log.

The table is drawn with rich on a terminal wide enough for it (folding long
topic names) and as aligned plain text otherwise; --json prints a list of
objects, one per partition (with last_stable_offset, format, path, notes,
cleanable_bytes, dirty_bytes, cleaner_delete_horizon_ms, cleanup_policy and
compacted besides the columns; dirty_ratio is given for every log, compacted or
not).

Exit status: 0, or 2 for bad input: ROOT missing, or holding neither segments nor
partition directories, or a file that cannot be read at all (a metadata store,
a directory named like a segment); the rows that could be read are still printed."""


EPILOG = """\
examples:
  oncelog stat data/orders-0
  oncelog stat /var/lib/kafka/data
  oncelog stat --json data | jq '.[] | select(.open_transactions > 0)'
  oncelog stat --json data | jq '.[] | select(.compacted and .dirty_ratio >= 0.5) | .path'"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "stat",
        help="one row per partition: segments, bytes, start/end offsets, producers, open transactions, "
        "dirty ratio",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a partition directory or a root of them")
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects, one per partition")
    parser.set_defaults(handler="oncelog.cli.stat")
