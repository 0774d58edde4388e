"""A cleaner's swap cut short at each step, then the directory opened (recovery.swaps' table).

Each crash is the real cleaning pass stopped at one step of the protocol (the step
raising, as a kill there would leave the files), the directory copied as the kill leaves
it, and the copy opened: it must hold either the old segment or the cleaned one, whole,
with no `.cleaned` or `.swap` file left and indexes that agree with the file kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest
from log_helpers import read_records

from oncelog import Log, LogConfig, LogFailedError
from oncelog.recovery.swaps import CLEANED_SUFFIX, SWAP_SUFFIX, settle_swaps
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.storage.fs import DEFAULT_FS

NOW_MS = int(time.time() * 1000)  # (a batch stamped long ago rolls its segment: segment_ms)
CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=4096, retention_ms=None)


class Crash(BaseException):
    """What a kill at this step leaves: nothing after it runs."""


def _dirty_log(directory: Path) -> Log:
    log = Log.open(directory, CONFIG)
    for round_ in range(20):
        for key in range(4):
            log.append(encode_batch([(f"k{key}".encode(), f"r{round_}".encode())], timestamp_ms=NOW_MS))
    log.roll()
    return log


def _view(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        out += [(r.offset, r.key, r.value) for r in fetched.records()]
        offset = fetched.next_offset
    return out


def _reference_views(tmp_path: Path) -> tuple[list[tuple[int, bytes | None, bytes | None]], ...]:
    with _dirty_log(tmp_path / "reference-0") as log:
        old = _view(log)
        log.clean()
        return old, _view(log)


def _crash_during_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str) -> Path:
    """Clean a dirty log, crashing at step `at`; the directory a kill would leave (copied)."""
    log = _dirty_log(tmp_path / "crashing-0")
    fs = log._fs
    real_rename, real_unlink = fs.rename, fs.unlink

    def rename(src: str, dst: str) -> None:
        if (at == "before the .swap rename" and src.endswith(CLEANED_SUFFIX)) or (
            at == "before the rename over the old segment" and src.endswith(SWAP_SUFFIX)
        ):
            raise Crash(at)
        real_rename(src, dst)

    def unlink(path: str) -> None:
        if at == "before the old indexes go" and path.endswith(".index"):
            raise Crash(at)
        real_unlink(path)

    monkeypatch.setattr(fs, "rename", rename)
    monkeypatch.setattr(fs, "unlink", unlink)
    with pytest.raises(Crash):
        log.clean()
    monkeypatch.undo()
    image = tmp_path / "image-0"
    shutil.copytree(log.directory, image)  # every file as the page cache holds it
    (image / ".clean_shutdown").unlink(missing_ok=True)
    with contextlib.suppress(LogFailedError):
        log.close()  # (a log failed by the crash closes without its marker)
    return image


@pytest.mark.parametrize(
    ("at", "which"),
    [
        ("before the .swap rename", "old"),
        ("before the old indexes go", "cleaned"),
        ("before the rename over the old segment", "cleaned"),
    ],
)
def test_a_swap_cut_short_leaves_the_old_or_the_cleaned_segment_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str, which: str
) -> None:
    old, cleaned = _reference_views(tmp_path)
    image = _crash_during_clean(tmp_path, monkeypatch, at)
    leftovers = sorted(n for n in os.listdir(image) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)))
    assert leftovers  # the crash left the protocol half way
    with Log.open(image, CONFIG) as reopened:
        view = _view(reopened)
        # The first segment is the one cut short; the rest were not reached.
        first_end = reopened.segments[1].base_offset
        expected = old if which == "old" else cleaned
        assert [r for r in view if r[0] < first_end] == [r for r in expected if r[0] < first_end]
        assert [r for r in view if r[0] >= first_end] == [r for r in old if r[0] >= first_end]
        assert not [n for n in os.listdir(image) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))]
        reopened.clean()  # and a pass finishes the job
        assert _view(reopened) == cleaned


def test_indexes_missing_after_a_finished_swap_are_rebuilt_from_the_cleaned_file(tmp_path: Path) -> None:
    _, cleaned = _reference_views(tmp_path)
    with _dirty_log(tmp_path / "p-0") as log:
        log.clean()
    for suffix in (".index", ".timeindex"):
        os.unlink(tmp_path / "p-0" / f"{0:020d}{suffix}")
    with Log.open(tmp_path / "p-0", CONFIG) as reopened:
        assert _view(reopened) == cleaned
        assert reopened.read(reopened.segments[0].next_offset - 1).batches  # found through the index


def test_a_stray_swap_name_that_is_not_a_segment_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.log.swap").write_bytes(b"x")
    (tmp_path / f"{5:020d}.log.cleaned").write_bytes(b"half written")
    assert settle_swaps(DEFAULT_FS, str(tmp_path), os.listdir(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["notes.log.swap"]


def _log_whose_next_pass_removes_an_abort_marker(directory: Path) -> Log:
    config = LogConfig(cleanup_policy="compact", segment_bytes=4096, delete_retention_ms=0)
    log = Log.open(directory, config)
    log.append(encode_batch([(b"k", b"aborted")], producer_id=9, producer_epoch=0, base_sequence=0,
                            is_transactional=True, timestamp_ms=NOW_MS))  # fmt: skip
    log.write_txn_marker(9, 0, commit=False, coordinator_epoch=0)
    for seq in range(1, 7):
        log.append(
            encode_batch(
                [(b"j", b"x")], producer_id=9, producer_epoch=0, base_sequence=seq, timestamp_ms=NOW_MS
            )
        )
    log.append(encode_batch([(b"k", b"later")], producer_id=9, producer_epoch=0, base_sequence=7,
                            is_transactional=True, timestamp_ms=NOW_MS))  # fmt: skip
    log.write_txn_marker(9, 0, commit=True, coordinator_epoch=0)
    log.roll()
    log.clean()  # the marker gets its horizon (now: delete_retention_ms 0)
    return log


@pytest.mark.parametrize(
    ("crash_on", "entries_after"),
    [
        (SWAP_SUFFIX, [1]),  # the log's swap rename: the old segment and its index entry stand
        (".txnindex", []),  # the index's rename into place: the reopen finishes both
    ],
)
def test_a_transaction_index_swaps_with_its_log_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_on: str, entries_after: list[int]
) -> None:
    log = _log_whose_next_pass_removes_an_abort_marker(tmp_path / "p-0")
    real_rename = log._fs.rename

    def rename(src: str, dst: str) -> None:
        if dst.endswith(crash_on):
            raise Crash(dst)
        real_rename(src, dst)

    monkeypatch.setattr(log._fs, "rename", rename)
    with pytest.raises(Crash):
        log.clean()
    monkeypatch.undo()
    image = tmp_path / "image-0"
    shutil.copytree(log.directory, image)
    (image / ".clean_shutdown").unlink(missing_ok=True)
    with contextlib.suppress(LogFailedError):
        log.close()
    with Log.open(image, CONFIG) as reopened:
        entries = [txn.last_offset for s in reopened.segments for txn in s.txn_index.entries()]
        assert entries == entries_after
        markers = [b.last_offset for b in _batches(reopened) if b.is_control]
        assert (1 in markers) == bool(entries_after)  # an entry exactly while its marker is there
        committed = [r.value for r in read_records(reopened, "read_committed")]
        assert committed.count(b"later") == 1 and b"aborted" not in committed
        assert not [
            n for n in os.listdir(image) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, ".swap", ".cleaned"))
        ]


def _batches(log: Log) -> list[RecordBatch]:
    out: list[RecordBatch] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset)
        out += fetched.batches
        offset = fetched.next_offset
    return out
