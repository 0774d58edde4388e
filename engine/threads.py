"""The locks a Log synchronises with, made through one seam.

Production code gets the `threading` primitives. The crash torture harness swaps in
cooperative ones (engine/torture/threads.py) for the length of a run, so that
several threads driving one Log on the fault-injecting twin interleave in an order
chosen by a seed, and every interleaving it finds replays exactly. Only locks made
after the swap are cooperative: a Log opened inside the run uses them throughout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Protocol


class Lock(Protocol):
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None, /
    ) -> None: ...


class Condition(Lock, Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...

    def notify_all(self) -> None: ...


class Primitives(Protocol):
    def lock(self) -> Lock: ...

    def rlock(self) -> Lock: ...

    def condition(self) -> Condition: ...


class ThreadingPrimitives:
    def lock(self) -> Lock:
        return threading.Lock()

    def rlock(self) -> Lock:
        return threading.RLock()

    def condition(self) -> Condition:
        return threading.Condition(threading.Lock())


_primitives: Primitives = ThreadingPrimitives()


def lock() -> Lock:
    return _primitives.lock()


def rlock() -> Lock:
    return _primitives.rlock()


def condition() -> Condition:
    return _primitives.condition()


@contextlib.contextmanager
def using(primitives: Primitives) -> Iterator[None]:
    """Make locks with `primitives` until the block ends (the torture harness's scheduler)."""
    global _primitives
    previous, _primitives = _primitives, primitives
    try:
        yield
    finally:
        _primitives = previous
