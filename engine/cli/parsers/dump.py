"""The arguments and help text of `oncelog dump`; the command itself is `oncelog.cli.dump`."""

from __future__ import annotations

import argparse
from typing import Any

MAX_SHOWN_CHARS = 200  # `dump --records` cuts a key or a value to this many characters


DUMP_DESCRIPTION = """\
Print the record batches of a segment file (%020d.log) or of every segment of a
partition directory (in offset order), one line per batch, like Kafka's
kafka-dump-log.sh (DumpLogSegments). Strictly read-only: nothing is created or
modified and the log is not opened (no lock taken), so it is safe on a live or
damaged log.

Each batch line shows its header: baseOffset, lastOffset, count, producer id,
epoch and sequences, partitionLeaderEpoch, isTransactional, isControl, its byte
position in the file, its max timestamp (CreateTime or LogAppendTime), size,
compression codec, stored CRC and whether it is valid (CRC-32C and structure).
With --records, a transaction marker (a control record) is shown as
`endTxnMarker: COMMIT|ABORT coordinatorEpoch: N`. A summary line ends each file.

A compacted log keeps its offsets but not every record. A batch may hold fewer
records than its offsets (its line ends `offsetsWithoutRecord: N`) or none
(`emptyBatch: true`: kept for its producer's sequence, or to end its segment),
and whole batches may be gone: `gap: offsets A..B (N offsets) are in no batch`
stands where they were (in a directory, also after a segment's last batch when
the next segment starts later), and the summary counts those offsets. With
--records, `| gap: offsets A..B (N offsets) have no record` marks the offsets
of a batch that hold no record. A batch whose tombstones or transaction marker
a cleaning kept shows `deleteHorizonMs: T` after isControl (KIP-534, attribute
bit 6: its base timestamp is then that horizon; a cleaning from T on may remove
them). In a log written by client appends only, a gap is lost data, which
`oncelog verify` reports.

A transaction index (%020d.txnindex: the aborted transactions whose ABORT marker
is in that segment) is dumped one line per entry, as Kafka does:
`version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S`.
For a directory, each segment's index (if it has one) follows its batches. A
partial entry at the end (a crash mid-append leaves one) is ignored, as the
engine ignores it. The last stable offset of the log itself is not shown: that
needs the producer state, which only opening the log recovers.

Exit status is 2 if PATH does not exist, holds no segments, or a file is not a
segment (an empty file is one only if named %020d.log), has an impossible batch
header or ends in the middle of a batch, or a transaction index has an entry
with a bad version or out of order, a snapshot is corrupt (bad CRC, length or
header) or an index has entries out of order; what was readable is printed
first and the error (file and byte position) goes to stderr. A batch whose CRC
does not match is shown with `isvalid: false` and does not change the exit
status."""


DUMP_EPILOG = """\
examples:
  oncelog dump data/orders-0/00000000000000000000.log
  oncelog dump data/orders-0                    # every segment, in offset order
  oncelog dump --records data/orders-0 | head   # records too (key, payload, headers)
  oncelog dump data/orders-0/00000000000000000000.txnindex   # aborted transactions
  oncelog dump --producers --indexes data/orders-0   # + newest snapshot, offset/time indexes
  oncelog dump --snapshot data/orders-0/00000000000000000042.snapshot"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "dump",
        help="print the record batches (and optionally records) of segment files",
        description=DUMP_DESCRIPTION,
        epilog=DUMP_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        help="a segment file (%%020d.log), a transaction index (%%020d.txnindex), an offset or time "
        "index (.index, .timeindex), a producer snapshot (%%020d.snapshot) or a partition directory",
    )
    parser.add_argument(
        "--snapshot",
        metavar="FILE",
        help="print the producer-state snapshot FILE (oncelog's or Kafka's): one line per producer "
        "(id, epoch, coordinator epoch, open transaction, newest batch); oncelog's snapshots keep "
        "up to 5 batches per producer, printed indented after it",
    )
    parser.add_argument(
        "--producers",
        action="store_true",
        help="after the segments, print the newest producer snapshot of the directory the same way",
    )
    parser.add_argument(
        "--indexes",
        action="store_true",
        help="after each segment, print its offset index (`offset: N position: P`) and time index "
        "(`timestamp: T offset: N`) entries, up to any zero-filled tail",
    )
    parser.add_argument(
        "--records",
        action="store_true",
        help="after each batch, print one line per record: offset, timestamp, key and value "
        "sizes, sequence, header keys, key and payload (UTF-8, escaped, truncated to "
        f"{MAX_SHOWN_CHARS} characters); control records are decoded as transaction markers, and the "
        "offsets of a compacted batch that hold no record are shown as a gap line",
    )
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="skip the CRC-32C and structure check of each batch (faster on big segments); "
        "the batch lines then have no isvalid field",
    )
    parser.set_defaults(handler="oncelog.cli.dump")
