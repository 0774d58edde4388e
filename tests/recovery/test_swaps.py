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
from pathlib import Path

import pytest

from oncelog import Log, LogConfig, LogFailedError
from oncelog.recovery.swaps import CLEANED_SUFFIX, SWAP_SUFFIX, settle_swaps
from oncelog.segments.batch import encode_batch
from oncelog.storage.fs import DEFAULT_FS

CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=4096, retention_ms=None)


class Crash(BaseException):
    """What a kill at this step leaves: nothing after it runs."""


def _dirty_log(directory: Path) -> Log:
    log = Log.open(directory, CONFIG)
    for round_ in range(20):
        for key in range(4):
            log.append(encode_batch([(f"k{key}".encode(), f"r{round_}".encode())], timestamp_ms=1))
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
