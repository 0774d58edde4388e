"""Transactions as the log's own batches say, and the read_committed checks built on them.

The outcome of every transaction (committed, aborted, still open) is derived from the
markers actually in a log (derive_transactions), never from what the workload meant
to write; the engine's read_committed scan and last stable offset are then checked
against that view (check_read_committed), the recovered outcomes against the Model
(check_txn_outcomes), and the transactions a crash left open are ended on the
recovered log and checked again (complete_open_transactions). Process mode uses the
same checks on a real directory.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from oncelog.errors import OncelogError
from oncelog.log import Log
from oncelog.segments.batch import RecordBatch
from oncelog.segments.control import decode_txn_marker
from oncelog.torture.model import ABORTED, COMMITTED, OPEN, READ_COMMITTED_FETCH_BYTES, Model


def read_all(log: Log) -> Iterator[RecordBatch]:
    """Every batch from the log start to the log end, as a plain fetch returns them."""
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=64 * 1024)
        if not fetched.batches:
            # A log end with no data before it: a broken log, never a reason to spin.
            raise AssertionError(f"no batch at offset {offset}, below the log end {log.log_end_offset}")
        yield from fetched.batches
        offset = fetched.next_offset


class TxnView(NamedTuple):
    """The transactions of a log, derived from the markers actually in it."""

    outcomes: dict[int, str]  # first offset of each transaction -> COMMITTED, ABORTED or OPEN
    txn_of: dict[int, int]  # base offset of each transactional data batch -> its transaction's first offset
    open_txns: dict[int, int]  # producer id -> first offset of its open transaction
    stable: int  # the last stable offset these give
    # (base offset, last offset, kind) of every batch: "plain", "control", or an outcome
    ranges: list[tuple[int, int, str]]


def derive_transactions(batches: Sequence[RecordBatch], end: int, start: int = 0) -> TxnView:
    """Replay the batches (in offset order) as a read_committed consumer's view depends on them:
    a transactional data batch opens its producer's transaction if none is open; a COMMIT or
    ABORT marker closes it; a producer with an open transaction and no marker after it is open.
    The last stable offset is the oldest open one's first offset, never below the log start
    `start` (Kafka's rule: retention or delete_records may pass it)."""
    open_txns: dict[int, int] = {}
    outcomes: dict[int, str] = {}
    txn_of: dict[int, int] = {}
    for batch in batches:
        pid = batch.producer_id
        if batch.is_control:
            marker = decode_txn_marker(batch) if pid >= 0 else None
            if marker is not None and pid in open_txns:
                outcomes[open_txns.pop(pid)] = COMMITTED if marker.commit else ABORTED
        elif batch.is_transactional:
            first = open_txns.setdefault(pid, batch.base_offset)
            outcomes.setdefault(first, OPEN)
            txn_of[batch.base_offset] = first
    ranges = []
    for batch in batches:
        if batch.is_control:
            kind = "control"
        elif batch.base_offset in txn_of:
            kind = outcomes[txn_of[batch.base_offset]]
        else:
            kind = "plain"
        ranges.append((batch.base_offset, batch.last_offset, kind))
    stable = max(min(open_txns.values(), default=end), min(start, end))
    return TxnView(outcomes, txn_of, open_txns, stable, ranges)


def read_committed(log: Log, max_bytes: int) -> tuple[list[int], list[int]]:
    """Offsets of the records a read_committed scan returns, and the last offsets of its batches."""
    offsets: list[int] = []
    batch_ends: list[int] = []
    offset = log.log_start_offset
    while offset < log.last_stable_offset:
        fetched = log.read(offset, max_bytes, isolation="read_committed")
        if fetched.next_offset <= offset:
            break
        batch_ends += [batch.last_offset for batch in fetched.batches]
        offsets += [record.offset for record in fetched.records()]
        offset = fetched.next_offset
    return offsets, batch_ends


def check_read_committed(
    log: Log, batches: Sequence[RecordBatch], max_bytes: int, violation: Callable[[str, str], None]
) -> TxnView:
    """The engine's read_committed view and last stable offset against what the log's batches give."""
    view = derive_transactions(batches, log.log_end_offset, log.log_start_offset)
    stable = log.last_stable_offset
    if stable != view.stable:
        violation(
            "last stable offset is the oldest open transaction",
            f"last_stable_offset {stable}, open transactions {view.open_txns} give {view.stable}",
        )
    offsets, batch_ends = read_committed(log, max_bytes)
    invariant = "read_committed returns only committed data"
    beyond = [end for end in batch_ends if end >= stable]
    if beyond:
        violation(invariant, f"batches ending at {beyond[:5]} fetched past the last stable offset {stable}")
    starts = [first for first, _, _ in view.ranges]
    wrong: dict[str, list[int]] = {}
    for offset in offsets:
        n = bisect.bisect_right(starts, offset) - 1
        kind = view.ranges[n][2] if n >= 0 and offset <= view.ranges[n][1] else "nowhere"
        if offset >= view.stable:
            kind = f"{kind} past the last stable offset {view.stable}"
        if kind not in ("plain", COMMITTED):
            wrong.setdefault(kind, []).append(offset)
    for kind, where in wrong.items():
        what = {ABORTED: "aborted", OPEN: "still-open", "control": "control"}.get(kind, kind)
        violation(invariant, f"returned records of {what} data at offsets {where[:5]}")
    if offsets != sorted(set(offsets)):
        violation(invariant, "records returned out of order or twice")
    start = log.log_start_offset  # records below it are not served, whatever they are
    expected = [
        offset
        for first, last, kind in view.ranges
        if kind in ("plain", COMMITTED) and last < view.stable
        for offset in range(max(first, start), last + 1)
    ]
    missing = sorted(set(expected) - set(offsets))
    if missing:
        violation("read_committed returns all committed data", f"offsets {missing[:5]} never returned")
    return view


def check_txn_outcomes(
    view: TxnView, model: Model, fault: str, violation: Callable[[str, str], None]
) -> None:
    """The recovered transactions are the ones written, and acknowledged-durable markers closed theirs."""
    for offset, first in view.txn_of.items():
        txn = model.txn_of.get(offset)
        if txn is None or txn.first_offset != first:
            began = None if txn is None else txn.first_offset
            violation(
                "transactions are as written",
                f"batch {offset} is in a transaction from {first}, the workload's began at {began}",
            )
    for first, outcome in view.outcomes.items():
        txn = model.txn_of.get(first)
        if txn is not None and outcome != OPEN and outcome != (COMMITTED if txn.commit else ABORTED):
            violation("transactions are as written", f"transaction from {first} recovered as {outcome}")
    after_kill = fault in ("kill", "enospc")  # the page cache survives: every ack must
    for txn in model.txns:
        if not txn.acked or not (after_kill or txn.marker_offset < model.durable_end):
            continue
        if model.excused(txn.marker_offset):
            continue  # cut by the truncation the crash interrupted
        if view.outcomes.get(txn.first_offset) != txn.outcome:
            violation(
                "acknowledged transaction outcomes survive",
                f"producer {txn.producer_id}'s transaction from {txn.first_offset}, {txn.outcome} by the "
                f"marker at {txn.marker_offset} (durable end {model.durable_end}), recovered as "
                f"{view.outcomes.get(txn.first_offset)}",
            )


def complete_open_transactions(
    log: Log, batches: list[RecordBatch], view: TxnView, seed: int, violation: Callable[[str, str], None]
) -> None:
    """The coordinator ends, on the recovered log, every transaction the crash left open."""
    rng = random.Random(f"{seed}/complete")
    decided: dict[int, str] = {}
    for pid, first in sorted(view.open_txns.items()):
        entry = log.producer_state(pid)
        if entry is None:
            violation("open transactions can be ended after recovery", f"producer {pid} has no state")
            continue
        commit = rng.random() < 0.5
        try:
            result = log.write_txn_marker(
                pid, entry.producer_epoch, commit=commit, coordinator_epoch=max(entry.coordinator_epoch, 0)
            )
        except OncelogError as exc:
            violation("open transactions can be ended after recovery", f"producer {pid}: {exc!r}")
            return
        batches.extend(log.read(result.first_offset, 1).batches[:1])
        decided[first] = COMMITTED if commit else ABORTED
    if not decided:
        return
    if log.last_stable_offset != log.log_end_offset:
        violation(
            "open transactions can be ended after recovery",
            f"all ended, yet last_stable_offset {log.last_stable_offset} != log end {log.log_end_offset}",
        )
    ended = check_read_committed(log, batches, READ_COMMITTED_FETCH_BYTES[seed % 3], violation)
    for first, outcome in decided.items():
        if ended.outcomes.get(first) != outcome:
            violation(
                "open transactions can be ended after recovery",
                f"transaction from {first} should be {outcome}, the log gives {ended.outcomes.get(first)}",
            )
