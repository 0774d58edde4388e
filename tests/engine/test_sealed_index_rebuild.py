"""A sealed segment whose indexes fail their sanity check is rebuilt when first read; a
rebuild that finds damage leaves the segment as it was (red team, issue 28).

Before: the rebuild had already cut the segment's size at the damage when it raised, and a
later clean close trimmed the file there, destroying the good batches after it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from oncelog import Log, encode_batch
from oncelog.errors import CorruptLogError

T0 = 1_700_000_000_000


def test_a_read_that_finds_damage_rebuilding_indexes_leaves_the_file_whole_through_a_clean_close(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    with Log.open(directory) as log:
        for n in range(40):
            log.append(encode_batch([(b"k", b"v%02d" % n)], timestamp_ms=T0))
        log.roll()
        log.append(encode_batch([(b"k", b"tail")], timestamp_ms=T0))
        positions = [p for p, _ in log.segments[0].scan()]
    sealed = directory / "00000000000000000000.log"
    size = sealed.stat().st_size
    for suffix in (".index", ".timeindex"):
        os.unlink(directory / f"00000000000000000000{suffix}")  # rebuilt at the first read
    # baseOffset is outside the CRC: batch 20 now claims the offset of batch 19.
    with open(sealed, "r+b") as file:
        file.seek(positions[20])
        file.write(struct.pack(">q", 19))
    with Log.open(directory) as log:
        with pytest.raises(CorruptLogError) as raised:
            log.read(0, 1 << 20)
        assert raised.value.path == str(sealed)
    assert sealed.stat().st_size == size  # the 19 good batches after the damage are still there
    with Log.open(directory) as log, pytest.raises(CorruptLogError) as again:
        log.read(0, 1 << 20)
    assert again.value.path == str(sealed)
