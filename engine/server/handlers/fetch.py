"""Fetch (API 1, v4-12): stored batches, as they are on disk, with no fetch sessions.

Every response lists every requested partition once (session id 0: no incremental
fetches; a partition named twice is read once, at its last entry's offset, as Kafka
keys the request by partition). The response waits up to max_wait_ms for
min_bytes, woken by appends to its partitions only.
Limits are Kafka's (KIP-74): partition_max_bytes per partition and max_bytes in all.
The first partition with data returns at least one whole batch whatever the limits,
so a batch larger than them never stalls a consumer; every later partition returns
only the batches that fit in what is left (whole batches: Kafka would send the last
one cut short, which the client drops and fetches again).

A partition of a topic the principal may not Read is TOPIC_AUTHORIZATION_FAILED, whether
the topic exists or not, and nothing of it is read.

read_committed stops at the last stable offset and lists the aborted transactions
the returned batches overlap; the consumer drops their records.

Where the work runs: reading (the preads and every batch's CRC) and framing run on
the broker's fetch threads, never on the event loop, which only waits for them. On
the loop they cost 4-7 ms per MB, so one 50 MB fetch stalled every other client for
a quarter of a second. The frame carries the read's buffers as pieces, never joined
(protocol.encode_frame), and the connection writes them a chunk at a time.

Memory: before reading, a fetch reserves bytes from the server's budget for unsent
responses (unsent.UnsentBytes): what it asks, or what is free if less, and only once
MIN_GRANT_BYTES (or all it asks) is free, plus what the read itself needs beside
(READ_SLACK_BYTES). Its frame's bytes, buffers included, are then counted until the
client has taken them. With too little free the fetch reads nothing: it waits for room
and answers without records when max_wait runs out, so clients that do not read
cannot make the server hold more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from oncelog.errors import OncelogError
from oncelog.layout import InvalidTopicError, TopicPartition
from oncelog.log import Log
from oncelog.results import Isolation
from oncelog.segments.batch import RecordBatch
from oncelog.server.acls import Operation
from oncelog.server.authorization import Access
from oncelog.server.broker import Broker
from oncelog.server.codec import (
    NO_THROTTLE,
    READ_COMMITTED,
    Frame,
    MalformedRequestError,
    Records,
    Request,
    buffer_of,
    build,
    encode_frame,
    nested,
    response_type,
)
from oncelog.server.errors import InternalTopicError, error_code_for

# The most one fetch response carries, whatever the client asks: Kafka's fetch.max.bytes.
MAX_FETCH_BYTES = 55 * 1024 * 1024
# A fetch reads once this much of the unsent budget is free (or all it asks, if less):
# a largest batch (LogConfig.max_batch_bytes), so a partial grant is seldom too small for
# the whole batch KIP-74 has it return.
MIN_GRANT_BYTES = 1024 * 1024 + 12
# A partition is read this much at a time (see _read_one).
READ_STEP_BYTES = 1024 * 1024
# What a read holds beside the batches it keeps, while it reads: a step's read fills a
# chunk of the segment (the step plus the index interval), and one that stops a batch
# short of its limit fills a second chunk to look at the next batch, then drops it. A
# fetch reserves this on top of its records, and gives back what it did not keep.
READ_SLACK_BYTES = 2 * (READ_STEP_BYTES + 64 * 1024)
# Batches are copied out of a buffer they were read into when it holds more than twice them
# plus this; otherwise a response would keep a much larger buffer alive. Below that the
# buffer is kept (and counted whole): copying costs more than the memory it would save.
COMPACT_SLACK_BYTES = 64 * 1024


class _Want(NamedTuple):
    tp: TopicPartition
    fetch_offset: int
    partition_max_bytes: int
    # The partition's log, or the error its lookup gave.
    target: Log | ErrorCode


class _Fetched(NamedTuple):
    frame: Frame
    records_bytes: int
    failed: bool


class _NoRoom(NamedTuple):
    """Too little of the unsent budget is free: wait until `needed_bytes` are."""

    needed_bytes: int


async def handle_fetch(broker: Broker, request: Request) -> Frame:
    body = request.body
    if body.isolation_level not in (0, READ_COMMITTED):
        raise MalformedRequestError(f"Fetch isolation_level {body.isolation_level} is neither 0 nor 1")
    isolation: Isolation = "read_committed" if body.isolation_level == READ_COMMITTED else "read_uncommitted"
    access = broker.access(request)
    wants = [_Want(tp, *where, _target(broker, access, tp)) for tp, where in _wanted(body).items()]
    partitions = [want.tp for want in wants]
    wait_s = min(body.max_wait.total_seconds(), broker.config.max_fetch_wait_ms / 1000)
    deadline = time.monotonic() + max(wait_s, 0.0)
    # What the records may take (a first batch past it is counted when read): a consumer
    # asking 50 MiB in all but 1 MiB a partition from two partitions reserves 2 MiB.
    asked = max(
        min(body.max_bytes, MAX_FETCH_BYTES, sum(max(want.partition_max_bytes, 0) for want in wants)), 1
    )
    needed = min(asked, MIN_GRANT_BYTES) + READ_SLACK_BYTES
    while True:
        event = broker.watch(partitions)  # before reading: an append after the read sets it
        try:
            fetched = await _read_within_budget(broker, request, wants, asked, needed, isolation)
            over = deadline - time.monotonic() <= 0 or broker.stopping
            if isinstance(fetched, _NoRoom):
                if over:
                    return await _without_records(broker, request, wants, isolation)
                needed = fetched.needed_bytes
                woken: asyncio.Future[Any] = broker.unsent.room(needed)
            elif fetched.records_bytes >= body.min_bytes or fetched.failed or over:
                return fetched.frame
            else:
                broker.unsent.release(fetched.frame.held_bytes)  # too little yet: read again once woken
                woken = asyncio.ensure_future(event.wait())
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken, deadline - time.monotonic())
            finally:
                woken.cancel()  # a timed-out wait for room stops waiting
        finally:
            broker.unwatch(partitions, event)


def _wanted(body: Any) -> dict[TopicPartition, tuple[int, int]]:
    """(fetch offset, partition max bytes) per partition; a partition named twice counts once (the last)."""
    wanted: dict[TopicPartition, tuple[int, int]] = {}
    for topic in body.topics:
        for partition in topic.partitions:
            tp = TopicPartition(topic.topic, partition.partition)
            wanted[tp] = (partition.fetch_offset, partition.partition_max_bytes)
    return wanted


def _target(broker: Broker, access: Access, tp: TopicPartition) -> Log | ErrorCode:
    if not access.topic(Operation.READ, tp.topic):  # (before its existence: a name tells nothing)
        return ErrorCode.topic_authorization_failed
    try:
        return broker.client_log(tp.topic, tp.partition)  # no client reads an internal topic
    except (OncelogError, InvalidTopicError, InternalTopicError) as exc:
        return error_code_for(exc)


async def _read_within_budget(
    broker: Broker, request: Request, wants: list[_Want], asked: int, needed: int, isolation: Isolation
) -> _Fetched | _NoRoom:
    """The response read and framed in a fetch thread, counted in the unsent budget from before the read.

    The reservation covers the records and the read's own slack; once the frame is built,
    what it holds is all that stays counted.
    """
    unsent = broker.unsent
    reserved = unsent.reserve(asked + READ_SLACK_BYTES, needed)
    if not reserved:
        return _NoRoom(needed)
    granted = max(reserved - READ_SLACK_BYTES, 1)  # at least one batch when it is alone (KIP-74)
    try:
        fetched = await broker.in_fetch_thread(lambda: _respond(request, wants, granted, isolation))
    except BaseException:  # cancelled (a shutdown) or failed: the reservation holds nothing
        unsent.release(reserved)
        raise
    held = fetched.frame.held_bytes
    if held <= reserved:
        unsent.release(reserved - held)
        return fetched
    # Past the reservation: KIP-74's whole first batch beyond a small grant.
    if unsent.grow(reserved, held - reserved):
        return fetched
    unsent.release(reserved)
    return _NoRoom(held + READ_SLACK_BYTES)


async def _without_records(
    broker: Broker, request: Request, wants: list[_Want], isolation: Isolation
) -> Frame:
    """The response of a fetch that found no room in the budget by max_wait: every partition, no records."""
    fetched = await broker.in_fetch_thread(lambda: _respond(request, wants, 0, isolation))
    broker.unsent.take(fetched.frame.held_bytes)
    return fetched.frame


def _respond(request: Request, wants: list[_Want], granted: int, isolation: Isolation) -> _Fetched:
    """Read every wanted partition within `granted` bytes (nothing if 0) and frame the response.

    Runs in a fetch thread.
    """
    response = response_type(request.api_key, request.api_version)
    topic_type = nested(response, "responses")
    partition_type = nested(topic_type, "partitions")
    aborted_type = nested(partition_type, "aborted_transactions")
    total = 0
    failed = False
    by_topic: dict[str, list[Any]] = {}
    for want in wants:
        limit = min(max(want.partition_max_bytes, 0), granted - total)
        # KIP-74: until a partition has returned data, the next returns one whole batch whatever the limits.
        fields, records = _read_one(want, limit, granted > 0, total == 0, isolation)
        total += records.size_bytes
        failed = failed or fields["error_code"] != ErrorCode.none
        aborted = fields.pop("aborted", None)
        by_topic.setdefault(want.tp.topic, []).append(
            build(
                partition_type,
                partition_index=want.tp.partition,
                aborted_transactions=(
                    tuple(build(aborted_type, producer_id=pid, first_offset=first) for pid, first in aborted)
                    if aborted is not None
                    else None
                ),
                records=records,
                **fields,
            )
        )
    topics = tuple(build(topic_type, topic=name, partitions=tuple(parts)) for name, parts in by_topic.items())
    body = build(
        response, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, session_id=0, responses=topics
    )
    return _Fetched(encode_frame(request, body), total, failed)


_NO_RECORDS = Records(())


def _read_one(
    want: _Want, limit: int, may_read: bool, whole_first: bool, isolation: Isolation
) -> tuple[dict[str, Any], Records]:
    """One partition's fields (plus "aborted": (pid, first offset) pairs) and its records.

    Read READ_STEP_BYTES at a time: a read fills a chunk of the segment past the batches it
    returns, and holds the log's lock while it reads, so smaller reads keep both short.
    """
    target = want.target
    if not isinstance(target, Log):
        return {"error_code": target, "high_watermark": -1}, _NO_RECORDS
    try:
        high_watermark = target.log_end_offset
        stable = target.last_stable_offset
        start = target.log_start_offset
    except OncelogError as exc:
        return {"error_code": error_code_for(exc), "high_watermark": -1}, _NO_RECORDS
    fields: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "high_watermark": high_watermark,
        "last_stable_offset": stable,
        "log_start_offset": start,
        "aborted": [] if isolation == "read_committed" else None,
    }
    if not may_read or (limit <= 0 and not whole_first):
        return fields, _NO_RECORDS
    kept: list[RecordBatch] = []
    aborted: dict[tuple[int, int], None] = {}  # in order, each once
    offset, size = want.fetch_offset, 0
    while True:
        left = limit - size
        step_bytes = min(max(left, 1), READ_STEP_BYTES)
        try:
            # Up to the high watermark reported with them, as Kafka does.
            fetched = target.read(offset, step_bytes, max_offset=high_watermark, isolation=isolation)
        except OncelogError as exc:
            if kept:
                break  # the log changed under a later step (retention, say): send what was read
            fields["error_code"] = error_code_for(exc)
            fields["aborted"] = None
            return fields, _NO_RECORDS
        taken = _within(fetched.batches, left, whole_first and not kept)
        kept += taken
        size += sum(batch.size for batch in taken)
        aborted.update(dict.fromkeys(fetched.aborted_transactions))
        # Done when a batch did not fit, the step had all that was left, or the data ran out.
        done = not taken or len(taken) < len(fetched.batches) or step_bytes >= left
        if done or fetched.next_offset >= high_watermark:
            break
        offset = fetched.next_offset
    if isolation == "read_committed":
        last = kept[-1].last_offset if kept else -1
        fields["aborted"] = [(pid, first) for pid, first in aborted if first <= last]
    return fields, Records(_compacted([batch.buffer for batch in kept]))


def _within(batches: Sequence[RecordBatch], limit: int, whole_first: bool) -> list[RecordBatch]:
    """The leading batches that fit in `limit` bytes; with `whole_first`, the first one whatever its size."""
    kept: list[RecordBatch] = []
    size = 0
    for batch in batches:
        size += batch.size
        if size > limit and not (whole_first and not kept):
            break
        kept.append(batch)
    return kept


def _compacted(views: list[memoryview]) -> list[memoryview]:
    """`views`, with copies of those whose buffer they use little of, so that buffer can be freed.

    A read fills whole chunks of a segment, and one that ends a batch short of its limit
    fills another chunk to look at the next batch. Batches are copied one at a time: the
    fetch thread never holds the interpreter for more than one batch's copy.
    """
    used: dict[int, int] = {}  # by buffer: the bytes of it the views take
    sizes: dict[int, int] = {}  # by buffer: its size
    for view in views:
        source = buffer_of(view)
        if source is not None:
            used[id(source)] = used.get(id(source), 0) + view.nbytes
            sizes[id(source)] = len(source)
    wasteful = {key for key, size in used.items() if sizes[key] > 2 * size + COMPACT_SLACK_BYTES}
    return [memoryview(bytes(view)) if id(view.obj) in wasteful else view for view in views]
