"""A live log's active segment whose reserved space ends less than a batch's size prefix
(17 bytes) after its data: `dump`, `verify` and `stat` take those zeros for unwritten space,
as they take longer runs of them, not for a batch cut short.

Found while verifying compacted logs between cleanings: the active segment is reserved to
segment_bytes ahead of the writes, and a batch can end 1 to 16 bytes before that end.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments import encode_batch

SEGMENT_BYTES = 1024
LEFT = 8  # bytes of reserved space after the batch


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    # Another process, as on a live log: LMDB refuses a second environment in one process.
    return subprocess.run([sys.executable, "-m", "oncelog.cli", *argv], capture_output=True, text=True)


@pytest.fixture
def live_log(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "orders-0"
    log = Log.open(directory, LogConfig(segment_bytes=SEGMENT_BYTES))
    batch = next(
        b
        for n in range(SEGMENT_BYTES)
        if len(b := encode_batch([(b"k", b"x" * n)], timestamp_ms=0)) == SEGMENT_BYTES - LEFT
    )
    log.append(batch)
    log.flush()
    segment = directory / f"{0:020d}.log"
    data = segment.read_bytes()
    assert len(data) == SEGMENT_BYTES and data[-LEFT:] == bytes(LEFT)  # the reservation's zeros
    yield directory
    log.close()


def test_verify_dump_and_stat_take_a_short_zero_tail_of_a_live_segment_for_reserved_space(
    live_log: Path,
) -> None:
    verify = cli("verify", "--no-progress", str(live_log))
    assert (verify.returncode, verify.stdout.splitlines()[-1].endswith(": no problems")) == (0, True), verify

    dump = cli("dump", str(live_log))
    assert (dump.returncode, dump.stderr) == (0, ""), dump
    assert dump.stdout.splitlines()[-1] == f"{LEFT} bytes of unwritten space follow the last batch"

    stat = cli("stat", str(live_log))
    assert (stat.returncode, stat.stderr) == (0, ""), stat
