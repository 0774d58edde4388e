"""Waiting for a directory lock another process holds for a short while.

Writers that open a partition or the root's producer ids briefly (a Spark task
appending, leasing a PID) hold their lock for milliseconds to seconds; whoever
meets it waits, backing off, for a bounded time rather than failing at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from oncelog.errors import LockTimeoutError, LogDirLockedError

T = TypeVar("T")
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.2  # the holder is appending or leasing: worth checking a few times a second


def wait_while_locked(what: str, attempt: Callable[[], T], timeout_s: float) -> T:
    """`attempt()`, retried while it raises LogDirLockedError, for up to `timeout_s`.

    Raises LockTimeoutError (a LogDirLockedError) naming `what` once the time is up.
    """
    deadline = time.monotonic() + timeout_s
    pause_s = FIRST_PAUSE_S
    while True:
        try:
            return attempt()
        except LogDirLockedError as exc:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise LockTimeoutError(f"{what}: {exc} (still locked after {timeout_s:g} s)") from None
            time.sleep(min(pause_s, left_s))
            pause_s = min(pause_s * 2, MAX_PAUSE_S)
