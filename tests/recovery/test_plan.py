"""The recovery decision (oncelog.recovery.plan): the table, the functions, and agreement.

The table is checked three ways: its rows cover every possible combination of the
facts exactly once; the functions the loader, verify and stat call give each row's
outcome; and on real directories, opening the log, `oncelog verify` and `oncelog stat`
reach the same decision for each kind of damage.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oncelog import CorruptLogError, Log, LogConfig, encode_batch
from oncelog.cli.main import main as cli_main
from oncelog.recovery.plan import (
    DECISION_TABLE,
    NO_RECOVERY_POINT,
    Case,
    Damage,
    OnCorruption,
    Outcome,
    Place,
    RecoveryPoint,
    Shutdown,
    Store,
    Verdict,
    decide,
    every_case,
    first_validated,
    impossible,
    judge_bad_batch,
    judge_missing_data,
    replay_starts_over,
    snapshot_limit,
)
from oncelog.storage.fs import DEFAULT_FS
from oncelog.tools.partition_dirs import Partition
from oncelog.tools.partition_stat import stat_partition

T0 = 1_700_000_000_000

# -- the table -------------------------------------------------------------------------------


def test_every_possible_case_is_matched_by_exactly_one_row() -> None:
    for case in every_case():
        rows = [row for row in DECISION_TABLE if row.matches(case)]
        if impossible(case):
            assert rows == [] or all(row.outcome == rows[0].outcome for row in rows), case
        else:
            assert len(rows) == 1, (case, rows)


def test_every_row_decides_some_possible_case() -> None:
    possible = [case for case in every_case() if impossible(case) is None]
    for row in DECISION_TABLE:
        assert any(row.matches(case) for case in possible), row


def test_the_cases_are_every_combination_of_the_facts() -> None:
    cases = set(every_case())
    assert len(cases) == len(Shutdown) * len(Store) * len(Place) * len(Damage) * len(OnCorruption)


# Segments at 0, 100 and 200; the recovery point is offset 150, 50 bytes into segment 100
# (in a clean case, segment 200 does not exist and 100 is the active one).
BASES = [0, 100, 200]
POINT = RecoveryPoint(150, 100, 50)
SEGMENT_OF = {Place.BELOW: 0, Place.HOLDS_POINT: 1, Place.ABOVE: 2}


def _by_the_functions(case: Case) -> Outcome:
    """What the functions the loader, verify and stat call decide for `case`."""
    store_found = case.store is Store.FOUND
    point = POINT if store_found else NO_RECOVERY_POINT
    bases = BASES[:2] if case.shutdown is Shutdown.CLEAN and store_found else BASES
    # A clean open reads the active segment's tail: damage in the point's segment fails that check.
    tail_ok = case.place is not Place.HOLDS_POINT or case.damage is Damage.NONE
    clean = case.shutdown is Shutdown.CLEAN
    first = first_validated(bases, point, clean=clean, store_found=store_found, active_tail_ok=tail_ok)
    n = SEGMENT_OF[case.place]
    validated = first is not None and n >= first
    if not validated or case.damage is Damage.NONE:
        return Outcome(validated, None)
    base = BASES[n]
    position, next_offset = {
        Damage.FSYNCED: (10, 140),  # inside the 50 fsynced bytes of segment 100
        Damage.SHORT: (60, 145),  # past them, but the log would end below offset 150
        Damage.UNSYNCED: (60, 150) if base <= 100 else (10, 205),
    }[case.damage]
    truncate = case.on_corruption is OnCorruption.TRUNCATE
    return Outcome(True, judge_bad_batch(point, base, position, next_offset, truncate=truncate))


@pytest.mark.parametrize("case", [c for c in every_case() if impossible(c) is None], ids=str)
def test_the_functions_give_the_tables_outcome(case: Case) -> None:
    assert _by_the_functions(case) == decide(case)


def test_missing_data_is_refused_or_accepted_as_asked() -> None:
    assert judge_missing_data(10, 10, truncate=False) is None
    assert judge_missing_data(5, 10, truncate=False) is Verdict.REFUSE_CORRUPT
    assert judge_missing_data(5, 10, truncate=True) is Verdict.ACCEPT_LOSS


def test_the_replay_starts_no_later_than_the_first_validated_segment() -> None:
    assert snapshot_limit(BASES, 1) == 100
    assert snapshot_limit(BASES, None) is None
    assert replay_starts_over(120, 110) and not replay_starts_over(110, 110)


def test_a_point_without_positions_covers_nothing() -> None:
    assert not RecoveryPoint(150).covers(0, 0)
    assert judge_bad_batch(RecoveryPoint(150), 0, 0, 150, truncate=False) is Verdict.CUT_TORN_TAIL


# -- agreement on real directories -----------------------------------------------------------

# Every flush commits its recovery point (recovery_point_interval_ms=0): these tests damage
# what a flush vouched for, which must be reported. The default lags: tests/recovery/test_loader.py.
CONFIG = LogConfig(
    segment_bytes=2048, index_interval_bytes=300, segment_index_bytes=4096, recovery_point_interval_ms=0
)


def _crash_image(tmp_path: Path, *, flush: bool) -> tuple[Path, int, int]:
    """A kill -9 image of a log of 30 idempotent batches: (directory, active segment base, data end)."""
    source = tmp_path / "orders-0"
    log = Log.open(source, CONFIG, clock=lambda: T0)
    try:
        for seq in range(30):
            log.append(encode_batch([(b"k", b"v" * 100)], producer_id=1, base_sequence=seq, timestamp_ms=T0))
        if flush:
            log.flush()  # the recovery point moves to the end
        base, data_end = log.active_segment.base_offset, log.active_segment.size
        image = tmp_path / "image" / "orders-0"
        shutil.copytree(source, image)
    finally:
        log.close()
    return image, base, data_end


def _damage(image: Path, base: int, position: int, data: bytes) -> None:
    path = image / f"{base:020d}.log"
    content = bytearray(path.read_bytes())
    content[position : position + len(data)] = data
    path.write_bytes(bytes(content))


def _verify(image: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    cli_main(["verify", str(image)])
    return [
        line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith(("WARN", "CORR"))
    ]


def _stat_end(image: Path) -> int:
    partition = Partition(str(image), None, str(image.parent))
    return stat_partition(DEFAULT_FS, partition, {}).log_end_offset


def _open(image: Path, on_corruption: str) -> Log | CorruptLogError:
    config = LogConfig(
        segment_bytes=2048,
        index_interval_bytes=300,
        segment_index_bytes=4096,
        on_corruption=on_corruption,
        recovery_point_interval_ms=0,
    )
    try:
        return Log.open(image, config, clock=lambda: T0)
    except CorruptLogError as exc:
        return exc


def test_a_torn_tail_past_the_recovery_point_is_cut_by_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, base, data_end = _crash_image(tmp_path, flush=False)
    _damage(image, base, data_end, b"\xab" * 40)  # garbage where the next batch would go
    assert _verify(image, capsys) == ["WARNING"]  # verify: recovery will cut it
    stat_end = _stat_end(image)
    opened = _open(image, "raise")
    assert isinstance(opened, Log)
    try:
        assert opened.recovery_report.tail_error is not None
        assert opened.log_end_offset == stat_end == 30
    finally:
        opened.close()


@pytest.mark.parametrize("on_corruption", ["raise", "truncate"])
def test_a_bit_flip_below_the_recovery_point_is_corruption_to_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], on_corruption: str
) -> None:
    image, base, _ = _crash_image(tmp_path, flush=True)
    _damage(image, base, 30, b"\xff")  # inside the first batch's CRC-covered bytes
    assert _verify(image, capsys)[0] == "CORRUPT"
    opened = _open(image, on_corruption)
    if on_corruption == "raise":
        assert isinstance(opened, CorruptLogError)
        assert opened.path.endswith(f"{base:020d}.log")
    else:
        assert isinstance(opened, Log)
        try:
            assert opened.log_end_offset == base  # cut at the damage, as asked
            assert opened.recovery_report.tail_error is not None
            assert "fsynced" in opened.recovery_report.tail_error  # reported, not taken for a torn tail
        finally:
            opened.close()


def test_an_emptied_active_segment_below_the_recovery_point_is_missing_data_to_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, base, _ = _crash_image(tmp_path, flush=True)
    (image / f"{base:020d}.log").write_bytes(b"")
    assert "CORRUPT" in _verify(image, capsys)
    assert isinstance(_open(image, "raise"), CorruptLogError)
    opened = _open(image, "truncate")
    assert isinstance(opened, Log)
    try:
        assert opened.log_end_offset == base == _stat_end(image)
    finally:
        opened.close()


def test_an_undamaged_crash_image_needs_nothing_from_any_of_the_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, _, _ = _crash_image(tmp_path, flush=False)
    assert _verify(image, capsys) == []
    stat_end = _stat_end(image)
    opened = _open(image, "raise")
    assert isinstance(opened, Log)
    try:
        assert opened.recovery_report.tail_error is None
        assert opened.log_end_offset == stat_end == 30
    finally:
        opened.close()


def test_garbage_after_a_clean_close_is_cut_as_a_torn_tail_by_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, base, data_end = _crash_image(tmp_path, flush=True)
    with Log.open(image, CONFIG, clock=lambda: T0):
        pass  # a clean close: the marker is written, the recovery point is the end
    path = image / f"{base:020d}.log"
    path.write_bytes(path.read_bytes()[:data_end] + b"\xab" * 40)  # bytes behind the close's back
    assert _verify(image, capsys) == ["WARNING"]
    stat_end = _stat_end(image)
    opened = _open(image, "raise")
    assert isinstance(opened, Log)
    try:
        assert not opened.recovery_report.clean  # the active segment failed its tail check
        assert opened.log_end_offset == stat_end == 30
    finally:
        opened.close()


def test_a_bit_flip_in_a_clean_logs_active_tail_is_corruption_to_open_and_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, base, data_end = _crash_image(tmp_path, flush=True)
    with Log.open(image, CONFIG, clock=lambda: T0):
        pass
    last_batch = data_end - len(
        encode_batch([(b"k", b"v" * 100)], producer_id=1, base_sequence=0, timestamp_ms=T0)
    )
    _damage(image, base, last_batch + 30, b"\xff")  # past the last index entry: the tail check reads it
    assert _verify(image, capsys)[0] == "CORRUPT"
    assert isinstance(_open(image, "raise"), CorruptLogError)


def test_a_bit_flip_a_clean_open_does_not_read_is_corruption_to_verify_and_never_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, base, _ = _crash_image(tmp_path, flush=True)
    with Log.open(image, CONFIG, clock=lambda: T0):
        pass
    _damage(image, base, 30, b"\xff")  # the active segment's first batch, before its index entries
    assert _verify(image, capsys)[0] == "CORRUPT"
    opened = _open(image, "raise")
    assert isinstance(opened, Log)  # trusted: a clean open reads only the tail
    try:
        with pytest.raises(CorruptLogError, match="CRC mismatch"):
            opened.read(base)
    finally:
        opened.close()


def test_a_bit_flip_in_the_unsynced_tail_ends_the_log_there_for_all_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by fuzzing the three against each other: stat used to count every batch whose
    # header parsed, so its end offset ran past where opening cuts a CRC-damaged tail.
    image, base, data_end = _crash_image(tmp_path, flush=False)
    one = encode_batch([(b"k", b"v" * 100)], producer_id=1, base_sequence=0, timestamp_ms=T0)
    _damage(image, base, data_end - 3 * len(one) + 30, b"\xff")  # the third batch from the end
    assert _verify(image, capsys) == ["WARNING"]
    stat_end = _stat_end(image)
    opened = _open(image, "raise")
    assert isinstance(opened, Log)
    try:
        assert opened.log_end_offset == stat_end == 27
    finally:
        opened.close()
