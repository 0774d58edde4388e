"""read_snapshot(into=table): rows read straight into the producer table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oncelog.errors import CorruptSnapshotError
from oncelog.producer_state import PRODUCER_DTYPE, WINDOW
from oncelog.storage import snapshot as snapshots
from oncelog.storage.fs import OsFileSystem


def rows(count: int) -> np.ndarray:
    out = np.zeros(count, PRODUCER_DTYPE)
    out["producer_id"] = np.arange(count) + 10
    out["live"] = 1
    out["window_count"] = WINDOW
    out["last_offset"][:, 0] = np.arange(count)
    return out


def test_rows_read_into_the_table_equal_a_plain_read_and_share_its_memory(tmp_path: Path) -> None:
    fs = OsFileSystem()
    snapshots.write_snapshot(fs, str(tmp_path), 7, rows(50))
    table = np.zeros(100, PRODUCER_DTYPE)
    got = snapshots.read_snapshot(fs, str(tmp_path), 7, into=table)
    assert np.shares_memory(got, table)
    assert got.tobytes() == snapshots.read_snapshot(fs, str(tmp_path), 7).tobytes() == rows(50).tobytes()


def test_a_corrupt_row_read_in_place_raises_and_leaves_zeroed_rows(tmp_path: Path) -> None:
    fs = OsFileSystem()
    path = Path(snapshots.write_snapshot(fs, str(tmp_path), 7, rows(50)))
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # inside the rows
    path.write_bytes(bytes(data))
    table = np.zeros(100, PRODUCER_DTYPE)
    with pytest.raises(CorruptSnapshotError, match="CRC"):
        snapshots.read_snapshot(fs, str(tmp_path), 7, into=table)
    assert not table.tobytes().strip(b"\x00")


def test_a_table_too_small_falls_back_to_a_plain_read(tmp_path: Path) -> None:
    fs = OsFileSystem()
    snapshots.write_snapshot(fs, str(tmp_path), 7, rows(50))
    table = np.zeros(10, PRODUCER_DTYPE)
    got = snapshots.read_snapshot(fs, str(tmp_path), 7, into=table)
    assert len(got) == 50 and not np.shares_memory(got, table)


# Several read chunks, the last one partial: the chunked read, CRC and checks line up.
MANY = 2 * snapshots._READ_CHUNK_ROWS + 7


def test_rows_read_into_the_table_in_chunks_equal_the_written_rows(tmp_path: Path) -> None:
    fs = OsFileSystem()
    snapshots.write_snapshot(fs, str(tmp_path), 7, rows(MANY))
    table = np.zeros(MANY + 3, PRODUCER_DTYPE)
    got = snapshots.read_snapshot(fs, str(tmp_path), 7, into=table)
    assert np.shares_memory(got, table)
    assert got.tobytes() == rows(MANY).tobytes()
    assert not table[MANY:].tobytes().strip(b"\x00")


@pytest.mark.parametrize("row", [0, snapshots._READ_CHUNK_ROWS, MANY - 1])
def test_a_corrupt_row_in_any_chunk_raises_and_leaves_zeroed_rows(tmp_path: Path, row: int) -> None:
    fs = OsFileSystem()
    path = Path(snapshots.write_snapshot(fs, str(tmp_path), 7, rows(MANY)))
    data = bytearray(path.read_bytes())
    data[len(data) - (MANY - row) * PRODUCER_DTYPE.itemsize] ^= 0x01  # the row's first byte
    path.write_bytes(bytes(data))
    table = np.zeros(MANY, PRODUCER_DTYPE)
    with pytest.raises(CorruptSnapshotError, match="CRC"):
        snapshots.read_snapshot(fs, str(tmp_path), 7, into=table)
    assert not table.tobytes().strip(b"\x00")


@pytest.mark.parametrize("row", [0, snapshots._READ_CHUNK_ROWS + 1, MANY - 1])
def test_a_row_breaking_its_invariants_in_any_chunk_is_corrupt(tmp_path: Path, row: int) -> None:
    fs = OsFileSystem()
    bad = rows(MANY)
    bad["live"][row] = 0
    snapshots.write_snapshot(fs, str(tmp_path), 7, bad)  # a valid CRC over a bad row
    with pytest.raises(CorruptSnapshotError, match="invariants"):
        snapshots.read_snapshot(fs, str(tmp_path), 7, into=np.zeros(MANY, PRODUCER_DTYPE))


def test_a_snapshot_cut_short_inside_the_rows_is_corrupt(tmp_path: Path) -> None:
    fs = OsFileSystem()
    path = Path(snapshots.write_snapshot(fs, str(tmp_path), 7, rows(MANY)))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 3 * PRODUCER_DTYPE.itemsize])
    with pytest.raises(CorruptSnapshotError):
        snapshots.read_snapshot(fs, str(tmp_path), 7, into=np.zeros(MANY, PRODUCER_DTYPE))
