"""Planning and reading a partition while its writer appends (the Spark source's situation).

A reader in another thread or process sees the page cache mid-append: a batch header
with its body half copied. Planning (stat_partition) must never count such a batch,
so a read up to the planned end never meets a batch failing its CRC.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from oncelog import Log, LogConfig
from oncelog.layout import TopicPartition
from oncelog.segments.batch import encode_batch
from oncelog.storage.fs import DEFAULT_FS
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_reader import read_batches
from oncelog.tools.partition_stat import stat_partition


def plan(directory: Path) -> int:
    tp = TopicPartition("t", 0)
    return stat_partition(DEFAULT_FS, Partition(str(directory), tp, str(directory.parent)), {}).log_end_offset


def test_a_half_written_last_batch_is_not_counted_in_the_planned_end(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    with Log.open(directory, LogConfig()) as log:
        log.append(encode_batch([(b"k", b"v")] * 3))
    whole = encode_batch([(b"k", b"x" * 500)] * 2)
    segment = directory / "00000000000000000000.log"
    with segment.open("r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(whole[:17] + whole[17:200] + bytes(len(whole) - 200))  # header in, body half copied
    assert plan(directory) == 3
    assert [b.base_offset for b in read_batches(DEFAULT_FS, str(directory), 0, 3)] == [0]


def test_reads_up_to_the_planned_end_never_meet_a_batch_being_written(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = Log.open(directory, LogConfig(segment_bytes=1 << 20))
    stop = threading.Event()
    small, large = encode_batch([(b"k", b"v" * 100)]), encode_batch([(b"k", b"v" * 16_000)])

    def write() -> None:
        n = 0
        while not stop.is_set():
            log.append(large if n % 3 == 0 else small)  # pwritev and mapped-copy paths
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    try:
        # As many reads as it takes, beside the writer, however slow the machine (the bound
        # only stops a hang).
        give_up = time.monotonic() + 300.0
        while reads < 20:
            assert time.monotonic() < give_up, f"only {reads} reads in 300 s"
            end = plan(directory)
            if end:
                read = list(read_batches(DEFAULT_FS, str(directory), max(0, end - 50), end))
                assert read and read[-1].last_offset == end - 1
                reads += 1
    finally:
        stop.set()
        writer.join()
        log.close()
