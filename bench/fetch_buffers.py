"""What a fetch's fresh read buffers cost: `python bench/fetch_buffers.py DIR`.

On a thread (as `oncelog serve`'s fetch threads read), 200 rounds of four 1 MiB preads
of one file kept alive together and then freed, as a 4-partition fetch holds its reads
until the client has taken them: ms per round and the minor page faults, first with
glibc's default thresholds, then after `keep_freed_read_buffers` (in one process, in
that order: the setting cannot be undone).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time

from oncelog.server.memory_reuse import keep_freed_read_buffers

ROUNDS = 200
READ_BYTES = 1024 * 1024 + 4096 + 61  # LogSegment.read's first chunk at max_bytes 1 MiB
PARTITIONS = 4


def rounds_ms_and_faults(fd: int) -> tuple[float, int]:
    elapsed: list[float] = []

    def work() -> None:
        started = time.perf_counter()
        for _ in range(ROUNDS):
            held = [os.pread(fd, READ_BYTES, 0) for _ in range(PARTITIONS)]
            del held
        elapsed.append((time.perf_counter() - started) / ROUNDS)

    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return elapsed[0] * 1000, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before


def main(directory: str) -> None:
    path = os.path.join(directory, "fetch-buffers.bin")
    with open(path, "wb") as file:
        file.write(os.urandom(READ_BYTES))
    fd = os.open(path, os.O_RDONLY)
    try:
        for label in ("default thresholds", "kept for reuse"):
            if label == "kept for reuse" and not keep_freed_read_buffers():
                print("not glibc: nothing to compare")
                return
            ms, faults = rounds_ms_and_faults(fd)
            print(f"{label:20} {ms:.3f} ms per {PARTITIONS} x 1 MiB, {faults / ROUNDS:.0f} page faults")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main(sys.argv[1])
