"""What one durable append's syncs cost here: `python bench/sync_costs.py [DIR]`.

Milliseconds per 170-byte write followed by a sync, median and min-max of 5 rounds of
400, for: a `pwrite` into space reserved with `posix_fallocate` + `fdatasync` (a
durable append's segment sync); the same into space already written; the reference's
`O_APPEND` `write` + `fsync`; a 4 KiB slot rewritten in place + `fdatasync` (what a
recovery point kept in a file of its own would cost); and a segment sync followed by
such a slot sync. DIR (default: the current directory) should be on the disk measured.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

ROUNDS, CALLS = 5, 400
BATCH = bytes(170)
SLOT = bytes(4096)


def _ms_per_call(step: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for n in range(CALLS):
        step(n)
    return (time.perf_counter() - started) / CALLS * 1e3


def main(directory: str) -> None:
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        reserved = os.open(os.path.join(scratch, "reserved"), os.O_RDWR | os.O_CREAT)
        os.posix_fallocate(reserved, 0, 1 << 24)
        written = os.open(os.path.join(scratch, "written"), os.O_RDWR | os.O_CREAT)
        os.write(written, bytes(1 << 24))
        os.fsync(written)
        appended = os.open(os.path.join(scratch, "appended"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        slot = os.open(os.path.join(scratch, "slot"), os.O_RDWR | os.O_CREAT)
        os.write(slot, bytes(8192))
        os.fsync(slot)
        at = [0]

        def next_position() -> int:
            at[0] += len(BATCH)
            return at[0]

        steps: dict[str, Callable[[int], object]] = {
            "pwrite into reserved space + fdatasync": lambda n: (
                os.pwrite(reserved, BATCH, next_position()),
                os.fdatasync(reserved),
            ),
            "pwrite into written space + fdatasync": lambda n: (
                os.pwrite(written, BATCH, next_position()),
                os.fdatasync(written),
            ),
            "O_APPEND write + fsync (the reference)": lambda n: (
                os.write(appended, BATCH),
                os.fsync(appended),
            ),
            "4 KiB slot rewritten + fdatasync": lambda n: (
                os.pwrite(slot, SLOT, n % 2 * 4096),
                os.fdatasync(slot),
            ),
            "segment sync, then slot sync": lambda n: (
                os.pwrite(reserved, BATCH, next_position()),
                os.fdatasync(reserved),
                os.pwrite(slot, SLOT, n % 2 * 4096),
                os.fdatasync(slot),
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(ROUNDS):
            for name, step in steps.items():
                times[name].append(_ms_per_call(step))
        for name, samples in times.items():
            print(f"{name:42s} {statistics.median(samples):.3f} ms ({min(samples):.3f}-{max(samples):.3f})")
        for fd in (reserved, written, appended, slot):
            os.close(fd)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
