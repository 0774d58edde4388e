"""The arguments and help text of `oncelog verify`; the command itself is `oncelog.cli.verify`."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = """\
Check every partition under ROOT without changing anything. ROOT is a partition
directory (it holds %020d.log segments) or a root of <topic>-<partition>
directories (an oncelog LogManager root, or a Kafka log.dir); root-wide entries
(.lock, meta.lmdb, producer_ids.lmdb, Kafka's checkpoint files) are skipped, and
so are partitions being deleted (<tp>.<hex>-delete, or a LogManager delete intent).

Checked, each file streamed in bounded reads:
  - every batch of every segment: size and length, magic 2, CRC-32C, offsets
    strictly increasing across batches and segments (the first batch at or above
    its segment's base offset); in a log written only by client appends also
    recordsCount = lastOffsetDelta + 1, partitionLeaderEpoch -1 and no gaps
    (a compacted batch legally holds fewer records than offsets, or none, and a
    compacted log has gaps: oncelog's cleaner clears the client-appends flag
    before it changes a segment);
  - a compacted log, below its cleaned point (the cleaner checkpoint: oncelog's,
    stored with the partition, or Kafka's cleaner-offset-checkpoint): at most one
    live record per key, from the log start on; records of aborted transactions
    (by the .txnindex files) and transaction markers are not counted, and past the
    cleaned point a key may appear again (that part is not cleaned yet);
  - every record of every batch decodes, compressed bodies inflated: each
    record's framing within the batch, recordsCount records exactly, offset
    deltas increasing within lastOffsetDelta (0..n-1 in a log of client appends);
    a batch that does not is CORRUPT wherever it is (recovery would serve it);
  - .index: offsets and positions strictly increasing, each entry at the start of
    the batch whose last offset it names, none past the batches;
  - .timeindex: timestamps and offsets non-decreasing, offsets within the segment;
  - .txnindex: every entry parses, in order, within its segment;
  - each producer snapshot, oncelog's or Kafka's v1: CRC, header, no producer twice.
Zeros up to the end of a segment or an index are pre-allocated space, not damage.

Each problem is one line naming the file and the byte position in it (and the
batch's base offset): CORRUPT for damage that opening the log would refuse or
serve (a metadata store that cannot be read, the partition's or the root's,
included; so is a key's second live record below the cleaned point, named at
the batch of the newer one, with both offsets); WARNING for what recovery
repairs by itself: a torn tail of the last segment ("recovery will cut N bytes
at position P": in a Kafka directory a batch cut short by the end of the file,
in an oncelog one anything past the recovery point), an index that an unclean
open rebuilds, zeros after the batches of a sealed segment, a file a cleaning
left when a crash interrupted its swap (.cleaned, .swap: the next open finishes
or undoes the swap). A summary line follows.

Strictly read-only: files are opened read-only, no lock is taken and no log is
opened, so it is safe on a live or a damaged log. A progress bar (partitions
done, bytes checked) is drawn on stderr when that is a terminal.

Exit status: 0 when no corruption was found (warnings allowed), 1 when some was
(or a file could not be read), 2 for bad input (ROOT missing, or holding neither
segments nor partition directories)."""


EPILOG = """\
examples:
  oncelog verify data/orders-0          # one partition directory
  oncelog verify /var/lib/kafka/data    # every <topic>-<partition> under a root
  oncelog verify --quiet --no-progress data || echo "corruption found"   # for cron"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "verify",
        help="check every batch, index and snapshot of a partition or a root (read-only)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="a partition directory or a root of them")
    parser.add_argument(
        "--quiet", action="store_true", help="print only CORRUPT lines: no warnings, no summary"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never draw the progress bar"
    )
    parser.set_defaults(handler="oncelog.cli.verify")
