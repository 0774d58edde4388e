"""What a 16 KiB append costs beside its write: `python bench/append_16k.py [DIR] [ROUNDS]`.

Two measurements, in alternating rounds in one process (median, and min-max over rounds):

- the write: one `os.write` per 16 KiB batch appending to a file (the bench's reference)
  against one `os.pwrite` per batch into space reserved ahead with posix_fallocate (what
  the engine does since issue 30): a write into allocated blocks skips the filesystem's
  delayed allocation and the file-size update;
- the CRC-32C of the batch: the compiled append's (`oncelog._append.crc32c`, which folds
  with carry-less multiplies on 512-bit registers where the CPU has AVX-512 VPCLMULQDQ,
  on 256-bit ones where it has VPCLMULQDQ with AVX2 only) against the crc32c package.

Each write round starts after an untimed sync, as the bench's append rows do.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import crc32c

from oncelog import _append

BATCH_BYTES = 16 * 1024
WRITES = 4096
CRC_CALLS = 20_000


def _spread(samples: list[float], per: int) -> str:
    us = [s / per * 1e6 for s in samples]
    return f"{statistics.median(us):.2f} us ({min(us):.2f}-{max(us):.2f})"


def main(directory: str, rounds: int) -> None:
    batch = os.urandom(BATCH_BYTES)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        appending = os.open(os.path.join(scratch, "append"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        reserved = os.open(os.path.join(scratch, "reserved"), os.O_WRONLY | os.O_CREAT, 0o644)
        position = 0
        times: dict[str, list[float]] = {"write() appending": [], "pwrite() into reserved space": []}
        for _ in range(rounds + 1):  # the first round warms up
            os.sync()
            started = time.perf_counter()
            for _ in range(WRITES):
                os.write(appending, batch)
            times["write() appending"].append(time.perf_counter() - started)
            os.posix_fallocate(
                reserved, position, WRITES * BATCH_BYTES
            )  # untimed, as the engine's is amortized
            os.sync()
            started = time.perf_counter()
            for _ in range(WRITES):
                os.pwrite(reserved, batch, position)
                position += BATCH_BYTES
            times["pwrite() into reserved space"].append(time.perf_counter() - started)
        os.close(appending)
        os.close(reserved)
    for name, samples in times.items():
        print(f"16 KiB {name:30s} {_spread(samples[1:], WRITES)}")
    crcs: dict[str, list[float]] = {"oncelog._append.crc32c": [], "crc32c package": []}
    for _ in range(rounds):
        for name, function in (("oncelog._append.crc32c", _append.crc32c), ("crc32c package", crc32c.crc32c)):
            started = time.perf_counter()
            for _ in range(CRC_CALLS):
                function(batch)
            crcs[name].append(time.perf_counter() - started)
    paths = _append.crc32c_by_each_path(batch)
    widths = {"512-bit": paths["folded"], "256-bit": paths["folded256"]}
    folded = next((width for width, crc in widths.items() if crc is not None), "none")
    for name, samples in crcs.items():
        print(f"CRC-32C of 16 KiB, {name:23s} {_spread(samples, CRC_CALLS)}")
    print(f"folding taken: {folded}; load average {os.getloadavg()[0]:.2f}; {rounds} rounds")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir(),
        int(sys.argv[2]) if len(sys.argv) > 2 else 7,
    )
