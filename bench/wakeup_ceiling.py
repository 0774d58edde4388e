"""How many thread wakeups a Python `threading.Condition` gives: `python bench/wakeup_ceiling.py`.

The ceiling under group commit with no engine at all: 16 threads each wait on one
condition, a 17th plays the leader (sleeps a sync's 90 µs, then `notify_all`), and every
woken thread counts one "append" and waits again. 1 thread is the same loop alone.
Prints wakeups per second for both, 3 rounds each, one process. A durable append through
the engine does this plus the append and the flush's bookkeeping, so 16 threads' durable
appends cannot pass the 16-thread figure here.
"""

from __future__ import annotations

import statistics
import threading
import time

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

    def leader() -> None:
        while not stop.is_set():
            time.sleep(SYNC_S)
            with cond:
                generation[0] += 1
                cond.notify_all()

    workers = [threading.Thread(target=waiter, args=(n,)) for n in range(threads)]
    workers.append(threading.Thread(target=leader))
    for thread in workers:
        thread.start()
    started = time.perf_counter()
    time.sleep(WINDOW_S)
    stop.set()
    elapsed_s = time.perf_counter() - started
    with cond:
        generation[0] += 1
        cond.notify_all()
    for thread in workers:
        thread.join()
    return sum(counts) / elapsed_s


def main() -> None:
    for threads in (16, 1):
        rates = [wakeups_per_s(threads) for _ in range(ROUNDS)]
        print(
            f"{threads:2d} threads: {statistics.median(rates):9.0f} wakeups/s "
            f"(min {min(rates):.0f}, max {max(rates):.0f})"
        )


if __name__ == "__main__":
    main()
