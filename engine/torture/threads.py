"""Deterministic threads for the torture harness: several threads drive one Log, in a seeded order.

The Log makes its locks through oncelog.threads; for a torture run the Scheduler
supplies cooperative ones (`threads.using(scheduler)`). Simulated threads are real
Python threads, but exactly one holds the baton at a time, and the baton moves only
at yield points: every I/O call of the fault-injecting twin (`FaultFileSystem.on_io`),
every lock acquire, every condition wait. Where it moves is drawn from
the run's seeded random stream, so an interleaving the harness finds replays exactly
from its seed. A thread that would block on a lock another holds gives up the baton
and is not chosen again until the lock is free; if no thread can run, that is a
deadlock, and every simulated thread is woken with `Deadlock`.

When the process dies (the twin's kill point, in whichever thread), no other thread
may run one more instruction of the engine: `halted` says so, and every thread raises
it at its next I/O call, switch or blocking wait. Taking a free lock and releasing
one still work after the death, so the engine's cleanup (`finally`, `with`) unwinds
as it would.

Only what a Log needs is modelled: Lock, RLock, and a Condition over a Lock with
`wait()` (no timeout) and `notify_all()`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from types import TracebackType

from oncelog.torture.model import OnlineCheckFailed


class Deadlock(OnlineCheckFailed):
    """Every simulated thread is blocked: none can ever run again."""

    def __init__(self, detail: str):
        super().__init__("no deadlock", detail)


class _SimThread:
    __slots__ = ("at_io", "blocked_on", "done", "error", "go", "name", "started", "thread")

    def __init__(self, name: str):
        self.name = name
        self.go = threading.Event()
        self.blocked_on: object | None = None  # a lock or condition, or None: runnable
        self.started = False
        self.at_io = False  # parked at an I/O call (not at a lock)
        self.done = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Scheduler:
    """Runs simulated threads one at a time and switches between them by a seeded draw."""

    def __init__(
        self,
        rng: random.Random,
        *,
        halted: Callable[[], BaseException | None] = lambda: None,
        max_switches: int = 200_000,
    ):
        self._rng = rng
        self._halted = halted
        self._mutex = threading.Lock()  # the scheduler's own state, held briefly
        self._by_ident: dict[int, _SimThread] = {}
        self._threads: list[_SimThread] = []  # in creation order: the draws are deterministic
        self._aborted: str | None = None
        self.max_switches = max_switches
        self.switches = 0

    # -- threads.Primitives ----------------------------------------------------------
    def lock(self) -> SimLock:
        return SimLock(self, reentrant=False)

    def rlock(self) -> SimLock:
        return SimLock(self, reentrant=True)

    def condition(self) -> SimCondition:
        return SimCondition(self)

    # -- threads -------------------------------------------------------------------
    def adopt_current_thread(self, name: str = "main") -> None:
        """Make the calling thread a simulated one, holding the baton (the workload's own)."""
        sim = _SimThread(name)
        sim.go.set()
        with self._mutex:
            self._by_ident[threading.get_ident()] = sim
            self._threads.append(sim)

    def spawn(self, name: str, body: Callable[[], None]) -> None:
        """Start `body` as a simulated thread; it runs when a draw first chooses it."""
        sim = _SimThread(name)

        def run() -> None:
            sim.go.wait()
            sim.started = True
            try:
                self._raise_if_halted()
                if self._aborted is None:
                    body()
            except BaseException as exc:
                sim.error = exc
            finally:
                self._finish(sim)

        thread = threading.Thread(target=run, name=f"sim-{name}", daemon=True)
        sim.thread = thread
        with self._mutex:
            self._threads.append(sim)
        thread.start()
        with self._mutex:
            assert thread.ident is not None
            self._by_ident[thread.ident] = sim

    def join_spawned(self) -> list[tuple[str, BaseException | None]]:
        """From the adopting thread: let every spawned thread run to its end; their errors."""
        me = self._me()
        while any(not t.done for t in self._threads if t is not me):
            self.switch(blocked_on=self)  # runnable again when the last one finishes
        spawned = [t for t in self._threads if t is not me]
        for sim in spawned:
            assert sim.thread is not None
            sim.thread.join()
        with self._mutex:
            self._threads = [me]
            self._by_ident = {ident: t for ident, t in self._by_ident.items() if t is me}
        return [(t.name, t.error) for t in spawned]

    def io_point(self) -> None:
        """The yield point of an I/O call (the twin's `on_io`): the thread is parked inside one."""
        me = self._me()
        me.at_io = True
        try:
            self.switch()
        finally:
            me.at_io = False

    def until_inside_io(self, max_switches: int) -> bool:
        """From the adopting thread: hand the baton on, up to `max_switches` times, until a
        spawned thread is parked inside an I/O call (say, a flush's fsync); whether one is."""
        for _ in range(max_switches):
            if any(t.at_io for t in self._threads if not t.done):
                return True
            self.switch()
        return any(t.at_io for t in self._threads if not t.done)

    def midway(self) -> list[str]:
        """Names of the spawned threads that started and have not finished (from the baton holder)."""
        me = self._me()
        return [t.name for t in self._threads if t is not me and t.started and not t.done]

    def _finish(self, sim: _SimThread) -> None:
        with self._mutex:
            sim.done = True
            if all(t.done for t in self._threads if t.blocked_on is not self):
                for t in self._threads:
                    if t.blocked_on is self:
                        t.blocked_on = None  # the joiner: everything it waited for ended
            self._hand_over_locked(sim)

    def _me(self) -> _SimThread:
        return self._by_ident[threading.get_ident()]

    # -- switching -------------------------------------------------------------------
    def switch(self, blocked_on: object | None = None) -> None:
        """A yield point: maybe let another thread run; with `blocked_on`, wait until it frees."""
        self._raise_if_halted()
        if blocked_on is None and len(self._threads) == 1:
            return  # one thread: nobody to switch to (most of a run)
        me = self._me()
        with self._mutex:
            me.blocked_on = blocked_on
            chosen = self._hand_over_locked(me)
        if chosen is me:
            return
        me.go.wait()
        if self._aborted is not None:
            raise Deadlock(self._aborted)
        self._raise_if_halted()

    def _raise_if_halted(self) -> None:
        death = self._halted()
        if death is not None:
            raise death

    @property
    def halted(self) -> bool:
        return self._halted() is not None

    def _hand_over_locked(self, me: _SimThread) -> _SimThread | None:
        """Draw the next thread to run and give it the baton (the caller holds the mutex)."""
        runnable = [t for t in self._threads if not t.done and t.blocked_on is None]
        self.switches += 1
        if self.switches > self.max_switches and self._aborted is None:
            self._aborted = f"more than {self.max_switches} switches: a livelock"
        if not runnable or self._aborted is not None:
            if self._aborted is None:
                blocked = ", ".join(
                    f"{t.name} on {type(t.blocked_on).__name__}" for t in self._threads if not t.done
                )
                self._aborted = f"every simulated thread is blocked: {blocked}"
            for t in self._threads:
                t.go.set()  # wake everyone to fail
            if not me.done:
                raise Deadlock(self._aborted)
            return None
        chosen = runnable[self._rng.randrange(len(runnable))] if len(runnable) > 1 else runnable[0]
        if chosen is not me:
            me.go.clear()  # before the other one runs: it may hand the baton straight back
            chosen.go.set()
        return chosen

    def _wake(self, waiters: list[_SimThread]) -> None:
        with self._mutex:
            for t in waiters:
                t.blocked_on = None
        waiters.clear()


class SimLock:
    """A Lock or RLock whose contention hands the baton to another simulated thread."""

    def __init__(self, scheduler: Scheduler, *, reentrant: bool):
        self._scheduler = scheduler
        self._reentrant = reentrant
        self._owner: _SimThread | None = None
        self._count = 0
        self._waiters: list[_SimThread] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        scheduler = self._scheduler
        if not scheduler.halted:
            scheduler.switch()  # another thread may get here first
        me = scheduler._me()
        while not (self._owner is None or (self._reentrant and self._owner is me)):
            if not blocking:
                return False
            self._waiters.append(me)
            scheduler.switch(blocked_on=self)
        self._owner = me
        self._count += 1
        return True

    def release(self) -> None:
        me = self._scheduler._me()
        if self._owner is not me:
            self._scheduler._raise_if_halted()  # unwinding after the death, past a lost acquire
            raise RuntimeError("release of a lock this simulated thread does not hold")
        self._count -= 1
        if self._count == 0:
            self._owner = None
            # No yield here: the next acquire, I/O call or wait is one (thread handoffs
            # are what a run spends its time on).
            self._scheduler._wake(self._waiters)

    def _release_all(self) -> int:
        """For a condition's wait: let go entirely, whatever the depth; returns it."""
        count, self._count, self._owner = self._count, 0, None
        self._scheduler._wake(self._waiters)
        return count

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None:
        self.release()


class SimCondition:
    """threading.Condition over a SimLock: wait() hands the baton on until notify_all()."""

    def __init__(self, scheduler: Scheduler):
        self._scheduler = scheduler
        self._lock = SimLock(scheduler, reentrant=False)
        self._waiters: list[_SimThread] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            raise NotImplementedError("simulated conditions do not time out")
        me = self._scheduler._me()
        self._waiters.append(me)
        self._lock._release_all()
        self._scheduler.switch(blocked_on=self)
        self._lock.acquire()
        return True

    def notify_all(self) -> None:
        self._scheduler._wake(self._waiters)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None:
        self.release()
