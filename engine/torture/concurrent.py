"""Concurrent steps of the torture workload: several simulated threads drive the Log at once.

Two shapes, both under the run's Scheduler (torture_threads), so every interleaving
replays from the seed:

- appenders: 2-3 threads each append 1-3 batches of their own idempotent producer,
  plain or durable (group commit), beside a thread that flushes and one that rolls.
  Each batch goes into the Model when its append returns, at the offset it got; one
  whose call had not returned when the run ended is in flight (Model.in_flight).
- durability against change: the main thread appends, then threads wait for it to be
  durable (group commit, the fsync outside the append lock), flush or roll, while the
  main thread truncates, deletes records, applies retention, closes, appends, rolls
  or flushes. A flush may not commit a recovery point past what a truncation left,
  and a durable append whose batch was cut must hear so (TruncatedBeforeDurableError).

After every step the recovery point must be at or below the log end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oncelog.errors import (
    LogClosedError,
    LogFailedError,
    OffsetOutOfRangeError,
    TruncatedBeforeDurableError,
)
from oncelog.log import Log
from oncelog.results import AppendResult
from oncelog.torture.faultfs import SimulatedCrash
from oncelog.torture.model import PRODUCERS, OnlineCheckFailed, stamped
from oncelog.torture.threads import Scheduler

if TYPE_CHECKING:  # the workload calls in here: only its type is needed
    from oncelog.torture.workload import Workload

# What the main thread does while the others flush (truncation three times as likely: the race).
CHANGES = (
    "truncate",
    "truncate",
    "truncate",
    "delete_records",
    "retention",
    "close",
    "append",
    "roll",
    "flush",
)
# What a thread of a concurrent step may meet without anything being wrong.
_EXPECTED = (TruncatedBeforeDurableError, LogClosedError, OffsetOutOfRangeError)


def concurrent_step(w: Workload, log: Log, scheduler: Scheduler, reopen: Callable[[], Log]) -> Log:
    """One concurrent step; returns the log to go on with (reopened if the step closed it)."""
    w.model.concurrent_steps += 1
    if w.rng.random() < 0.5:
        _appenders(w, log, scheduler)
        return log
    return _durability_against_change(w, log, scheduler, reopen)


def _appenders(w: Workload, log: Log, scheduler: Scheduler) -> None:
    rng = w.rng
    for pid in rng.sample(PRODUCERS, rng.randint(2, len(PRODUCERS))):
        count, durable = rng.randint(1, 3), rng.random() < 0.6

        def appender(pid: int = pid, count: int = count, durable: bool = durable) -> None:
            _append(w, log, pid, count, durable)

        scheduler.spawn(f"append-{pid}", appender)
    if rng.random() < 0.5:
        scheduler.spawn("flush", log.flush)
    if rng.random() < 0.3:
        scheduler.spawn("roll", lambda: _roll(log))
    _join(scheduler)
    check_recovery_point(log)


def _append(w: Workload, log: Log, pid: int, count: int, durable: bool) -> None:
    for _ in range(count):
        restart = pid in w.expired
        if restart:
            w.epochs[pid], w.sequences[pid] = w.restart_position(pid, w.epochs[pid])
        batch = w.batch(pid, w.epochs[pid], w.sequences[pid])
        w.model.in_flight[batch] = (w.clock.now_ms, restart)

        def send(batch: bytes = batch) -> AppendResult:
            return log.append(batch, durable=durable)

        result = w.accepted_restart(pid, send) if restart else send()
        del w.model.in_flight[batch]
        offset = result.first_offset
        if restart:
            w.model.restarted_at.add(offset)
        w.model.written[offset] = stamped(batch, offset)
        w.model.append_ms[offset] = w.clock.now_ms
        w.ack(offset, stamped(batch, offset), pid)
        w.recent[pid] = [*w.recent[pid][-4:], (batch, offset)]
        w.sequences[pid] += result.last_offset - result.first_offset + 1
        if durable:
            # Group commit acknowledges everything below the batch's end as fsynced.
            w.model.durable_end = max(w.model.durable_end, result.last_offset + 1)


def _durability_against_change(w: Workload, log: Log, scheduler: Scheduler, reopen: Callable[[], Log]) -> Log:
    rng = w.rng
    for _ in range(rng.randint(1, 3)):
        w.append(log, rng.choice(PRODUCERS))
    end = log.log_end_offset
    change = rng.choice(
        ("truncate", "truncate", "delete_records", "retention", "close", "append", "roll", "flush")
    )

    def wait() -> None:
        log.wait_durable(end)
        w.model.durable_end = max(w.model.durable_end, end)

    scheduler.spawn("wait-durable", wait)
    if rng.random() < 0.4:
        scheduler.spawn("flush", log.flush)
    if rng.random() < 0.3 and change not in ("delete_records", "retention"):
        scheduler.spawn("roll", lambda: _roll(log))  # retention's expectation counts sealed segments
    # The threads get going, often until one is inside an I/O call (a flush's fsync):
    # the moment a change of the log must not slip into.
    inside = scheduler.until_inside_io(rng.choice((0, 2, 8, 40)))
    if inside and change in ("truncate", "delete_records", "retention", "close"):
        w.model.raced_flushes += 1
    closed = False
    if change == "truncate":
        w.truncate(log)
    elif change == "delete_records":
        w.delete_records(log)
    elif change == "retention":
        w.retention(log)
    elif change == "close":
        log.close()
        w.model.durable_end = w.model.point_floor = log.log_end_offset  # close flushes and commits
        closed = True
    elif change == "append":
        w.append(log, rng.choice(PRODUCERS))
    elif change == "roll":
        log.roll()
    else:
        log.flush()
        w.model.durable_end = log.log_end_offset
    _join(scheduler)
    if closed:
        log = reopen()
    check_recovery_point(log)
    return log


def _roll(log: Log) -> None:
    log.roll()


def _join(scheduler: Scheduler) -> None:
    """Wait for the step's threads; re-raise what ends the run, refuse anything unexpected."""
    errors = [(name, error) for name, error in scheduler.join_spawned() if error is not None]
    for _, error in errors:
        if isinstance(error, (SimulatedCrash, LogFailedError, OnlineCheckFailed)):
            raise error  # the run ends as for the main thread's own crash or failed write
    for name, error in errors:
        if not isinstance(error, _EXPECTED):
            raise OnlineCheckFailed(
                "no unexpected error in a concurrent step", f"thread {name}: {type(error).__name__}: {error}"
            )


def check_recovery_point(log: Log) -> None:
    if log.recovery_point > log.log_end_offset:
        raise OnlineCheckFailed(
            "the recovery point never passes the log end",
            f"recovery point {log.recovery_point}, log end {log.log_end_offset}",
        )
