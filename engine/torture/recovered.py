"""What a recovered log is checked against: the stored recovery point, and a full replay.

The crash-state checkers (oncelog.torture.harness for every fault class, and
oncelog.torture.cleaning_check for crashes during cleaning) and process mode share
these: the recovery point a crashed twin holds and the bytes recovery may read from it,
and invariant 4, producer state equal to a full replay of the recovered log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from oncelog.log import METADATA_DIR, Log
from oncelog.producer_replay import ReplayBuffer
from oncelog.producer_state import ProducerStateEntry, ProducerStateManager
from oncelog.segments.batch import RecordBatch
from oncelog.segments.control import decode_txn_marker
from oncelog.storage.checkpoint import RecoveryPoint, read_recovery_point
from oncelog.torture.faultfs import FaultFileSystem
from oncelog.torture.model import CONFIG, DIRECTORY, EXPIRATION_MS, Model


def stored_point(fs: FaultFileSystem) -> RecoveryPoint:
    """The recovery point the crashed twin's metadata store holds."""
    store = fs.open_store(f"{DIRECTORY}/{METADATA_DIR}")
    try:
        return read_recovery_point(store)
    finally:
        store.close()


def bytes_from_recovery_point(fs: FaultFileSystem) -> int:
    """Bytes in the segments from the one holding the recovery point on: all recovery may read."""
    point = stored_point(fs)
    total = 0
    if not fs.exists(DIRECTORY):
        return total
    bases = [
        int(name[:20]) for name in fs.listdir(DIRECTORY) if name.endswith(".log") and name[:20].isdigit()
    ]
    first = max([base for base in bases if base <= point.offset], default=0)
    for base in bases:
        if base >= first:
            handle = fs.open(f"{DIRECTORY}/{base:020d}.log", writable=False)
            total += handle.size()
            handle.close()
    return total


def full_replay(batches: Sequence[RecordBatch], forget_at: frozenset[int]) -> dict[int, ProducerStateEntry]:
    """Every producer's state after the loader's own replay of `batches` from offset 0, with
    nothing expired, except that a producer is forgotten just before each offset in
    `forget_at` (where the run saw it expire and restart)."""
    replayed = ProducerStateManager(CONFIG.producer_capacity, CONFIG.producer_expiration_ms)
    replay = ReplayBuffer(replayed, now_ms=0)
    for batch in batches:
        if batch.producer_id < 0:
            continue
        if batch.is_control:
            marker = decode_txn_marker(batch)
            if marker is not None:
                replay.replay_marker(
                    batch.producer_id, batch.producer_epoch, batch.base_offset, batch.max_timestamp, marker
                )
            continue
        if batch.base_offset in forget_at:
            replay.flush()
            replayed.retire([batch.producer_id])
        replay.replay_batch(
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
            batch.base_offset,
            batch.last_offset,
            batch.max_timestamp,
            False,
            batch.is_transactional,
        )
    replay.flush()
    return {entry.producer_id: entry._replace(last_append_ms=0) for entry in replayed.entries()}


def check_producer_state(
    log: Log,
    present: dict[int, bytes],
    violation: Callable[[str, str], None],
    batches: Sequence[RecordBatch] | None = None,
    *,
    now_ms: int | None = None,
    model: Model | None = None,
    exempt: Callable[[ProducerStateEntry, ProducerStateEntry | None], bool] | None = None,
) -> None:
    """Producer state (windows, epochs, coordinator epochs, open transactions) equals a full replay.

    `exempt(recovered, replayed)` excuses a difference the caller has reported or allowed
    (a compacted log's, oncelog.torture.cleaning_check).

    With the `model` (the engine's time each offset was written, where producers
    restarted after expiring) and `now_ms` (the recovery's clock): producers idle past
    the expiration may be missing; last append times lie between the newest batch's
    append and now; and a producer that restarted after expiring may have its state
    from either replay, with or without the expiry (recovery replays a tail over a
    snapshot taken before or after it: they differ only in the coordinator epoch the
    expiry forgot). Without it (process mode, on the wall clock with Kafka's default
    expiration) every producer must be there, equal to the plain replay.
    """
    if batches is None:
        batches = [RecordBatch(present[offset]) for offset in sorted(present)]
    forget_at = frozenset(model.restarted_at) if model is not None else frozenset()
    plain = full_replay(batches, frozenset())
    with_expiry = full_replay(batches, forget_at) if forget_at else plain
    ours = {entry.producer_id: entry for entry in log.producers()}
    # The engine's time of each producer's newest batch or marker in the history.
    newest_ms: dict[int, int] = {}
    if model is not None:
        for batch in batches:
            if batch.producer_id >= 0 and batch.base_offset in model.append_ms:
                newest_ms[batch.producer_id] = model.append_ms[batch.base_offset]
    for pid in sorted(set(plain) - set(ours)):
        idle_since = newest_ms.get(pid)
        may_expire = (
            now_ms is not None
            and idle_since is not None
            and now_ms - idle_since >= EXPIRATION_MS
            and plain[pid].current_txn_first_offset < 0
        )
        if not may_expire:
            violation(
                "producers appended within the expiration are kept",
                f"producer {pid} (newest batch appended at {idle_since}, recovered at {now_ms}) is missing",
            )
    for pid, entry in ours.items():
        untimed = entry._replace(last_append_ms=0)
        if untimed not in (plain.get(pid), with_expiry.get(pid)) and not (
            exempt is not None and exempt(untimed, plain.get(pid))
        ):
            violation(
                "producer state equals a full replay",
                f"recovered {entry} != replayed {plain.get(pid)} "
                f"(with the run's expiries {with_expiry.get(pid)})",
            )
        earliest = newest_ms.get(pid)
        if (earliest is not None and entry.last_append_ms < earliest) or (
            now_ms is not None and entry.last_append_ms > now_ms
        ):
            violation(
                "a producer's last append time is between its newest batch's and now",
                f"producer {pid}: {entry.last_append_ms}, newest batch appended at {earliest}, now {now_ms}",
            )
