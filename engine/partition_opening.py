"""What opening a root's partitions needs besides the loader: their locks, the pool that
opens them and the opens in flight (which Ctrl-C stops), and the garbage collector
paused meanwhile; and the pool that closes them.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from oncelog.layout import TopicPartition
from oncelog.storage.fs import DirLock


class OpensInFlight:
    """The partition opens running in any thread, so that an interrupted open of the root
    waits for exactly them (their logs must be among those it closes) and starts no more."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._stopped = False

    def run(self, open_one: Callable[[TopicPartition], None], tp: TopicPartition) -> bool:
        """Open `tp` unless stopped; whether it ran (its error, if any, is raised)."""
        with self._changed:
            if self._stopped:
                return False
            self._running += 1
        try:
            open_one(tp)
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()
        return True

    def stop_and_wait(self) -> None:
        """Start no more opens, and return once those running have ended, whatever Ctrl-Cs
        come meanwhile (the last is raised then): an open left running would finish after
        the caller closed what it had, and its log would stay open."""
        interrupted: KeyboardInterrupt | None = None
        while True:
            try:
                with self._changed:
                    self._stopped = True
                    while self._running:
                        self._changed.wait()
                break
            except KeyboardInterrupt as again:
                interrupted = again
        if interrupted is not None:
            raise interrupted


def open_partitions(
    threads: int,
    partitions: list[TopicPartition],
    clean: Mapping[TopicPartition, object],
    open_one: Callable[[TopicPartition], None],
    failures: dict[TopicPartition, BaseException],
) -> None:
    """Run `open_one` for every partition on a pool of `threads`, each failure into
    `failures`; `clean` tells which partitions had a clean-shutdown marker.

    An unclean open waits on fsyncs and commits, so those go to the pool one each. A
    clean one is Python throughout (the GIL): threads only took turns, at a cost (8
    threads took 1.4 s for 1,000 where one took 0.8 s), so they all go in turn on one
    of the pool's threads, beside the unclean ones. Interrupted (Ctrl-C): no more opens
    start, and the running ones finish so that their logs are among those closed.
    """
    opens = OpensInFlight()

    def open_in_turn(tps: list[TopicPartition]) -> dict[TopicPartition, BaseException]:
        errors: dict[TopicPartition, BaseException] = {}
        for tp in tps:
            try:
                if not opens.run(open_one, tp):
                    break  # interrupted: no more opens start
            except BaseException as exc:  # as a future would: every partition is tried
                errors[tp] = exc
        return errors

    pool = ThreadPoolExecutor(threads, thread_name_prefix="oncelog-recovery")
    try:
        in_turn = pool.submit(open_in_turn, [tp for tp in partitions if clean[tp]])
        futures = {tp: pool.submit(opens.run, open_one, tp) for tp in partitions if not clean[tp]}
        for tp, future in futures.items():
            open_error = future.exception()
            if open_error is not None:
                failures[tp] = open_error
        failures.update(in_turn.result())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        # Not the pool's join: a Ctrl-C inside `submit` (a worker starting) leaves it
        # a thread it does not know, which may be opening a partition right now.
        opens.stop_and_wait()


class Closable(Protocol):
    def close(self) -> None: ...


def close_partitions(
    threads: int, logs: Mapping[TopicPartition, Closable]
) -> dict[TopicPartition, BaseException]:
    """Close every log on a pool of `threads` (each close fsyncs; the pool overlaps them as
    at open), whatever some of the closes raise; their errors. A Ctrl-C while they are
    handed over still closes every log: those not yet handed over close inline, after
    the pool's, or they would keep their files open and miss their clean markers."""
    errors: dict[TopicPartition, BaseException] = {}
    unsubmitted = dict(logs)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="oncelog-close") as pool:
            futures = {}
            for tp, log in logs.items():
                futures[tp] = pool.submit(log.close)
                del unsubmitted[tp]  # (interrupted just before this: a second close returns at once)
            for tp, future in futures.items():
                exc = future.exception()
                if exc is not None:
                    errors[tp] = exc
    finally:
        again: KeyboardInterrupt | None = None
        for tp, log in unsubmitted.items():
            for _attempt in range(2):
                try:
                    log.close()
                    break
                except KeyboardInterrupt as interrupted:
                    # One more Ctrl-C: this log's close once more (a close under way returns
                    # at once), and the rest still close; the Ctrl-C is raised after them.
                    again = interrupted
                except Exception as exc:
                    errors[tp] = exc
                    break
        if again is not None:
            raise again
    return errors


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """No cyclic garbage collection while partitions load: a load makes thousands of objects
    that all live on, so collections would only walk them again and again (measured: a
    fifth of a clean open of 1,000 partitions).

    Afterwards they go straight to the oldest generation (a freeze and an unfreeze: two
    list splices), not through the young ones: the first young collection after the
    load would otherwise walk all of them (85 a partition; 0.50-0.56 s of an open of
    10,000). Only when nothing was frozen already: an unfreeze would release objects
    the process froze itself (before a fork, say). Other young objects move up with
    them, collected at the next full collection instead of a young one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def release_after_failure(failure: BaseException, releases: Sequence[Callable[[], object]]) -> None:
    """Run every release; one that fails is noted on `failure` and the rest still run."""
    for release in releases:
        try:
            release()
        except Exception as exc:
            failure.add_note(f"releasing after the failure also failed: {type(exc).__name__}: {exc}")


class PartitionLock:
    """A partition's directory lock, handed to its Log (which releases it at close), that
    the manager can keep back so the directory stays locked past the close (delete_log)."""

    def __init__(self, inner: DirLock):
        self._inner = inner
        self._mutex = threading.Lock()
        self._kept = False
        self._released = False

    def release(self) -> None:
        with self._mutex:
            if self._kept or self._released:
                return
            self._released = True
        self._inner.release()

    def keep(self) -> DirLock | None:
        """The lock, now the caller's to release (the Log's release leaves it held);
        None if the Log already released it."""
        with self._mutex:
            if self._released:
                return None
            self._kept = True
            return self._inner
