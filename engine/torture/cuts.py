"""The Model's side of the operations that remove data on purpose: truncate_to, delete_records
and apply_retention.

A completed truncation is a follower discarding its diverged suffix: the batches it cut
(acknowledged or not) leave the Model, the transactions whose data or markers went are
cut back with them (reopened, or forgotten when nothing of them is left), and the
producers resume from what the log then holds. A completed delete_records or retention
moves the Model's log start. While one of them is under way (a crash or an injected
failure inside it), the Model keeps both possibilities: `pending_cut` excuses the
batches the truncation may have cut, `pending_start` is the other start the log may
come back with. The workload (torture_workload) calls these; the checker reads the
Model they leave.
"""

from __future__ import annotations

from oncelog.log import Log
from oncelog.segments.batch import RecordBatch
from oncelog.torture.model import Model


def truncation_end(model: Model, offset: int) -> int:
    """Where truncate_to(offset) must leave the log end: `offset`, or the start of the batch holding it."""
    for base, data in model.written.items():
        if base < offset <= RecordBatch(data).last_offset:
            return base
    return offset


def cut_model(model: Model, new_end: int) -> None:
    """A truncation to `new_end` completed: everything at or past it is gone on purpose."""
    model.written = {offset: data for offset, data in model.written.items() if offset < new_end}
    model.acked = {offset: data for offset, data in model.acked.items() if offset < new_end}
    model.txn_of = {offset: txn for offset, txn in model.txn_of.items() if offset < new_end}
    kept = []
    for txn in model.txns:
        txn.batches = [offset for offset in txn.batches if offset < new_end]
        if not txn.batches:
            continue  # its first batch was cut: the transaction never happened
        if txn.marker_offset >= new_end:
            txn.marker_offset, txn.commit, txn.acked = -1, None, False  # open again
        kept.append(txn)
    model.txns = kept
    model.durable_end = min(model.durable_end, new_end)
    model.point_floor = min(model.point_floor, new_end)
    model.log_start = min(model.log_start, new_end)


def next_sequence(model: Model, producer_id: int, epoch: int) -> int:
    """The sequence a producer resumes at after a truncation: one past its newest data batch
    at `epoch` still in the log, or 0 (a new epoch, or nothing of it left)."""
    last = -1
    for offset in sorted(model.written):
        batch = RecordBatch(model.written[offset])
        if batch.producer_id == producer_id and not batch.is_control and batch.producer_epoch == epoch:
            last = batch.last_sequence
    return last + 1


def retention_plan(log: Log, now_ms: int) -> tuple[int, int]:
    """How many segments apply_retention(now_ms) must delete and the start it must leave, by
    Kafka's rules: the oldest sealed segments, while past retention_ms (by their newest
    timestamp) or while the log stays at least retention_bytes without them."""
    config, segments = log.config, log.segments
    cutoff = None if config.retention_ms is None else now_ms - config.retention_ms
    excess = log.size_bytes - config.retention_bytes if config.retention_bytes is not None else 0
    count = 0
    for segment in segments[:-1]:
        too_old = cutoff is not None and segment.newest_timestamp_ms() <= cutoff
        too_big = config.retention_bytes is not None and excess >= segment.size
        if not (too_old or too_big):
            break
        excess -= segment.size
        count += 1
    start = log.log_start_offset
    return count, max(segments[count].base_offset, start) if count else start
