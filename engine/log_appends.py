"""A Log's appends: the Python route (the reference) and the compiled binding, in one place.

Every client append first tries the compiled appender (oncelog._append through
`compiled_append`), bound to the active segment and the producer table by
`_bind_compiled`; it answers None for every case it leaves to Python. The Python
route is `_append_one` for one client batch (one header unpack, one CRC, one record
walk, one copy), and `append_batches` for everything else: `_plan` checks a whole
request with no I/O and no state change, `_execute` writes it (rolling where needed)
and `_publish` applies producer state once the bytes are in the segment.

The compiled appender must be rebound whenever what it is bound to is replaced (a
roll's new active segment, a reload's segments and producer table) and unbound when
the log stops taking appends (a failure, close): `_bind_compiled` and
`_unbind_compiled` are the only places that bind or unbind it. Binding waits for the
next append (`_compiled_for_append`): most of a broker's partitions are opened or
rolled and then idle, and an open should not make what only an append uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from oncelog import compiled_append
from oncelog.append_plan import PlannedBatch, stamped_buffers
from oncelog.append_rules import ProducerAppendInfo
from oncelog.clock import MonotonicWallClock
from oncelog.errors import (
    InvalidRecordError,
    LogFailedError,
    ProducerStateFullError,
)
from oncelog.log_state import LogState
from oncelog.producer_state import BatchMetadata, CompletedTxn, WorkingState
from oncelog.results import AppendResult
from oncelog.segments import format as fmt
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import TxnMarker, decode_txn_marker, encode_txn_marker
from oncelog.segments.format import Buffer
from oncelog.segments.segment import BatchMeta, LogSegment
from oncelog.storage.checkpoint import (
    CLIENT_ONLY_KEY,
    write_offsets,
)
from oncelog.validation import Origin, batch_buffer, client_batch_header, refuse_keyless, validate_batch

# Builds a NamedTuple without its Python-level __new__: half the cost on the append path.
_new_result = tuple.__new__

T = TypeVar("T")


class LogAppends(LogState):
    def _unbind_compiled(self) -> None:
        self._client_appender = None
        compiled, self._compiled_appender = self._compiled_appender, None
        if compiled is not None:
            # A flag: a call waiting for the lock finds it closed and goes to the Python route.
            compiled.close()

    def _bind_compiled(self) -> None:
        """Unbind the compiled append from what it was bound to; the next append binds it
        to the current active segment and producer table (`_compiled_for_append`)."""
        self._unbind_compiled()
        self._bind_pending = True

    def _compiled_for_append(self) -> compiled_append.Appender | None:
        """The compiled appender, bound first if `_bind_compiled` asked for it. Under the
        lock: a bind unbinds what is there, which another appender may be using."""
        with self._lock:
            if self._bind_pending:
                self._bind_compiled_now()  # (raising, e.g. reading deferred producers: tried again next time)
                self._bind_pending = False
            return self._compiled_appender

    def _bind_compiled_now(self) -> None:
        """Bind the compiled append to the current active segment and producer table.

        The compiled path leaves the log on the Python path (returns None) for every
        case it does not take, so a log without one is only slower. None on a closed
        or failed log, and for LogAppendTime (which rewrites CRC-covered fields).
        """
        module = compiled_append.compiled
        if (
            module is None
            or not self._compiled
            or self._closed
            or self._failure is not None
            or self._log_append_time
            or self._stored_codec is not None
            or self._requires_keys
            or not self._segments
        ):
            return
        self._compiled_appender = module.Appender(
            lock=self._lock,
            clock=self._clock,
            result_type=AppendResult,
            max_batch_bytes=self._max_batch_bytes,
            segment_bytes=self._segment_bytes_limit,
            segment_ms=self._segment_ms,
            open_transactions=self._transactions.first_offsets,
            **self._producers.shared_arrays(),
            **self._segments[-1].shared_cursors(),
            clock_cell=self._clock.cell if isinstance(self._clock, MonotonicWallClock) else None,
        )
        # What `append` calls with no Python frame (compiled_append.append_method); a flush
        # policy counts every append in Python, so such a log goes through the method.
        self._client_appender = None if self._has_flush_policy else self._compiled_appender

    def append(
        self, batch_bytes: Buffer, *, origin: Origin = "client", durable: bool = False
    ) -> AppendResult:
        """Validate one encoded batch, check its producer, stamp its offsets and write it.

        With `durable`, return only once the batch is fsynced; appenders waiting at
        the same time share one fsync (group commit). A `truncate_to` meanwhile raises
        TruncatedBeforeDurableError (retriable): the batch may be gone.

        What the compiled appender leaves to Python goes by the single-batch route
        (`_append_one`): the same checks and the same order of effects as the request
        route (see _plan/_execute), without building a RecordBatch or a plan: one header
        unpack, one CRC, one walk over the records, one copy into the segment.
        append_batches takes the rare cases (replication, a roll, LogAppendTime, a full
        producer table).

        `batch_bytes` is bytes, bytearray or any C-contiguous buffer of bytes (TypeError
        for anything else).
        """
        if type(batch_bytes) is not bytes:
            batch_bytes = batch_buffer(batch_bytes)
        if not durable:
            if (
                origin != "client"
                or self._log_append_time
                or self._stored_codec is not None
                or self._requires_keys
            ):
                return self.append_batches([batch_bytes], origin=origin)[0]
            compiled = self._compiled_appender
            if compiled is None and self._bind_pending:
                compiled = self._compiled_for_append()
            if compiled is not None:
                result: AppendResult | None = compiled.append(batch_bytes)
                if result is not None:
                    if self._has_flush_policy:
                        self._count_for_flush([result], [batch_bytes])
                    return result
            return self._append_one(batch_bytes)
        # Noted before the append: a truncation from here on may have cut this batch, and
        # its waiter must not take later batches at the same offsets for its own.
        cuts = self._group_commit.cuts
        result = self.append(batch_bytes, origin=origin)
        self._group_commit.wait(result.last_offset + 1, self._flush, self.directory, cuts=cuts)
        return result

    # The common call (one bytes batch, no keywords) runs no Python frame: the method above
    # is what every other call, and every batch the compiled appender leaves, runs.
    append = compiled_append.append_method(append, "_client_appender")

    def _append_one(self, buffer: Buffer) -> AppendResult:
        header = client_batch_header(buffer, self._max_batch_bytes, self._max_decompressed_bytes)
        if header is None:  # its header's maxTimestamp is set right in a copy, as a request's is
            return self.append_batches([buffer])[0]
        size = len(buffer)
        last_delta, max_ts, pid = header[6], header[8], header[9]
        with self._lock:
            if self._closed or self._failure is not None:
                self._check_writable()
            segment = self._segments[-1]
            base = segment.next_offset
            last = base + last_delta
            if self._rolls_for(segment, size, max_ts, last):  # a roll goes to the request path
                return self.append_batches([buffer])[0]
            after: WorkingState | None = None
            now_ms = 0
            if pid >= 0:
                now_ms = self._clock()
                # Read before the try: a failed first read of a deferred state leaves the log writable.
                producers = self._producers
                try:
                    producers.expire_due(now_ms)  # (moves rows and map slots: see _fail_midway)
                except BaseException as exc:
                    self._fail_midway(exc)
                    raise
                epoch, first_sequence = header[10], header[11]
                is_transactional = bool(header[5] & fmt.TRANSACTIONAL_MASK)
                last_sequence = (first_sequence + last_delta) % (fmt.INT32_MAX + 1)
                info = ProducerAppendInfo(self._producers, now_ms)
                duplicate = info.check(pid, epoch, first_sequence, last_sequence, is_transactional)
                if duplicate is not None:
                    # As _execute answers a duplicate (a reconfigure may have raced append's check).
                    append_time_ms = duplicate.max_timestamp_ms if self._log_append_time else -1
                    return _new_result(
                        AppendResult, (duplicate.first_offset, duplicate.last_offset, append_time_ms, True)
                    )
                meta = BatchMetadata(first_sequence, last_sequence, base, last, max_ts)
                try:
                    after = info.apply(pid, epoch, meta, False, is_transactional)
                except ProducerStateFullError:
                    return self.append_batches([buffer])[0]  # makes room from expired producers, or refuses
            self._write_stamped(segment, buffer, base, last, max_ts, after, None)
            if self._has_flush_policy:
                self._maybe_flush(header[12])
            return _new_result(AppendResult, (base, last, -1, False))

    def append_records(
        self,
        records: Iterable[object],
        *,
        producer_id: int = fmt.NO_PRODUCER_ID,
        producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
        base_sequence: int = fmt.NO_SEQUENCE,
        is_transactional: bool = False,
        timestamp_ms: int | None = None,
        compression: str | None = None,
    ) -> AppendResult:
        """Encode `records` as one batch and append it."""
        batch = encode_batch(
            records,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=is_transactional,
            timestamp_ms=self._clock() if timestamp_ms is None else timestamp_ms,
            compression=compression,
        )
        return self.append(batch)

    def write_txn_marker(
        self, producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> AppendResult:
        """Append a COMMIT or ABORT marker for `producer_id`, closing its open transaction.

        Fenced (nothing written) when the producer epoch is older than the stored
        one (InvalidProducerEpochError) or the coordinator epoch is
        (TransactionCoordinatorFencedError). A marker for a producer with no open
        transaction is written but completes nothing. An aborted transaction goes
        to the transaction index of the segment holding its marker.
        """
        fmt.check_int("producer_id", producer_id, "i64", minimum=0)  # a marker closes some producer's txn
        fmt.check_int("producer_epoch", producer_epoch, "i16")
        fmt.check_int("coordinator_epoch", coordinator_epoch, "i32")
        with self._lock:
            self._check_writable()
            now_ms = self._clock()
            # As every append: a marker for a producer the table no longer holds needs a slot.
            self._changing_producers(self._producers.expire_due, now_ms)
            info = ProducerAppendInfo(self._producers, now_ms)
            info.check_marker(producer_id, producer_epoch, coordinator_epoch)
            base = self.log_end_offset
            if base > fmt.MAX_OFFSET:
                raise InvalidRecordError(
                    f"{self.directory} is full: its log end {base} is the largest offset"
                )
            data = encode_txn_marker(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                timestamp_ms=now_ms,
                base_offset=base,
            )
            marker = TxnMarker(commit, coordinator_epoch)
            after, completed = info.apply_marker(producer_id, producer_epoch, base, now_ms, marker)
            segment = self._segments[-1]
            if self._log_append_time or self._rolls_for(segment, len(data), now_ms, base):
                # (the request route rolls, and stamps LogAppendTime)
                batch = RecordBatch(data)
                return self._execute(
                    [PlannedBatch(batch, base, base, now_ms, False, after, completed=completed)]
                )[0]
            # The single-batch route, as _append_one writes a client batch (markers are a
            # transaction's last step on each of its partitions: a broker writes many).
            self._write_stamped(segment, data, base, base, now_ms, after, completed)
            return _new_result(AppendResult, (base, base, -1, False))

    def _rolls_for(self, segment: LogSegment, size: int, max_ts: int, last_offset: int) -> bool:
        """Whether one batch appended now must roll the active `segment` first (roll_needed)."""
        return roll_needed(
            segment.size,
            segment.first_batch_timestamp_ms,
            size,
            max_ts,
            last_offset,
            segment.last_offset_limit,
            self._segment_bytes_limit,
            self._segment_ms,
        )

    def _write_stamped(
        self,
        segment: LogSegment,
        buffer: Buffer,
        base: int,
        last: int,
        max_ts: int,
        after: WorkingState | None,
        completed: CompletedTxn | None,
    ) -> None:
        """The single-batch route's write: the bytes, then (only then) the producer's new state.
        An I/O error fails the log closed, as the request route's (`_write_group`) does."""
        try:
            segment.append_stamped(buffer, base, last, max_ts)
            if after is not None:
                self._publish(after, completed, segment)
        except BaseException as exc:
            raise self._write_failed(segment, exc)  # noqa: B904 (it sets the cause itself)

    def append_batches(self, batches: Sequence[Buffer], *, origin: Origin = "client") -> list[AppendResult]:
        """Append many batches with as few write() calls as the segments allow.

        Every batch is checked first; if any is refused, nothing is written. A
        duplicate (a retry of one of its producer's last 5 batches) is not written
        and comes back with its original offsets and `duplicate=True`.
        """
        if origin not in ("client", "replication"):
            raise ValueError(f"origin is 'client' or 'replication', got {origin!r}")
        compiled = self._compiled_appender
        if compiled is None and self._bind_pending:
            compiled = self._compiled_for_append()
        if compiled is not None and origin == "client":
            results: list[AppendResult] | None = compiled.append_batches(batches)
            if results is not None:
                if self._has_flush_policy:
                    self._count_for_flush(results, batches)
                return results
        views = [
            validate_batch(
                buffer, origin, self._max_batch_bytes, self._max_decompressed_bytes, self._stored_codec
            )
            for buffer in batches
        ]
        if self._requires_keys and origin == "client":
            for view in views:
                refuse_keyless(view, self.directory)
        with self._lock:
            self._check_writable()
            now_ms = self._clock()
            self._changing_producers(self._producers.expire_due, now_ms)
            try:
                plan = self._plan(views, origin, now_ms)
            except ProducerStateFullError:
                # A full ring: make room from expired producers once, then refuse.
                if not self._changing_producers(self._producers.make_room, now_ms):
                    raise
                plan = self._plan(views, origin, now_ms)
            results = self._execute(plan)
            if self._has_flush_policy:
                self._maybe_flush(sum(p.batch.records_count for p in plan if not p.duplicate))
            return results

    def _plan(self, views: list[RecordBatch], origin: Origin, now_ms: int) -> list[PlannedBatch]:
        """Offsets and producer checks for a request, with no I/O and no state change."""
        append_time_ms = now_ms if self.config.timestamp_type == "LogAppendTime" else None
        info = ProducerAppendInfo(self._producers, now_ms)
        plan: list[PlannedBatch] = []
        next_offset = self.log_end_offset
        for batch in views:
            pid = batch.producer_id
            max_ts = batch.max_timestamp if append_time_ms is None else append_time_ms
            if origin == "client" and pid >= 0:
                duplicate = info.check(
                    pid,
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.last_sequence,
                    batch.is_transactional,
                )
                if duplicate is not None:
                    # The original's timestamp: on LogAppendTime, when it was appended (Kafka's answer).
                    original_ts = duplicate.max_timestamp_ms
                    plan.append(
                        PlannedBatch(batch, duplicate.first_offset, duplicate.last_offset, original_ts, True)
                    )
                    continue
            if origin == "replication":
                # A follower keeps its leader's offsets; gaps (compaction) are legal.
                base = batch.base_offset
                if base < next_offset:
                    raise InvalidRecordError(
                        f"replicated batch at offset {base} is below the log end {next_offset}"
                    )
            else:
                base = next_offset
            last = base + batch.last_offset_delta
            if last > fmt.MAX_OFFSET:
                raise InvalidRecordError(
                    f"batch at offset {base} would take offsets up to {last}, past the largest an "
                    f"i64 log end allows ({fmt.MAX_OFFSET})"
                )
            after, completed = None, None
            marker = decode_txn_marker(batch) if batch.is_control and pid >= 0 else None
            if marker is not None:
                # A leader's transaction marker (clients cannot send control batches).
                after, completed = info.apply_marker(pid, batch.producer_epoch, base, max_ts, marker)
            elif batch.is_control:
                pass  # an empty control batch (compaction left it) or another control type: no state
            elif pid >= 0:
                meta = BatchMetadata(batch.base_sequence, batch.last_sequence, base, last, max_ts)
                after = info.apply(pid, batch.producer_epoch, meta, batch.is_control, batch.is_transactional)
            plan.append(
                PlannedBatch(batch, base, last, max_ts, False, after, origin == "replication", completed)
            )
            next_offset = last + 1
        return plan

    def _execute(self, plan: list[PlannedBatch]) -> list[AppendResult]:
        append_time = self.config.timestamp_type == "LogAppendTime"
        if self._client_only and any(p.replicated and not p.duplicate for p in plan):
            # Durable before a leader's batch is written: recovery and reads must not reject
            # its offsets or leader epoch later. Here, not in _plan: a refused request
            # changes nothing on disk.
            self._commit_metadata(write_offsets, {CLIENT_ONLY_KEY: 0})
            self._client_only = False
        results: list[AppendResult] = []
        group: list[PlannedBatch] = []
        # The active segment as it will be once the pending group is written.
        segment_bytes = self.active_segment.size
        first_timestamp_ms = self.active_segment.first_batch_timestamp_ms
        for p in plan:
            if p.duplicate:
                results.append(AppendResult(p.base, p.last, p.max_ts if append_time else -1, True))
                continue
            active = self.active_segment
            if roll_needed(
                segment_bytes,
                first_timestamp_ms,
                p.batch.size,
                p.max_ts,
                p.last,
                active.last_offset_limit,
                self._segment_bytes_limit,
                self._segment_ms,
            ):
                self._write_group(group)
                group = []
                self._roll(p.base)
                segment_bytes, first_timestamp_ms = 0, None
            group.append(p)
            segment_bytes += p.batch.size
            if first_timestamp_ms is None:
                first_timestamp_ms = p.max_ts
            results.append(AppendResult(p.base, p.last, p.max_ts if append_time else -1, False))
        self._write_group(group)
        return results

    def _write_group(self, group: list[PlannedBatch]) -> None:
        """Write the group's bytes, then (only then) apply it to producer state."""
        if not group:
            return
        buffers: list[Buffer] = []
        for p in group:
            buffers.extend(stamped_buffers(p, self._log_append_time))
        metas = [BatchMeta(p.last, p.max_ts, p.batch.size) for p in group]
        segment = self.active_segment
        try:
            segment.append(buffers, metas)
            for p in group:
                if p.producer_after is not None:
                    self._publish(p.producer_after, p.completed, segment)
        except BaseException as exc:
            raise self._write_failed(segment, exc)  # noqa: B904 (it sets the cause itself)

    def _write_failed(self, segment: LogSegment, exc: BaseException) -> BaseException:
        """What a failed write (or the producer state after it) raises, once the log has failed
        closed: an I/O error becomes LogFailedError naming the segment; anything else (a Ctrl-C,
        a bug) stays as it is (`_fail_midway`)."""
        if not isinstance(exc, OSError):
            self._fail_midway(exc)
            return exc
        self._fail(exc)
        failed = LogFailedError(f"write to {segment.path} failed: {exc}")
        failed.__cause__ = exc
        return failed

    def _fail_midway(self, exc: BaseException) -> None:
        """Anything escaping a change made of several steps (a Ctrl-C, a bug): between a
        write and its producer state, the segment may hold a batch the state does not know;
        inside the producer table's own rearranging (expiry, making room, retiring), rows
        may be cleared before the live ones are moved. Either way a retry of an acknowledged
        batch could be taken again. The log fails closed: close() leaves no clean-shutdown
        marker (and no snapshot of a broken table), so the next open recovers as after a
        kill. The first failure recorded stays (a failed transaction index write named its own)."""
        if self._failure is None:
            self._fail(exc)

    def _changing_producers(self, change: Callable[[int], T], now_ms: int) -> T:
        """`change(now_ms)` on the producer table; whatever escapes it fails the log closed."""
        try:
            return change(now_ms)
        except BaseException as exc:
            self._fail_midway(exc)
            raise

    def _publish(self, after: WorkingState, completed: CompletedTxn | None, segment: LogSegment) -> None:
        """A producer's new state, once its batch or marker is in `segment`: both append paths."""
        self._producers.put(after)
        try:
            self._transactions.track(after, completed, segment)
        except OSError as exc:
            # The marker is written but its index entry is not: fail closed. The next
            # open validates this segment and rebuilds its transaction index.
            self._fail(exc)
            raise LogFailedError(f"transaction index write in {self.directory} failed: {exc}") from exc


def roll_needed(
    segment_bytes: int,
    first_timestamp_ms: int | None,
    incoming_bytes: int,
    max_timestamp_ms: int,
    last_offset: int,
    last_offset_limit: int,
    max_segment_bytes: int,
    segment_ms: int,
) -> bool:
    """Kafka's roll rules: must a segment of `segment_bytes` roll before taking this batch?

    Both append paths call it. `last_offset_limit` is the segment's: past it the
    relative offsets leave an index entry's i32, the indexes are full, or the log
    end would pass the largest i64.
    """
    if last_offset > last_offset_limit:
        return True  # even an empty segment: a leader's batch far ahead needs one of its own
    if segment_bytes == 0:
        return False  # an empty segment takes any batch, however large
    if segment_bytes + incoming_bytes > max_segment_bytes:
        return True
    # segment_ms counts from the first batch's timestamp, so a restart does not reset it.
    return first_timestamp_ms is not None and max_timestamp_ms - first_timestamp_ms > segment_ms
