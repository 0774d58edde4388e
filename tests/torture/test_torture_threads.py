"""The torture harness's deterministic threads (engine/torture/threads.py).

Simulated threads run one at a time and switch only at yield points, by a seeded
draw: the same seed gives the same interleaving, different seeds different ones; a
lock held by one thread blocks the others until it is released; a deadlock is
reported, never waited out; and a Log driven by several simulated threads behaves
as it does under real ones.
"""

from __future__ import annotations

import random

import pytest

from oncelog import threads
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.torture.faultfs import FaultFileSystem, SimulatedCrash
from oncelog.torture.threads import Deadlock, Scheduler


def interleaving(seed: int) -> list[str]:
    """Three threads each log a step at five yield points; the order they ran in."""
    scheduler = Scheduler(random.Random(seed))
    scheduler.adopt_current_thread()
    trace: list[str] = []

    def body(name: str) -> None:
        for step in range(5):
            trace.append(f"{name}{step}")
            scheduler.switch()

    for name in "abc":
        scheduler.spawn(name, lambda name=name: body(name))
    assert scheduler.join_spawned() == [("a", None), ("b", None), ("c", None)]
    return trace


def test_the_same_seed_gives_the_same_interleaving_and_others_differ() -> None:
    first = interleaving(7)
    assert interleaving(7) == first
    assert sorted(first) == sorted(f"{n}{s}" for n in "abc" for s in range(5))
    assert len({tuple(interleaving(seed)) for seed in range(10)}) > 5


def most_threads_inside_a_lock(seed: int) -> int:
    """Two threads each take a lock three times, yielding inside it; the most ever inside."""
    scheduler = Scheduler(random.Random(seed))
    scheduler.adopt_current_thread()
    lock = scheduler.lock()
    inside: list[str] = []
    overlaps: list[int] = []

    def body(name: str) -> None:
        for _ in range(3):
            with lock:
                inside.append(name)
                overlaps.append(len(inside))
                scheduler.switch()  # a yield point inside the critical section
                inside.remove(name)

    for name in "ab":
        scheduler.spawn(name, lambda name=name: body(name))
    scheduler.join_spawned()
    return max(overlaps)


def test_a_lock_keeps_its_critical_section_whole_whatever_the_interleaving() -> None:
    assert [most_threads_inside_a_lock(seed) for seed in range(20)] == [1] * 20


def test_a_deadlock_is_reported_to_every_thread_not_waited_out() -> None:
    scheduler = Scheduler(random.Random(3))
    scheduler.adopt_current_thread()
    first, second = scheduler.lock(), scheduler.lock()

    def one() -> None:
        with first:
            scheduler.switch()
            with second:
                pass

    def other() -> None:
        with second:
            scheduler.switch()
            with first:
                pass

    deadlocked = False
    for seed in range(30):  # some interleaving takes both locks in opposite orders
        scheduler = Scheduler(random.Random(seed))
        scheduler.adopt_current_thread()
        first, second = scheduler.lock(), scheduler.lock()
        scheduler.spawn("one", one)
        scheduler.spawn("other", other)
        try:
            errors = scheduler.join_spawned()
        except Deadlock as exc:
            assert exc.invariant == "no deadlock" and "blocked" in str(exc)
            deadlocked = True
            break
        assert errors == [("one", None), ("other", None)]
    assert deadlocked


def test_a_condition_wait_lets_the_notifier_run_and_wakes_on_notify_all() -> None:
    scheduler = Scheduler(random.Random(5))
    scheduler.adopt_current_thread()
    condition = scheduler.condition()
    ready: list[bool] = []
    seen: list[bool] = []

    def waiter() -> None:
        with condition:
            while not ready:
                condition.wait()
            seen.append(True)

    def notifier() -> None:
        with condition:
            ready.append(True)
            condition.notify_all()

    scheduler.spawn("waiter", waiter)
    scheduler.spawn("notifier", notifier)
    assert scheduler.join_spawned() == [("waiter", None), ("notifier", None)]
    assert seen == [True]


def test_once_the_process_dies_no_other_thread_goes_on() -> None:
    fs = FaultFileSystem(1)
    scheduler = Scheduler(random.Random(1), halted=lambda: SimulatedCrash("died") if fs.dead else None)
    scheduler.adopt_current_thread()
    progress: list[int] = []

    def counter() -> None:
        for n in range(1000):
            progress.append(n)
            scheduler.switch()

    scheduler.spawn("counter", counter)
    scheduler.switch()
    fs.kill_at(fs.io_calls + 1)
    with pytest.raises(SimulatedCrash):
        fs.open("/x", create=True)  # the process dies here, in this thread
    stopped_at = len(progress)
    with pytest.raises(SimulatedCrash):
        scheduler.join_spawned()  # the dead process's main thread stops too
    assert len(progress) == stopped_at < 1000  # not one more step after the death


def test_several_threads_appending_durably_to_one_log_replay_exactly_from_the_seed() -> None:
    def run(seed: int) -> list[tuple[str, int]]:
        fs = FaultFileSystem(seed)
        scheduler = Scheduler(random.Random(seed))
        results: list[tuple[str, int]] = []
        with threads.using(scheduler):
            scheduler.adopt_current_thread()
            fs.on_io = scheduler.io_point
            log = Log.open("/t/t-0", LogConfig(), fs=fs, clock=lambda: 1)

            def appender(name: str) -> None:
                for n in range(4):
                    batch = encode_batch([(name.encode(), b"%d" % n)], timestamp_ms=1)
                    results.append((name, log.append(batch, durable=True).first_offset))

            for name in ("a", "b", "c"):
                scheduler.spawn(name, lambda name=name: appender(name))
            assert [error for _, error in scheduler.join_spawned()] == [None, None, None]
            assert log.durable_end_offset == log.log_end_offset == 12
            log.close()
            fs.on_io = None
        return results

    first = run(11)
    assert sorted(offset for _, offset in first) == list(range(12))
    assert run(11) == first
    assert len({tuple(run(seed)) for seed in range(6)}) > 1  # the threads really interleave
