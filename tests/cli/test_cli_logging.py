"""What the `oncelog` command prints of logging: oncelog's warnings, never other libraries'.

Run as the real command (a subprocess): a test process has logging configured already,
which the command leaves alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from oncelog import Log
from oncelog.storage.clean_marker import CLEAN_SHUTDOWN_FILE


def _oncelog(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncelog.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_an_unreachable_server_is_one_line_without_the_clients_retry_warnings() -> None:
    done = _oncelog("topics", "--bootstrap", "127.0.0.1:1", "--timeout-s", "1", "list")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "oncelog topics: cannot reach 127.0.0.1:1: KafkaTimeoutError: Unable to bootstrap from 127.0.0.1:1"
    ]


def test_a_torn_tail_cut_by_recovery_is_one_oncelog_warning_line(tmp_path: Path) -> None:
    directory = tmp_path / "orders-0"
    with Log.open(str(directory)) as log:
        log.append_records([(b"k", b"v", [])])
    os.unlink(directory / CLEAN_SHUTDOWN_FILE)
    (segment,) = directory.glob("*.log")
    with open(segment, "ab") as torn:
        torn.write(b"\x07" * 100)  # a batch header cut short, as a power loss leaves it
    done = _oncelog("recover", "--no-progress", str(directory))
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("oncelog: WARNING: ")]
    assert len(warnings) == 1 and "torn tail" in warnings[0], done.stderr
