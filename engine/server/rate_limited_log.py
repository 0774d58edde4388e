"""Warnings that a client can repeat at will, logged once a minute per subject with a count.

A client decides how often some warnings happen: a topic whose creation fails is
warned about on every Metadata request that names it (librdkafka asks every few
seconds for each topic it knows, so 60 such topics made 700 lines), and a client
opening connections past its limit gets a line for each. Both say nothing new after
the first line, and a flood of them hides the lines that do.

RateLimitedLog keeps one window per key (a topic, a client address, with what
happened to it): the first warning of a window is logged, the rest are counted, and
the first warning after the window says how many were not logged. A count is
reported only when its key warns again, so the count of a flood that stops is lost.
Windows are kept for at most `max_keys` keys (the oldest are forgotten first), so
a client inventing names cannot grow the table without bound. Event loop only: no
locking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from typing import Final

from oncelog.clock import Clock

INTERVAL_MS: Final = 60_000
MAX_KEYS: Final = 4096


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RateLimitedLog:
    """At most one line per key per `interval_ms`; what was held back is counted in the next line."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_ms: int = INTERVAL_MS,
        max_keys: int = MAX_KEYS,
        clock: Clock = _monotonic_ms,
    ):
        if interval_ms <= 0 or max_keys <= 0:
            raise ValueError(f"interval_ms and max_keys must be positive, got {interval_ms}, {max_keys}")
        self._logger = logger
        self._interval_ms = interval_ms
        self._max_keys = max_keys
        self._clock = clock
        # key -> [the time its window started, warnings held back in it]; oldest window first.
        self._windows: dict[Hashable, list[int]] = {}

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        """Log `message % args` at WARNING unless `key` was logged within the interval; whether it was."""
        return self.log(logging.WARNING, key, message, *args)

    def log(self, level: int, key: Hashable, message: str, *args: object) -> bool:
        now_ms = self._clock()
        window = self._windows.get(key)
        if window is not None and now_ms - window[0] < self._interval_ms:
            window[1] += 1
            return False
        held_back = window[1] if window is not None else 0
        self._open_window(key, now_ms)
        if held_back:
            message += " (%d more like this since the last such line, not logged)"
            args = (*args, held_back)
        self._logger.log(level, message, *args)
        return True

    def _open_window(self, key: Hashable, now_ms: int) -> None:
        self._windows.pop(key, None)  # re-inserted last: the dict stays oldest window first
        while self._windows:
            oldest_key, (started_ms, _) = next(iter(self._windows.items()))
            if now_ms - started_ms < self._interval_ms and len(self._windows) < self._max_keys:
                break
            del self._windows[oldest_key]  # expired, or the table is full
        self._windows[key] = [now_ms, 0]
