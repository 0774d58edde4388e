"""The arguments and help text of `oncelog demo`; the command itself is `oncelog.cli.demo`."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEMO_DESCRIPTION = """\
Run the oncelog demo: create a log in DATA_DIR, append to it, crash-recover it
and read it back, printing what happens along the way. Step 6 serves DATA_DIR/wire
with `oncelog serve` to a confluent-kafka producer and consumer, SIGKILLing the server
twice mid-stream, and counts duplicates and loss (both must be 0). Step 7 serves
DATA_DIR/fences to confluent-kafka clients through a relay that loses an acknowledgement
and stalls a consumer, and shows the sequence, epoch and generation fences refusing the
zombies. Steps 6 and 7 need confluent-kafka (pip install 'oncelog[kafka]'); without
it they are skipped, the demo says so once at the end, and the rest still runs."""


DEMO_EPILOG = """\
example:
  oncelog demo --data-dir ./data/demo"""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the end-to-end demo in a scratch data directory",
        description=DEMO_DESCRIPTION,
        epilog=DEMO_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--data-dir",
        default=os.path.join(".", "data", "demo"),
        help="where the demo keeps its log (default: %(default)s); it is deleted first, so it must be "
        "missing, empty, or an earlier demo's",
    )
    parser.set_defaults(handler="oncelog.cli.demo")
