"""What recovery does with each kind of damage: the decision, pure and written once.

Opening a log (`LogLoader`), `oncelog verify` and `oncelog stat` (and Spark's
planning, which uses stat) all call these functions, so they cannot disagree about
where validation starts, which damage is a torn write and which is corruption, or
what happens to data the metadata says was fsynced but is gone.

The facts each decision needs are plain values: the segment bases, the recovery
point (offset, and the segment and byte position up to which the bytes were
fsynced), whether the shutdown was clean, whether the metadata store was found,
and `on_corruption`. `DECISION_TABLE` lists every case with its outcome, and
tests/recovery/test_plan.py checks that its rows cover every combination of those
facts exactly once and that the functions below give each row's outcome.

The rules:
- A clean open with its metadata trusts every segment (indexes sanity-checked on
  first use), except an active segment whose tail fails its check; an unclean one
  validates from the segment holding the recovery point to the end. A log whose
  store is missing (a Kafka directory, a lost store) has no recovery point: every
  segment is validated.
- A bad batch whose bytes the recovery point covers was fsynced: it cannot be a torn
  write, so it is corruption. So is a bad batch that leaves the log ending below the
  recovery point. Anything else is a torn tail: the log is cut at it.
- Corruption raises CorruptLogError, unless `on_corruption="truncate"`: then the
  log is cut there (or the loss of the missing data is accepted) and reported.
- Producer state comes from the newest readable snapshot at or below the first
  validated segment (or the end); one past the recovered end is discarded and the
  replay starts over from an older one.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from oncelog.storage.checkpoint import NO_RECOVERY_POINT as NO_RECOVERY_POINT
from oncelog.storage.checkpoint import RecoveryPoint as RecoveryPoint


class Verdict(enum.Enum):
    """What recovery does about damage it found."""

    CUT_TORN_TAIL = "cut the log at the damage: a torn write, not an error"
    REFUSE_CORRUPT = "raise CorruptLogError naming the file and position"
    CUT_CORRUPT = "cut the log at the damage and report the corruption (on_corruption='truncate')"
    ACCEPT_LOSS = "accept the missing data durably and report it (on_corruption='truncate')"


def first_validated(
    bases: Sequence[int],
    point: RecoveryPoint,
    *,
    clean: bool,
    store_found: bool,
    active_tail_ok: bool = True,
) -> int | None:
    """Index in `bases` of the first segment an open validates and re-indexes; None: none.

    A clean open of a log with its store trusts everything, unless the active
    segment fails its sanity check (`active_tail_ok` False: its indexes, or the
    batches after its last offset index entry, which a clean open reads): then
    that segment is validated.
    """
    if not bases:
        return None
    if clean and store_found:
        return None if active_tail_ok else len(bases) - 1
    if not store_found:
        return 0
    return max(bisect.bisect_right(bases, point.offset) - 1, 0)


def corruption(*, truncate: bool) -> Verdict:
    """Damage to data that was fsynced: refused, or cut there when `on_corruption="truncate"`."""
    return Verdict.CUT_CORRUPT if truncate else Verdict.REFUSE_CORRUPT


def judge_bad_batch(
    point: RecoveryPoint, segment_base: int, position: int, next_offset: int, *, truncate: bool
) -> Verdict:
    """A batch failing validation at `position` of segment `segment_base`.

    `next_offset` is where the log would end if cut there (one past the last good
    batch before it).
    """
    fsynced = point.covers(segment_base, position)
    if fsynced or next_offset < point.offset:
        return corruption(truncate=truncate)
    return Verdict.CUT_TORN_TAIL


def judge_missing_data(first_missing: int, end_of_missing: int, *, truncate: bool) -> Verdict | None:
    """Offsets `first_missing`..`end_of_missing` - 1 the metadata says exist are not on disk.

    Used for data the recovery point says was fsynced past the end found, and for a
    log start below the first segment. None when nothing is missing.
    """
    if first_missing >= end_of_missing:
        return None
    return Verdict.ACCEPT_LOSS if truncate else Verdict.REFUSE_CORRUPT


def snapshot_limit(bases: Sequence[int], first: int | None) -> int | None:
    """The newest snapshot a load may start its replay from is at or below this (None: any).

    No newer than the first segment validated: rebuilding a segment's transaction
    index replays all of it, which needs the producers' state at its start.
    """
    return bases[first] if first is not None and first < len(bases) else None


def replay_starts_over(snapshot_offset: int | None, end: int) -> bool:
    """The snapshot describes data recovery cut away: replay again from an older one."""
    return snapshot_offset is not None and snapshot_offset > end


# -- the decision table ------------------------------------------------------------------------


class Shutdown(enum.Enum):
    CLEAN = "clean shutdown marker found"
    UNCLEAN = "no marker: a crash"


class Store(enum.Enum):
    FOUND = "metadata store with a recovery point"
    MISSING = "segments beside an empty store: a Kafka directory or a lost store"


class Place(enum.Enum):
    """Where a segment lies relative to the recovery point."""

    BELOW = "a sealed segment wholly below the recovery point's segment"
    HOLDS_POINT = "the segment holding the recovery point"
    ABOVE = "a segment after the recovery point's segment"


class Damage(enum.Enum):
    NONE = "every batch valid"
    FSYNCED = "a bad batch in bytes the recovery point covers"
    SHORT = "a bad batch past the covered bytes, leaving the log ending below the recovery point"
    UNSYNCED = "a bad batch past the covered bytes, the log still reaching the recovery point"


class OnCorruption(enum.Enum):
    RAISE = "raise"
    TRUNCATE = "truncate"


class Case(NamedTuple):
    shutdown: Shutdown
    store: Store
    place: Place
    damage: Damage
    on_corruption: OnCorruption


class Outcome(NamedTuple):
    validated: bool  # the segment's batches are checked and its indexes rebuilt
    verdict: Verdict | None  # what happens at the damage; None: nothing found (or not looked for)


ANY = None  # a wildcard in a table row


class Row(NamedTuple):
    shutdown: Shutdown | None
    store: Store | None
    place: Place | None
    damage: Damage | None
    on_corruption: OnCorruption | None
    outcome: Outcome
    why: str

    def matches(self, case: Case) -> bool:
        return all(want is None or want == got for want, got in zip(self[:5], case, strict=True))


_V, _S = True, False  # validated, skipped
DECISION_TABLE: tuple[Row, ...] = (
    # Sealed segments below the recovery point's segment were fsynced at their roll: trusted
    # (damage there is found by the reads' CRC checks, and by verify).
    Row(ANY, Store.FOUND, Place.BELOW, ANY, ANY, Outcome(_S, None), "fsynced at the roll: trusted"),
    # A clean close leaves the recovery point in the last segment: trusted when its tail is sound.
    Row(Shutdown.CLEAN, Store.FOUND, Place.HOLDS_POINT, Damage.NONE, ANY, Outcome(_S, None), "clean"),
    # Unclean: from the recovery point's segment on, every batch is validated.
    Row(Shutdown.UNCLEAN, Store.FOUND, Place.HOLDS_POINT, Damage.NONE, ANY, Outcome(_V, None), "valid tail"),
    Row(Shutdown.UNCLEAN, Store.FOUND, Place.ABOVE, Damage.NONE, ANY, Outcome(_V, None), "valid tail"),
    # Damage in the recovery point's segment: an unclean open validates it, and a clean one
    # does once the damage fails the active segment's tail check (the batches after its last
    # offset index entry). Damage a clean open does not read is refused by reads instead.
    Row(
        ANY, Store.FOUND, Place.HOLDS_POINT, Damage.UNSYNCED, ANY,
        Outcome(_V, Verdict.CUT_TORN_TAIL), "never fsynced: a torn write",
    ),
    Row(
        Shutdown.UNCLEAN, Store.FOUND, Place.ABOVE, Damage.UNSYNCED, ANY,
        Outcome(_V, Verdict.CUT_TORN_TAIL), "never fsynced: a torn write",
    ),
    Row(
        ANY, Store.FOUND, Place.HOLDS_POINT, Damage.FSYNCED, OnCorruption.RAISE,
        Outcome(_V, Verdict.REFUSE_CORRUPT), "fsynced bytes do not tear",
    ),
    Row(
        ANY, Store.FOUND, Place.HOLDS_POINT, Damage.FSYNCED, OnCorruption.TRUNCATE,
        Outcome(_V, Verdict.CUT_CORRUPT), "fsynced bytes do not tear; cut as asked",
    ),
    Row(
        ANY, Store.FOUND, Place.HOLDS_POINT, Damage.SHORT, OnCorruption.RAISE,
        Outcome(_V, Verdict.REFUSE_CORRUPT), "fsynced offsets would be lost",
    ),
    Row(
        Shutdown.UNCLEAN, Store.FOUND, Place.ABOVE, Damage.SHORT, OnCorruption.RAISE,
        Outcome(_V, Verdict.REFUSE_CORRUPT), "fsynced offsets would be lost",
    ),
    Row(
        ANY, Store.FOUND, Place.HOLDS_POINT, Damage.SHORT, OnCorruption.TRUNCATE,
        Outcome(_V, Verdict.CUT_CORRUPT), "fsynced offsets lost; cut as asked",
    ),
    Row(
        Shutdown.UNCLEAN, Store.FOUND, Place.ABOVE, Damage.SHORT, OnCorruption.TRUNCATE,
        Outcome(_V, Verdict.CUT_CORRUPT), "fsynced offsets lost; cut as asked",
    ),
    # Without a store nothing is known to be durable: every segment is validated and
    # any bad batch ends the log (the recovery point is 0, so nothing is "short").
    Row(ANY, Store.MISSING, ANY, Damage.NONE, ANY, Outcome(_V, None), "no store: validate everything"),
    Row(
        ANY, Store.MISSING, ANY, Damage.UNSYNCED, ANY,
        Outcome(_V, Verdict.CUT_TORN_TAIL), "no store: nothing known fsynced",
    ),
)  # fmt: skip


def impossible(case: Case) -> str | None:
    """Why `case` cannot arise, or None. The table has no row for these."""
    if case.store is Store.MISSING and case.damage in (Damage.FSYNCED, Damage.SHORT):
        return "without a store there is no recovery point: nothing is covered or short of it"
    if case.store is Store.FOUND and case.place is Place.ABOVE and case.damage is Damage.FSYNCED:
        return "the recovery point covers no byte of a segment after its own"
    if case.shutdown is Shutdown.CLEAN and case.store is Store.FOUND and case.place is Place.ABOVE:
        return "a clean close leaves the recovery point in the last segment"
    return None


def every_case() -> Iterator[Case]:
    for values in itertools.product(Shutdown, Store, Place, Damage, OnCorruption):
        yield Case(*values)


def decide(case: Case) -> Outcome:
    """The table's outcome for `case` (KeyError for an impossible one)."""
    rows = [row for row in DECISION_TABLE if row.matches(case)]
    if len(rows) != 1:
        raise KeyError(f"{case}: {len(rows)} rows match")
    return rows[0].outcome
