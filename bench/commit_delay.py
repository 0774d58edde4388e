"""Group commit with and without the leader's delay: `python bench/commit_delay.py [DIR]`.

Durable appends of 170 B batches by 16 threads and by 1 thread on one log (the bench's
durable step), with `oncelog.group_commit.COMMIT_DELAY_S` at 0, 100 and 200 µs in turn,
4 rounds, one process; prints each delay's medians and the spread of the 16/1 ratio.
DIR (default: the current directory) should be on the disk measured.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

from oncelog import Log, group_commit
from oncelog.bench.harness import _durable_rate, batch_of_size, durable_append

DELAYS_S = (0.0, 100e-6, 200e-6)
ROUNDS = 4
WINDOW_S = 1.0


def main(directory: str) -> None:
    batch = batch_of_size(170)
    rates: dict[float, list[tuple[float, float]]] = {delay: [] for delay in DELAYS_S}
    default = group_commit.COMMIT_DELAY_S
    try:
        with (
            tempfile.TemporaryDirectory(dir=directory) as scratch,
            Log.open(os.path.join(scratch, "log")) as log,
        ):
            append, _ = durable_append(log)
            for _ in range(ROUNDS):
                for delay in DELAYS_S:
                    group_commit.COMMIT_DELAY_S = delay
                    rates[delay].append(
                        (
                            _durable_rate(append, batch, 16, WINDOW_S),
                            _durable_rate(append, batch, 1, WINDOW_S),
                        )
                    )
    finally:
        group_commit.COMMIT_DELAY_S = default
    for delay, samples in rates.items():
        ratios = [many / one for many, one in samples]
        print(
            f"delay {delay * 1e6:4.0f} us: 16 threads {statistics.median(m for m, _ in samples):7.0f}/s, "
            f"1 thread {statistics.median(o for _, o in samples):6.0f}/s, "
            f"ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
