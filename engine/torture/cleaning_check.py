"""The compaction contract, checked on a live compacted log and on one recovered after a crash.

A cleaned log no longer holds every batch byte for byte, so the cleaning class checks
what compaction promises instead (the other classes' invariants 1-3 become 1-3 here):

1. **Only what was written, cleaned.** Every batch is one the workload wrote at that
   offset, with the same producer, epoch, sequence, last offset and kind; its records
   are some of the ones written there, each exactly as written (a batch may have lost
   records, all of them, or gained a delete horizon, nothing else).
2. **Offsets strictly increase**, and the log ends where its last batch ends, never
   below what was acknowledged as durable (after a kill, below anything acknowledged).
3. **Each key's latest value.** A read_committed reader sees for each key its latest
   acknowledged-durable committed record, or a newer one that was written; never an
   older one, and nothing only where a tombstone of the key a pass could clean had
   lived delete_retention_ms. Checked twice: below the last stable offset as recovered
   (a transaction whose marker a crash took is open again, and what a pass removed may
   not depend on it), then with every transaction ended (the coordinator sends again
   the marker it had decided; one never decided is ended either way). The reader never
   sees a record of a transaction not committed, and every record it sees is as written.
4. **Producers.** Every batch in a recovered producer's window is in the log (kept
   empty if need be: the window survives cleaning and recovery), and so is each of a
   producer's last 5 acknowledged batches that was durable; a retry of each is
   answered as a duplicate at its original offsets. Beyond that, state equals a full
   replay of the recovered log (harness invariant 4), but for what Kafka's rules let
   compaction take: a coordinator epoch whose markers were all cleaned.
5. **At most one record per key below the cleaner checkpoint**: a pass moves the
   checkpoint only once every segment it swapped is durable, so a swap a crash undid
   (a directory entry lost) shows here.
6. **Recovery** succeeds, reads only the tail past the recovery point, which stays at
   or below the log end, and a second crash right after it loses nothing it exposed.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable, Sequence

from oncelog.errors import CorruptLogError, CorruptRecordError, OncelogError
from oncelog.log import METADATA_DIR, Log
from oncelog.producer_state import ProducerStateEntry
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch
from oncelog.segments.compaction import DELETE_HORIZON_MASK
from oncelog.storage.checkpoint import CLEANER_CHECKPOINT_KEY, read_offset
from oncelog.torture.faultfs import FaultFileSystem
from oncelog.torture.model import (
    CLEANING,
    CLEANING_CONFIG,
    COMMITTED,
    DELETE_RETENTION_MS,
    DIRECTORY,
    TAIL_SLACK_BYTES,
    CleaningModel,
    Model,
    OnlineCheckFailed,
    Txn,
    Violation,
)
from oncelog.torture.recovered import bytes_from_recovery_point, check_producer_state
from oncelog.torture.txn import read_all

Report = Callable[[str, str], None]
# key -> (offset, value) of its newest record
Latest = dict[bytes, tuple[int, bytes | None]]
# The attributes a cleaning may change: the delete horizon, and the codec of an emptied batch.
_CLEANER_BITS = DELETE_HORIZON_MASK | fmt.COMPRESSION_MASK


def _identity(batch: RecordBatch) -> tuple[int, ...]:
    return (
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.last_offset,
        batch.attributes & ~_CLEANER_BITS,
    )


def check_batches(batches: Sequence[RecordBatch], model: Model, report: Report) -> None:
    """Invariant 1 and the first half of 2: every batch a cleaned copy of the one written
    at its offset, offsets strictly increasing."""
    previous = -1
    for batch in batches:
        offset = batch.base_offset
        if offset <= previous:
            report("offsets strictly increase", f"batch at {offset} after one ending at {previous}")
        previous = batch.last_offset
        data = model.written.get(offset)
        if data is None:
            report("only what was written, cleaned", f"batch at offset {offset} was never written")
            continue
        if batch.buffer == data:
            continue
        written = RecordBatch(data)
        if _identity(batch) != _identity(written):
            report(
                "only what was written, cleaned",
                f"batch at {offset} is {_identity(batch)}, written as {_identity(written)}",
            )
            continue
        originals = {record.offset: record for record in written.records()}
        changed = [r.offset for r in batch.records() if originals.get(r.offset) != r]
        if changed:
            report("only what was written, cleaned", f"records at {changed[:5]} are not as written")


def _aborted_or_open(model: Model) -> Callable[[RecordBatch], bool]:
    """Whether a data batch's records stay out of a reader's view as the workload left it:
    its transaction aborted (marker acknowledged) or still open."""

    def hidden(batch: RecordBatch) -> bool:
        txn = model.txn_of.get(batch.base_offset) if batch.is_transactional else None
        return txn is not None and txn.outcome != COMMITTED

    return hidden


def latest_records(batches: Iterable[RecordBatch], skip: Callable[[RecordBatch], bool]) -> Latest:
    latest: Latest = {}
    for batch in batches:
        if batch.is_control or skip(batch):
            continue
        for record in batch.records():
            if record.key is not None:
                latest[record.key] = (record.offset, record.value)
    return latest


def tombstone_may_be_gone(model: CleaningModel, offset: int) -> bool:
    """Whether a pass could have removed the tombstone at `offset`: it ran once the tombstone
    had lived delete_retention_ms (its horizon is at least that far on) and could clean it
    (it lay below the pass's limit: the tombstone was durable, and so was its removal of
    the key's older records)."""
    base = max((b for b in model.written if b <= offset), default=offset)
    appended = model.append_ms.get(base, 0)
    return any(now >= appended + DELETE_RETENTION_MS and offset < limit for now, limit in model.clean_times)


def _tombstones(model: Model) -> dict[bytes, list[int]]:
    """The offsets of every tombstone written, by key."""
    found: dict[bytes, list[int]] = {}
    for offset in sorted(model.written):
        batch = RecordBatch(model.written[offset])
        if not batch.is_control:
            for record in batch.records():
                if record.key is not None and record.value is None:
                    found.setdefault(record.key, []).append(record.offset)
    return found


def _compare_keys(
    expected: Latest, seen: Latest, model: CleaningModel, report: Report, *, at_least: bool, where: str = ""
) -> None:
    """Each key's newest record in `seen` against `expected`: equal, or (`at_least`) newer;
    absent only when it, or a newer tombstone of its key, is a tombstone a pass may have
    removed (a newer one the workload could not know was durable, but the pass did)."""
    invariant = "each key's latest value is served"
    tombstones = _tombstones(model)
    for key, (offset, value) in sorted(expected.items()):
        got = seen.get(key)
        if got is None:
            newer = [t for t in tombstones.get(key, []) if t >= offset]
            if any(tombstone_may_be_gone(model, t) for t in newer):
                continue
            what = "tombstone" if value is None else "value"
            report(
                invariant, f"{key!r}: its latest {what} at {offset} is gone, and nothing newer served {where}"
            )
        elif got[0] < offset or (not at_least and got != (offset, value)):
            report(invariant, f"{key!r}: served the record at {got[0]}, its latest is at {offset} {where}")
    unknown = sorted(set(seen) - set(expected)) if not at_least else []
    if unknown:
        report(invariant, f"keys {unknown[:5]} served, never written")


def check_live_log(log: Log, model: CleaningModel) -> None:
    """After a pass on the live log (no crash): contents, each key's newest record, read_committed
    free of aborted data, and every batch of every producer's window still there."""
    problems: list[tuple[str, str]] = []

    def report(invariant: str, detail: str) -> None:
        problems.append((invariant, detail))

    batches = list(read_all(log))
    check_batches(batches, model, report)
    hidden = _aborted_or_open(model)
    written = [RecordBatch(model.written[offset]) for offset in sorted(model.written)]
    _compare_keys(
        latest_records(written, hidden), latest_records(batches, hidden), model, report, at_least=False
    )
    present = {batch.base_offset for batch in batches}
    for entry in log.producers():
        gone = [meta.first_offset for meta in entry.batches if meta.first_offset not in present]
        if gone:
            report(
                "a producer's last batches survive cleaning",
                f"producer {entry.producer_id}: batches at {gone} of its window are gone",
            )
    _check_committed_reads(log, model, log.last_stable_offset, report)
    if problems:
        invariant, detail = problems[0]
        raise OnlineCheckFailed(
            invariant, f"live log after a cleaning pass: {detail} ({len(problems)} problems)"
        )


def _committed_scan(log: Log, until: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, batch base, key, value) of every record a read_committed scan returns below `until`."""
    found = []
    offset = log.log_start_offset
    while offset < until:
        fetched = log.read(offset, 64 * 1024, isolation="read_committed")
        if fetched.next_offset <= offset:
            break
        bases = [batch.base_offset for batch in fetched.batches]
        for record in fetched.records():  # the consumer's view: aborted transactions filtered out
            if record.offset < until:
                base = bases[bisect.bisect_right(bases, record.offset) - 1]
                found.append((record.offset, base, record.key, record.value))
        offset = fetched.next_offset
    return found


def _check_committed_reads(
    log: Log,
    model: Model,
    until: int,
    report: Report,
    *,
    decided: dict[int, bool] | None = None,
    markers: set[int] | None = None,
) -> Latest:
    """A read_committed scan below `until`: no record of a transaction not committed (as the
    workload ended it, or as `decided` after recovery: producer -> commit), nor, when
    `markers` (the offsets of the batches in the log) are given, of one whose commit marker
    is not in the log. Returns each key's newest record in it."""
    latest: Latest = {}
    for offset, base, key, value in _committed_scan(log, until):
        txn = model.txn_of.get(base)
        if txn is not None:
            commit = txn.commit if txn.commit is not None else (decided or {}).get(txn.producer_id)
            if not commit or (markers is not None and txn.marker_offset not in markers):
                what = "aborted" if commit is False else "not committed in the log"
                report("read_committed serves only committed records", f"record at {offset}, {what} ({txn})")
        if key is not None:
            latest[key] = (offset, value)
    return latest


def check_cleaned(
    fs: FaultFileSystem, model: CleaningModel, seed: int, *, killed_only: bool, where: str
) -> list[Violation]:
    """Reopen a compacted log on the crashed twin and check the compaction contract.

    `killed_only`: the process died and the page cache survived (every acknowledgement must).
    """
    found: list[Violation] = []

    def report(invariant: str, detail: str) -> None:
        found.append(Violation(seed, CLEANING, invariant, f"{detail}; {where} [{fs.describe()}]"))

    tail_bytes = bytes_from_recovery_point(fs)
    checkpoint = _cleaner_checkpoint(fs)
    now_ms = model.now_ms
    log = Log.open(DIRECTORY, CLEANING_CONFIG, fs=fs, clock=lambda: now_ms)
    try:
        batches = list(read_all(log))
        present = {batch.base_offset: batch for batch in batches}
        check_batches(batches, model, report)
        _check_log_end(log, batches, model, killed_only, report)
        _check_one_record_per_key(batches, checkpoint, report)
        scanned = log.recovery_report.bytes_scanned
        if scanned > tail_bytes + TAIL_SLACK_BYTES:
            report("recovery reads only the tail", f"scanned {scanned} bytes, the tail holds {tail_bytes}")
        _check_producers(log, batches, present, model, now_ms, report)
        _check_retries(log, present, model, killed_only, report)
        _check_second_crash(fs, present, now_ms, report)
        required = _required(model, killed_only)
        # Before the coordinator ends what the crash left open: below the last stable offset.
        stable = log.last_stable_offset
        seen = _check_committed_reads(log, model, stable, report, markers=set(present))
        below = {key: latest for key, latest in required.items() if latest[0] < stable}
        _compare_keys(
            below, seen, model, report, at_least=True, where=f"below the last stable offset {stable}"
        )
        decided = _end_transactions(log, model, seed, report)
        seen = _check_committed_reads(log, model, log.log_end_offset, report, decided=decided)
        _compare_keys(required, seen, model, report, at_least=True, where="with every transaction ended")
    except (CorruptLogError, CorruptRecordError) as exc:
        report("reads succeed", str(exc))
    finally:
        log.close()
    return found


def _check_producers(
    log: Log,
    batches: Sequence[RecordBatch],
    present: dict[int, RecordBatch],
    model: CleaningModel,
    now_ms: int,
    report: Report,
) -> None:
    """Every batch of every recovered producer's window is in the log (kept empty if need
    be: the window survives cleaning and recovery), and, that aside, state equals a full
    replay (harness invariant 4). A replay may know an older coordinator epoch than the
    state when the markers that carried the newer are gone (cleaned, as Kafka's rules say)."""
    windows_gone: set[int] = set()
    for entry in log.producers():
        gone = [meta.first_offset for meta in entry.batches if meta.first_offset not in present]
        if gone:
            windows_gone.add(entry.producer_id)
            report(
                "a recovered producer's window is in the log",
                f"producer {entry.producer_id}: its window's batches at {gone} are not in the log ({entry})",
            )
    markers_gone = {
        RecordBatch(data).producer_id
        for offset, data in model.written.items()
        if offset not in present and RecordBatch(data).is_control
    }

    def exempt(ours: ProducerStateEntry, replayed: ProducerStateEntry | None) -> bool:
        if ours.producer_id in windows_gone:
            return True  # reported above
        if ours.producer_id not in markers_gone:
            return False
        if replayed is None:  # known by its markers alone, all cleaned
            return not ours.batches and ours.current_txn_first_offset < 0
        return (
            replayed.coordinator_epoch < ours.coordinator_epoch
            and replayed._replace(coordinator_epoch=ours.coordinator_epoch) == ours
        )

    check_producer_state(log, {}, report, batches, now_ms=now_ms, model=model, exempt=exempt)


def _cleaner_checkpoint(fs: FaultFileSystem) -> int:
    store = fs.open_store(f"{DIRECTORY}/{METADATA_DIR}")
    try:
        return read_offset(store, CLEANER_CHECKPOINT_KEY) or 0
    finally:
        store.close()


def _check_log_end(
    log: Log, batches: Sequence[RecordBatch], model: Model, killed_only: bool, report: Report
) -> None:
    end = log.log_end_offset
    last = batches[-1].last_offset + 1 if batches else log.log_start_offset
    if end != last:
        report("the log ends where its last batch ends", f"log end {end}, the last batch ends at {last}")
    acked_end = max((RecordBatch(data).last_offset + 1 for data in model.acked.values()), default=0)
    floor = acked_end if killed_only else model.durable_end
    if end < floor:
        report("the log end never moves back below durable data", f"log end {end}, durable up to {floor}")
    if log.recovery_point > end:
        report("the recovery point stays at or below the log end", f"{log.recovery_point} > {end}")


def _check_one_record_per_key(batches: Sequence[RecordBatch], checkpoint: int, report: Report) -> None:
    seen: dict[bytes, int] = {}
    for batch in batches:
        if batch.last_offset >= checkpoint:
            break
        if batch.is_control:
            continue
        for record in batch.records():
            if record.key is None:
                continue
            if record.key in seen:
                report(
                    "at most one record per key below the cleaner checkpoint",
                    f"{record.key!r} at {seen[record.key]} and {record.offset}, checkpoint {checkpoint}",
                )
                return
            seen[record.key] = record.offset


def _durable(model: Model, offset: int, killed_only: bool) -> bool:
    """Whether the batch or marker written at `offset` was acknowledged and must survive."""
    data = model.acked.get(offset)
    return data is not None and (killed_only or RecordBatch(data).last_offset < model.durable_end)


def _check_retries(
    log: Log, present: dict[int, RecordBatch], model: CleaningModel, killed_only: bool, report: Report
) -> None:
    """Every batch of every recovered window, and each producer's last durable acknowledged
    batches, answered as duplicates at their offsets (retried as the client sent them)."""
    retried: dict[int, bytes] = {}
    for entry in list(log.producers()):
        for meta in entry.batches:
            data = model.written.get(meta.first_offset)
            if data is not None:
                retried[meta.first_offset] = data
    for pid, recent in model.recent.items():
        newest = _newest_present(present, pid)
        for batch, offset in recent:
            if _durable(model, offset, killed_only) and offset not in present:
                report(
                    "a producer's last batches survive cleaning",
                    f"producer {pid}'s batch at {offset} is gone",
                )
            elif offset in newest and log.producer_state(pid) is not None:
                retried[offset] = batch
    for offset, data in sorted(retried.items()):
        try:
            result = log.append(data)
        except OncelogError as exc:
            report("retries are duplicates", f"retry of offset {offset}: {exc!r}")
            continue
        if not (result.duplicate and result.first_offset == offset):
            report("retries are duplicates", f"retry of offset {offset} gave {result}")


def _newest_present(present: dict[int, RecordBatch], pid: int) -> set[int]:
    """The offsets of the producer's 5 newest data batches in the log, at its newest epoch."""
    own = sorted(
        (b for b in present.values() if b.producer_id == pid and not b.is_control),
        key=lambda b: b.base_offset,
    )
    if not own:
        return set()
    return {b.base_offset for b in own if b.producer_epoch == own[-1].producer_epoch}.intersection(
        b.base_offset for b in own[-5:]
    )


def _check_second_crash(
    fs: FaultFileSystem, present: dict[int, RecordBatch], now_ms: int, report: Report
) -> None:
    again = fs.crash("drop")
    try:
        reopened = Log.open(DIRECTORY, CLEANING_CONFIG, fs=again, clock=lambda: now_ms)
    except OncelogError as exc:
        report("a second crash loses nothing", f"reopen failed: {exc}")
        return
    try:
        survived = {batch.base_offset: bytes(batch.buffer) for batch in read_all(reopened)}
    finally:
        reopened.close()
    lost = [offset for offset, batch in present.items() if survived.get(offset) != bytes(batch.buffer)]
    if lost:
        report("a second crash loses nothing", f"offsets {lost[:5]} lost after recovery exposed them")


def _end_transactions(log: Log, model: Model, seed: int, report: Report) -> dict[int, bool]:
    """The coordinator ends every transaction the recovered log has open: with the marker it
    had decided on (the workload handed it over), else either way. Returns producer -> commit."""
    rng = random.Random(f"{seed}/complete")
    decided: dict[int, bool] = {}
    for entry in sorted(log.producers()):
        if entry.current_txn_first_offset < 0:
            continue
        txn = _txn_from(model, entry.producer_id, entry.current_txn_first_offset)
        commit = txn.commit if txn is not None and txn.commit is not None else rng.random() < 0.5
        try:
            log.write_txn_marker(
                entry.producer_id,
                max(entry.producer_epoch, txn_epoch(model, txn)),
                commit=commit,
                coordinator_epoch=max(entry.coordinator_epoch, 0),
            )
        except OncelogError as exc:
            report("open transactions can be ended after recovery", f"producer {entry.producer_id}: {exc!r}")
            continue
        decided[entry.producer_id] = commit
    if log.last_stable_offset != log.log_end_offset:
        report(
            "open transactions can be ended after recovery",
            f"last stable offset {log.last_stable_offset}, log end {log.log_end_offset}",
        )
    return decided


def _txn_from(model: Model, producer_id: int, first_offset: int) -> Txn | None:
    """The workload's transaction of the producer open from `first_offset` in the recovered log."""
    txn = model.txn_of.get(first_offset)
    return txn if txn is not None and txn.producer_id == producer_id else None


def txn_epoch(model: Model, txn: Txn | None) -> int:
    """The producer epoch of the marker the workload handed over for `txn` (-1: none)."""
    if txn is None or txn.marker_offset < 0 or txn.marker_offset not in model.written:
        return -1
    return RecordBatch(model.written[txn.marker_offset]).producer_epoch


def _required(model: Model, killed_only: bool) -> Latest:
    """Each key's latest record that must be served: in a durable acknowledged batch, and, in a
    transaction, one whose commit marker was durable and acknowledged too."""

    def not_required(batch: RecordBatch) -> bool:
        if not _durable(model, batch.base_offset, killed_only):
            return True
        if not batch.is_transactional:
            return False
        txn = model.txn_of.get(batch.base_offset)
        return txn is None or not (
            txn.commit and txn.acked and _durable(model, txn.marker_offset, killed_only)
        )

    written = [RecordBatch(model.written[offset]) for offset in sorted(model.written)]
    return latest_records(written, not_required)
