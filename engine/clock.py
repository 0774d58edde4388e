"""The engine's clock: what producer expiry and log-append times are measured on.

A Log reads time from an injected clock (the wall clock by default, a pinned one in
tests). Wall clocks step backwards (NTP, a VM resumed), and expiry must never run
on a time earlier than one it already used, or a producer it kept could look idle
again, or an expired one fresh. MonotonicClock returns the largest value seen.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class MonotonicClock:
    """`clock`, never going backwards: each call returns the largest value read so far."""

    __slots__ = ("_clock", "_high_ms")

    def __init__(self, clock: Clock):
        first: object = clock()  # typed int, but a caller's clock may return anything
        if isinstance(first, bool) or not isinstance(first, numbers.Integral):
            # A float would reach the producer table's integer fields after a batch is
            # written, half-changing its state: refuse it before anything is.
            raise TypeError(f"the clock must return integer milliseconds, got {first!r}")
        self._clock: Clock = clock
        self._high_ms: int = int(first)

    def __call__(self) -> int:
        now = self._clock()
        # A racing caller can lower _high_ms by the few ms two threads read apart; both
        # callers hold the Log's lock on every path that uses the time for expiry.
        if now > self._high_ms:
            self._high_ms = now
            return now
        return self._high_ms

    @property
    def high_ms(self) -> int:
        """The largest time read so far (without reading the clock again)."""
        return self._high_ms


class MonotonicWallClock(MonotonicClock):
    """The wall clock, never going backwards; reads time.time itself (it is on every
    idempotent append: one Python call fewer than wrapping wall_clock_ms).

    Its high mark lives in `cell`, 8 bytes the compiled append shares: it reads the wall
    clock in C with the same arithmetic and keeps the same mark, so the two never
    disagree about what time it is (a Python call per idempotent append was a third of
    its cost)."""

    __slots__ = ("cell",)

    def __init__(self) -> None:
        self._clock = wall_clock_ms
        self.cell = memoryview(bytearray(8)).cast("q")
        self.cell[0] = wall_clock_ms()

    def __call__(self, _time: Callable[[], float] = time.time) -> int:
        cell = self.cell
        now = int(_time() * 1000)
        if now > cell[0]:
            cell[0] = now
            return now
        high: int = cell[0]
        return high

    @property
    def high_ms(self) -> int:
        high: int = self.cell[0]
        return high


def engine_clock(clock: Clock | None) -> MonotonicClock:
    """The Log's clock: `clock`, or the wall clock, never going backwards."""
    return MonotonicWallClock() if clock is None else MonotonicClock(clock)
