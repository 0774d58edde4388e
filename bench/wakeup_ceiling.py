"""How many thread wakeups Python threads get: `python bench/wakeup_ceiling.py`.

The ceiling under group commit with no engine at all: 16 threads each wait on one
condition, a 17th plays the leader (sleeps a sync's 90 µs, then `notify_all`), and every
woken thread counts one "append" and waits again. 1 thread is the same loop alone.
Prints wakeups per second for both, 3 rounds each, one process. A durable append through
the engine does this plus the append and the flush's bookkeeping, so 16 threads' durable
appends cannot pass the 16-thread figure here.

On Linux it then measures the primitive a compiled wait would use instead of a Python
`Condition`: the waiters sleep in the futex system call on one 32-bit word with the GIL
released (through ctypes), and the leader wakes them all with one call. What is left is
each woken thread taking the GIL in turn, which no primitive outside the interpreter
removes.
"""

from __future__ import annotations

import ctypes
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

SYNC_S = 90e-6  # about one fdatasync of a reserved segment block on the bench's disk
WINDOW_S = 2.0
ROUNDS = 3


def wakeups_per_s(threads: int) -> float:
    cond = threading.Condition(threading.Lock())
    generation = [0]
    stop = threading.Event()
    counts = [0] * threads

    def waiter(n: int) -> None:
        while not stop.is_set():
            with cond:
                seen = generation[0]
                counts[n] += 1
                while generation[0] == seen and not stop.is_set():
                    cond.wait()

    def wake_all() -> None:
        with cond:
            generation[0] += 1
            cond.notify_all()

    return _wakeups_per_s(waiter, wake_all, stop, counts)


def _wakeups_per_s(
    waiter: Callable[[int], None], wake_all: Callable[[], None], stop: threading.Event, counts: list[int]
) -> float:
    """Run `len(counts)` waiters and a leader waking them all every SYNC_S for WINDOW_S."""
    threads = len(counts)

    def leader() -> None:
        while not stop.is_set():
            time.sleep(SYNC_S)
            wake_all()

    workers = [threading.Thread(target=waiter, args=(n,)) for n in range(threads)]
    workers.append(threading.Thread(target=leader))
    for thread in workers:
        thread.start()
    started = time.perf_counter()
    time.sleep(WINDOW_S)
    stop.set()
    elapsed_s = time.perf_counter() - started
    wake_all()
    for thread in workers:
        thread.join()
    return sum(counts) / elapsed_s


_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 0 | 128, 1 | 128


class _Timespec(ctypes.Structure):
    _fields_ = [("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long)]


def futex_wakeups_per_s(threads: int) -> float:
    syscall = ctypes.CDLL(None, use_errno=True).syscall  # a CDLL call releases the GIL
    syscall.restype = ctypes.c_long
    word = np.zeros(1, np.int32)
    address = ctypes.c_void_p(word.ctypes.data)
    timeout = ctypes.byref(_Timespec(0, 50_000_000))
    stop = threading.Event()
    counts = [0] * threads

    def wake_all() -> None:
        word[0] += 1
        syscall(_SYS_FUTEX, address, _FUTEX_WAKE_PRIVATE, ctypes.c_int(1 << 30), None, None, 0)

    def waiter(n: int) -> None:
        while not stop.is_set():
            seen = int(word[0])
            counts[n] += 1
            while int(word[0]) == seen and not stop.is_set():
                syscall(_SYS_FUTEX, address, _FUTEX_WAIT_PRIVATE, ctypes.c_int(seen), timeout, None, 0)

    return _wakeups_per_s(waiter, wake_all, stop, counts)


def main() -> None:
    kinds: list[tuple[str, Callable[[int], float]]] = [("threading.Condition", wakeups_per_s)]
    if sys.platform == "linux" and platform.machine() == "x86_64":  # (the futex call number)
        kinds.append(("futex, GIL released", futex_wakeups_per_s))
    for name, measure in kinds:
        for threads in (16, 1):
            rates = [measure(threads) for _ in range(ROUNDS)]
            print(
                f"{name:20} {threads:2d} threads: {statistics.median(rates):9.0f} wakeups/s "
                f"(min {min(rates):.0f}, max {max(rates):.0f})"
            )


if __name__ == "__main__":
    main()
