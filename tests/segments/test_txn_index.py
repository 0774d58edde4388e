"""The aborted-transaction index (issue 7, brief §3 and §8): Kafka's `.txnindex` layout.

The file's bytes are checked with struct, independently of the module. Most tests
use the real OS seam; the crash test uses the fault-injecting twin.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.errors import CorruptRecordError
from oncelog.segments.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex, TxnIndexSearch
from oncelog.storage.fs import OsFileSystem
from oncelog.torture.faultfs import FaultFileSystem

KAFKA_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset
BASE = 1000
FS = OsFileSystem()


def index_path(directory: Path | str, base: int = BASE) -> str:
    return os.path.join(directory, f"{base:020d}{TXN_INDEX_SUFFIX}")


def open_index(directory: Path | str, base: int = BASE) -> TransactionIndex:
    return TransactionIndex(FS, index_path(directory, base), base)


def kafka_bytes(*txns: AbortedTxn, version: int = 0) -> bytes:
    return b"".join(KAFKA_ENTRY.pack(version, *txn) for txn in txns)


A = AbortedTxn(producer_id=7, first_offset=1000, last_offset=1010, last_stable_offset=1000)
B = AbortedTxn(producer_id=8, first_offset=1005, last_offset=1020, last_stable_offset=1000)
C = AbortedTxn(producer_id=7, first_offset=1030, last_offset=1040, last_stable_offset=1030)


def test_an_index_with_no_aborted_transactions_has_no_file(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    assert index.is_empty and index.entries() == []
    assert index.collect_aborted(BASE, BASE + 100) == TxnIndexSearch([], False)
    index.truncate_to(BASE)
    index.reset()
    index.flush()
    index.close()
    index.delete()
    assert os.listdir(tmp_path) == []


def test_entries_round_trip_in_kafkas_34_byte_layout(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    for txn in (A, B, C):
        index.append(txn)
    index.flush()
    index.close()
    assert os.listdir(tmp_path) == ["00000000000000001000.txnindex"]
    raw = Path(index_path(tmp_path)).read_bytes()
    assert len(raw) == 3 * 34
    assert [KAFKA_ENTRY.unpack_from(raw, n * 34) for n in range(3)] == [(0, *t) for t in (A, B, C)]
    reopened = open_index(tmp_path)
    assert reopened.entries() == [A, B, C] and not reopened.is_empty


def test_a_torn_trailing_entry_is_ignored(tmp_path: Path) -> None:
    Path(index_path(tmp_path)).write_bytes(kafka_bytes(A, B) + kafka_bytes(C)[:20])
    index = open_index(tmp_path)
    assert index.entries() == [A, B]
    # The next append goes over the partial entry, not after it.
    index.append(C)
    index.close()
    assert Path(index_path(tmp_path)).read_bytes() == kafka_bytes(A, B, C)
    assert open_index(tmp_path).entries() == [A, B, C]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (B._replace(last_offset=A.last_offset), "not after the previous entry"),
        (AbortedTxn(8, 1000, 1009, 1000), "not after the previous entry"),
        (B._replace(first_offset=B.last_offset + 1), "is after last offset"),
    ],
)
def test_an_out_of_order_entry_is_refused_before_writing(
    tmp_path: Path, bad: AbortedTxn, reason: str
) -> None:
    index = open_index(tmp_path)
    index.append(A)
    with pytest.raises(ValueError, match=reason):
        index.append(bad)
    assert index.entries() == [A]
    assert Path(index_path(tmp_path)).read_bytes() == kafka_bytes(A)
    index.append(B)  # the index is still usable
    assert index.entries() == [A, B]


def test_an_entry_below_the_base_offset_is_refused_and_creates_no_file(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    with pytest.raises(ValueError, match="below the segment's base offset 1000"):
        index.append(AbortedTxn(1, 900, 999, 900))
    assert os.listdir(tmp_path) == []


def test_collect_aborted_returns_overlapping_entries_and_stops_at_a_stable_offset_past_the_upper_bound(
    tmp_path: Path,
) -> None:
    index = open_index(tmp_path)
    d = AbortedTxn(9, 1050, 1060, 1045)
    for txn in (A, B, C, d):
        index.append(txn)
    # A ends before the fetch offset; B and C overlap; d starts at the (exclusive) upper bound;
    # no stable offset reaches 1050, so older segments must be searched too.
    assert index.collect_aborted(1015, 1050) == TxnIndexSearch([B, C], False)
    assert index.collect_aborted(1015, 1051) == TxnIndexSearch([B, C, d], False)
    # C's stable offset 1030 >= 1030: the search stops at C, so d (after it) is not looked at.
    assert index.collect_aborted(1000, 1030) == TxnIndexSearch([A, B], True)
    # An entry that does not overlap the range still completes the search.
    assert index.collect_aborted(1041, 1045) == TxnIndexSearch([], True)
    assert index.collect_aborted(1061, 2000) == TxnIndexSearch([], False)


def test_truncate_to_drops_entries_at_or_after_the_offset(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    for txn in (A, B, C):
        index.append(txn)
    index.truncate_to(C.last_offset + 1)
    assert index.entries() == [A, B, C]
    index.truncate_to(C.last_offset)
    assert index.entries() == [A, B]
    index.truncate_to(B.last_offset - 1)
    assert index.entries() == [A]
    assert Path(index_path(tmp_path)).read_bytes() == kafka_bytes(A)
    index.append(C)  # ordering is checked against what is left
    index.close()
    assert open_index(tmp_path).entries() == [A, C]


def test_reset_then_rebuild(tmp_path: Path) -> None:
    # Garbage that would fail to read: reset must not read it.
    Path(index_path(tmp_path)).write_bytes(kafka_bytes(C, version=5) + b"\xff" * 10)
    index = open_index(tmp_path)
    index.reset()
    assert index.is_empty and os.path.getsize(index_path(tmp_path)) == 0
    index.append(A)
    index.append(B)
    index.flush()
    index.close()
    assert open_index(tmp_path).entries() == [A, B]


def test_bad_version_is_reported_with_file_and_position(tmp_path: Path) -> None:
    Path(index_path(tmp_path)).write_bytes(kafka_bytes(A) + kafka_bytes(B, version=1))
    index = open_index(tmp_path)
    with pytest.raises(CorruptRecordError) as caught:
        index.entries()
    assert caught.value.path == index_path(tmp_path) and caught.value.position == 34
    assert "version 1" in caught.value.reason


def test_an_entry_out_of_order_on_disk_is_reported_as_corrupt(tmp_path: Path) -> None:
    Path(index_path(tmp_path)).write_bytes(kafka_bytes(B, A))
    with pytest.raises(CorruptRecordError) as caught:
        open_index(tmp_path).entries()
    assert caught.value.position == 34 and "not after the previous entry" in caught.value.reason


def test_delete_closes_and_unlinks(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    index.append(A)
    index.delete()
    assert os.listdir(tmp_path) == [] and index.is_empty


@st.composite
def increasing_entries(draw: st.DrawFn) -> tuple[int, list[AbortedTxn]]:
    base = draw(st.integers(0, 2**40))
    entries = []
    last = base - 1
    for _ in range(draw(st.integers(0, 40))):
        last += draw(st.integers(1, 1000))
        first = last - draw(st.integers(0, last - base))
        lso = first - draw(st.integers(0, first))
        entries.append(AbortedTxn(draw(st.integers(0, 2**63 - 1)), first, last, lso))
    return base, entries


@settings(max_examples=100, deadline=None)
@given(increasing_entries(), st.data())
def test_random_increasing_entries_round_trip_and_truncate_like_a_filter(
    case: tuple[int, list[AbortedTxn]], data: st.DataObject
) -> None:
    base, written = case
    with tempfile.TemporaryDirectory() as directory:
        index = open_index(directory, base)
        for txn in written:
            index.append(txn)
        index.close()
        assert os.path.exists(index_path(directory, base)) == bool(written)
        reopened = open_index(directory, base)
        assert reopened.entries() == written
        cut = data.draw(st.integers(base, (written[-1].last_offset + 2) if written else base + 1))
        reopened.truncate_to(cut)
        expected = [txn for txn in written if txn.last_offset < cut]
        assert reopened.entries() == expected
        reopened.close()
        assert open_index(directory, base).entries() == expected
        if written:
            assert os.path.getsize(index_path(directory, base)) == 34 * len(expected)


def test_an_unflushed_entry_can_be_lost_on_power_loss_while_a_flushed_one_survives() -> None:
    path = "/d/" + f"{BASE:020d}{TXN_INDEX_SUFFIX}"
    outcomes = set()
    for seed in range(30):
        fs = FaultFileSystem(seed)
        fs.mkdir("/d")
        index = TransactionIndex(fs, path, BASE)
        index.append(A)
        index.flush()  # also makes the new file's name durable
        index.append(B)  # in the page cache only
        assert TransactionIndex(fs.crash("kill"), path, BASE).entries() == [A, B], fs.describe()
        for mode in ("dirent", "drop", "torn"):
            crashed = fs.crash(mode)
            after = TransactionIndex(crashed, path, BASE)
            try:
                entries = after.entries()
            except CorruptRecordError:
                # A torn write may leave garbage in the unflushed entry: recovery resets the
                # active segment's index, and the flushed entry before it is intact.
                assert mode == "torn", crashed.describe()
                entries = [A]
            assert entries[:1] == [A], crashed.describe()
            if mode == "drop":
                outcomes.add(tuple(entries))
                assert entries in ([A], [A, B]), crashed.describe()
    assert outcomes == {(A,), (A, B)}
