"""GroupCommit: appenders waiting for durability share one flush (Kafka's group commit).

One waiter at a time is the leader: it runs the flush (the log's fsyncs and the
recovery point's commit) with this object's lock released, so other threads
keep appending and queue up behind it; the next leader's flush covers them all.
N threads appending durably thus pay about one fsync per round, not one each.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from itertools import islice

from oncelog import threads
from oncelog.errors import LogClosedError, TruncatedBeforeDurableError

# Cuts remembered for waiters; one that appended before older cuts is refused (retriable).
CUT_HISTORY = 64
# How long a leader whose sync others wait on lets further appenders join it.
COMMIT_DELAY_S = 100e-6


class GroupCommit:
    def __init__(self, durable_end_offset: int):
        # Offsets below this are fsynced (and acknowledged as durable to waiters).
        self.durable_end_offset = durable_end_offset
        self._cond = threads.condition()
        self._flush_running = False
        self._closing = False
        # How many times the log was cut back (truncated): an append that waits to be
        # durable notes it first, and a cut since then may have removed its batch.
        self.cuts = 0
        # The end offsets of the latest cuts, newest last.
        self._cut_ends: deque[int] = deque(maxlen=CUT_HISTORY)
        self._waiting = 0  # callers inside wait(): more than the leader means concurrent appenders
        self._waiting_at_last_sync = 0  # as the last sync ended: its appenders append again soon

    def wait(self, end_offset: int, flush: Callable[[], None], what: str, *, cuts: int | None = None) -> None:
        """Return once every offset below `end_offset` is durable, running `flush` if no one is.

        `flush` must call `mark_durable` with what it made durable; its errors
        reach the waiter that ran it, and the next waiter runs it again (a failed
        log refuses, so each waiter sees the failure). With `cuts` (this object's
        `cuts`, read before the waiter's batch was appended), a cut since raises
        TruncatedBeforeDurableError: the offsets may now hold other batches.
        """
        with self._cond:
            self._waiting += 1
            try:
                self._wait_locked(end_offset, flush, what, cuts)
            finally:
                self._waiting -= 1

    def _wait_locked(self, end_offset: int, flush: Callable[[], None], what: str, cuts: int | None) -> None:
        while True:
            # Checked before the durable end: after a cut, later batches at the same
            # offsets may be durable, and they are not the waiter's.
            if cuts is not None and self._cut_below(cuts, end_offset):
                raise TruncatedBeforeDurableError(
                    f"{what} was truncated before offset {end_offset - 1} was fsynced; append it again"
                )
            if self.durable_end_offset >= end_offset:
                return
            if self._closing:
                raise LogClosedError(f"{what} closed before offset {end_offset - 1} was fsynced")
            if self._flush_running:
                self._cond.wait()
                continue
            self._flush_running = True
            concurrent = self._waiting > 1 or self._waiting_at_last_sync > 1
            self._cond.release()
            try:
                if concurrent and COMMIT_DELAY_S > 0:
                    # Others wait on this sync, or did on the last: a moment for the appenders
                    # it woke to append again, so that one sync takes them all (PostgreSQL's
                    # commit_delay; measured: 16 threads 28-42% more appends, bench/README).
                    # An appender alone waits for nobody.
                    time.sleep(COMMIT_DELAY_S)
                flush()
            finally:
                self._cond.acquire()
                self._flush_running = False
                self._waiting_at_last_sync = self._waiting
                self._cond.notify_all()

    def _cut_below(self, cuts: int, end_offset: int) -> bool:
        """Whether a cut since the waiter noted `cuts` went below `end_offset` (lock held)."""
        since = self.cuts - cuts
        assert since >= 0, (self.cuts, cuts)
        if since == 0:
            return False
        if since > len(self._cut_ends):
            return True  # older than the history: it may have been cut
        return min(islice(reversed(self._cut_ends), since)) < end_offset

    def mark_durable(self, end_offset: int) -> None:
        with self._cond:
            if end_offset > self.durable_end_offset:
                self.durable_end_offset = end_offset
                self._cond.notify_all()

    def truncated(self, end_offset: int) -> None:
        """The log was cut back to `end_offset`: offsets from there on are not durable any more."""
        with self._cond:
            self.durable_end_offset = min(self.durable_end_offset, end_offset)
            self.cuts += 1
            self._cut_ends.append(end_offset)
            self._cond.notify_all()  # waiters whose batches went learn it now

    def begin_close(self) -> bool:
        """Wait out a running leader (it fsyncs files about to close); False if already closing."""
        with self._cond:
            while self._flush_running and not self._closing:
                self._cond.wait()
            if self._closing:
                return False
            self._closing = True
            self._flush_running = True  # no new leader from here on
            return True

    def end_close(self, *, closed: bool = True) -> None:
        """The close is over: the log closed, or (not `closed`) it never began, and may close later."""
        with self._cond:
            if not closed:
                self._closing = False
                self._flush_running = False  # (begin_close's: leaders may run again)
            self._cond.notify_all()  # waiters wake to find the log closed, or open still
