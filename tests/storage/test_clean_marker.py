"""The clean-shutdown marker and the copy of the metadata store it carries (recovery.clean_marker).

A clean open trusts the copy only while the store is still the one it copied; every other
case reads the store, as before the copy existed, and a crash anywhere in a close's marker
write leaves a log that opens with the state it had.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from log_helpers import stored_batches

from oncelog.config import LogConfig
from oncelog.errors import CorruptMetadataError, LogFailedError
from oncelog.log import METADATA_DIR, Log
from oncelog.segments.batch import encode_batch
from oncelog.storage.checkpoint import LOG_START_KEY, write_offsets
from oncelog.storage.clean_marker import (
    CLEAN_SHUTDOWN_FILE,
    MAX_MARKER_BYTES,
    TAKEN_MARKER_FILE,
    StoreCopy,
    decode_marker,
    encode_marker,
)
from oncelog.storage.fs import DelegatingFileSystem, MetadataStore
from oncelog.storage.lmdb_store import LmdbStore
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def clock() -> int:
    return T0


def batch(pid: int, seq: int) -> bytes:
    return encode_batch(
        [(b"k", b"p%d-s%d" % (pid, seq))],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        timestamp_ms=T0,
    )


def fill(log: Log, count: int) -> None:
    """`count` more batches of producer 7, in sequence after what the log holds of it."""
    first = log.log_end_offset  # (producer 7 is the only writer: its next sequence)
    for seq in range(first, first + count):
        log.append(batch(7, seq))


class CountingStoreOpens(DelegatingFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.store_opens = 0

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        self.store_opens += 1
        return super().open_store(path, readonly=readonly)


def closed_log(directory: Path, count: int = 30) -> list[bytes]:
    with Log.open(directory, CONFIG, clock=clock) as log:
        fill(log, count)
        log.delete_records(3)  # a log start in the store, as well as the recovery point
        return stored_batches(log)


values_strategy = st.dictionaries(st.text(max_size=40), st.binary(max_size=64), max_size=20)
token_strategy = st.binary(min_size=1, max_size=64)


class TestCodec:
    @given(values_strategy, token_strategy)
    def test_a_whole_marker_decodes_to_the_copy_it_was_made_from(
        self, values: dict[str, bytes], token: bytes
    ) -> None:
        assert decode_marker(encode_marker(StoreCopy(token, values))) == StoreCopy(token, values)

    @given(values_strategy, token_strategy, st.data())
    @settings(max_examples=200)
    def test_a_marker_with_any_byte_changed_or_cut_carries_no_copy(
        self, values: dict[str, bytes], token: bytes, data: st.DataObject
    ) -> None:
        raw = bytearray(encode_marker(StoreCopy(token, values)))
        cut = data.draw(st.integers(0, len(raw) - 1))
        assert decode_marker(bytes(raw[:cut])) is None
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
        assert decode_marker(bytes(raw)) is None

    def test_an_empty_marker_as_older_versions_wrote_carries_no_copy(self) -> None:
        assert decode_marker(b"") is None

    def test_a_store_too_large_to_copy_gets_an_empty_marker(self) -> None:
        values = {f"retired/{n}": bytes(8) for n in range(MAX_MARKER_BYTES // 16)}
        assert encode_marker(StoreCopy(b"v", values)) == b""


class TestCleanOpenUsesTheCopy:
    def test_a_clean_reopen_reads_the_copy_and_opens_no_store(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        before = closed_log(directory)
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert log.recovery_report.clean
            assert fs.store_opens == 0
            assert (log.log_start_offset, stored_batches(log)) == (3, before)
            fill(log, 3)  # the first commit opens the store for writing, as before
        with Log.open(directory, CONFIG, clock=clock) as log:
            assert log.log_start_offset == 3 and log.log_end_offset == 33

    def test_a_store_committed_to_after_the_close_is_read_not_the_copy(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        store = LmdbStore(str(directory / METADATA_DIR))
        write_offsets(store, {LOG_START_KEY: 5})
        store.close()
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert fs.store_opens == 1
            assert log.log_start_offset == 5

    def test_a_store_put_back_from_an_older_copy_is_read(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        shutil.copytree(directory / METADATA_DIR, tmp_path / "older")  # log start 3
        with Log.open(directory, CONFIG, clock=clock) as log:
            log.delete_records(8)
        shutil.rmtree(directory / METADATA_DIR)
        shutil.copytree(tmp_path / "older", directory / METADATA_DIR)  # a restore, say
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert fs.store_opens == 1
            assert log.log_start_offset == 3

    def test_a_store_replaced_by_an_identical_copy_is_the_same_store(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        data = directory / METADATA_DIR / "data.mdb"
        shutil.copyfile(data, tmp_path / "copy.mdb")
        os.replace(tmp_path / "copy.mdb", data)  # another file, the same bytes
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert fs.store_opens == 0
            assert log.log_start_offset == 3

    @pytest.mark.parametrize("content", [b"", b"OLCM garbage", bytes(40)])
    def test_a_marker_without_a_whole_copy_is_still_clean_and_the_store_is_read(
        self, tmp_path: Path, content: bytes
    ) -> None:
        directory = tmp_path / "t-0"
        before = closed_log(directory)
        (directory / CLEAN_SHUTDOWN_FILE).write_bytes(content)
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert log.recovery_report.clean
            assert fs.store_opens == 1
            assert (log.log_start_offset, stored_batches(log)) == (3, before)

    def test_the_open_moves_the_marker_aside_and_the_close_writes_it_back_whole(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        log = Log.open(directory, CONFIG, clock=clock)
        assert not (directory / CLEAN_SHUTDOWN_FILE).exists()
        assert (directory / TAKEN_MARKER_FILE).exists()
        log.close()
        assert not (directory / TAKEN_MARKER_FILE).exists()
        copy = decode_marker((directory / CLEAN_SHUTDOWN_FILE).read_bytes())
        assert copy is not None and int.from_bytes(copy.values[LOG_START_KEY], "big") == 3


def flip_root_page_flag(directory: Path) -> None:
    """Damage the newest B-tree root page of the store, its size and times unchanged (bit rot)."""
    data = directory / METADATA_DIR / "data.mdb"
    status = data.stat()
    with open(data, "r+b") as file:
        metas = []
        for offset in (0, 4096):
            file.seek(offset)
            page = file.read(4096)
            metas.append(struct.unpack_from("=QQ", page, 128)[::-1])  # (txnid, root page)
        _, root = max(metas)
        file.seek(root * 4096 + 10)
        flags = file.read(1)[0]
        file.seek(root * 4096 + 10)
        file.write(bytes([flags ^ 1]))
    os.utime(data, ns=(status.st_atime_ns, status.st_mtime_ns))


class TestAStoreChangedBehindTheLog:
    def test_a_value_changed_in_place_keeping_size_and_times_is_read_from_the_store(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        data = directory / METADATA_DIR / "data.mdb"
        status = data.stat()
        raw = data.read_bytes()
        stored = LOG_START_KEY.encode() + (3).to_bytes(8, "big")
        assert stored in raw  # (in the current page, and in pages older commits left)
        data.write_bytes(raw.replace(stored, LOG_START_KEY.encode() + (5).to_bytes(8, "big")))
        os.utime(data, ns=(status.st_atime_ns, status.st_mtime_ns))
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
            assert fs.store_opens == 1
            assert log.log_start_offset == 5

    def test_bit_rot_in_a_store_page_since_the_close_is_named_at_open(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        flip_root_page_flag(directory)
        with pytest.raises(CorruptMetadataError, match=r"meta\.lmdb"):
            Log.open(directory, CONFIG, clock=clock)

    def test_a_store_damaged_while_open_fails_the_log_and_leaves_it_reopenable_in_the_process(
        self, tmp_path: Path
    ) -> None:
        directory = tmp_path / "t-0"
        closed_log(directory)
        log = Log.open(directory, CONFIG, clock=clock)  # the copy: the store is not opened
        flip_root_page_flag(directory)
        fill(log, 2)
        log.flush()
        with pytest.raises(LogFailedError):
            log.checkpoint()  # its first commit meets the damage
        with pytest.raises(LogFailedError):
            log.close()
        # No store environment left open by the failed log (which is still referenced here):
        # the reopen names the damage instead of waiting for a turn on the environment.
        with pytest.raises(CorruptMetadataError, match=r"meta\.lmdb"):
            Log.open(directory, CONFIG, clock=clock)
        assert not (directory / CLEAN_SHUTDOWN_FILE).exists()

    def test_a_store_replaced_while_the_log_is_open_gets_no_copy_in_the_marker(self, tmp_path: Path) -> None:
        directory = tmp_path / "t-0"
        store = directory / METADATA_DIR
        closed_log(directory)
        shutil.copytree(store, tmp_path / "older")  # log start 3
        with Log.open(directory, CONFIG, clock=clock) as log:
            log.delete_records(12)
            shutil.rmtree(store)
            shutil.copytree(tmp_path / "older", store)  # by hand, behind the log
        assert decode_marker((directory / CLEAN_SHUTDOWN_FILE).read_bytes()) is None
        fs = CountingStoreOpens()
        with Log.open(directory, CONFIG, fs=fs, clock=clock) as reopened:
            assert fs.store_opens == 1  # as after a crash: what the store says, not the log's memory
            assert reopened.log_start_offset == 3


class TestCrashWhileWritingTheMarker:
    def test_a_crash_at_any_io_call_of_a_close_reopens_to_the_same_log(self) -> None:
        directory = "/d/t-0"

        def build(fs: FaultFileSystem) -> tuple[Log, list[bytes]]:
            with Log.open(directory, CONFIG, fs=fs, clock=clock) as log:
                fill(log, 30)
                log.delete_records(3)
            log = Log.open(directory, CONFIG, fs=fs, clock=clock)  # clean, from the copy
            fill(log, 4)
            log.flush()
            return log, stored_batches(log)

        dry = FaultFileSystem(5)
        log, _ = build(dry)
        start = dry.io_calls
        log.close()
        calls = dry.io_calls - start
        assert calls > 5
        for n in range(1, calls + 1):
            fs = FaultFileSystem(5)
            log, before = build(fs)
            fs.kill_at(fs.io_calls + n)
            with pytest.raises(SimulatedCrash):
                log.close()
            for mode in ("kill", "drop", "torn", "dirent"):
                crashed = fs.crash(mode)  # type: ignore[arg-type]
                why = f"killed at close I/O call {n}/{calls}, {mode}; {crashed.describe()}"
                with Log.open(directory, CONFIG, fs=crashed, clock=clock) as reopened:
                    assert stored_batches(reopened) == before, why
                    assert reopened.log_start_offset == 3, why
                with Log.open(directory, CONFIG, fs=crashed, clock=clock) as again:  # (clean now)
                    assert again.recovery_report.clean, why
                    assert (again.log_start_offset, stored_batches(again)) == (3, before), why
