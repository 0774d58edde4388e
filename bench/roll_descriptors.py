"""Rolls until something runs out: descriptors and mappings a running Log keeps per segment.

Run as `python bench/roll_descriptors.py [LIMIT] [ROLLS]` (defaults 512 and 100,000): lowers
the soft open-files limit to LIMIT, then appends one batch and rolls, ROLLS times, on a log
in /dev/shm (or the temporary directory). Prints the descriptors and the mappings of the
log's files held every 10,000 rolls, and the roll that failed, if one did. Issue 28's
figure: the 125th roll failed with EMFILE before the segment file cache.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile


def mappings(directory: str) -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if directory in line)


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    rolls = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from oncelog import Log, encode_batch  # after the limit: the file cache sizes itself from it

    where = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    directory = tempfile.mkdtemp(dir=where, prefix="oncelog-rolls-")
    try:
        with Log.open(os.path.join(directory, "t-0")) as log:
            for n in range(rolls):
                try:
                    log.append(encode_batch([(b"k", b"%d" % n)], timestamp_ms=1_700_000_000_000))
                    log.roll()
                except Exception as exc:
                    print(f"roll {n + 1} failed: {type(exc).__name__}: {exc}")
                    return
                if (n + 1) % 10_000 == 0:
                    fds = len(os.listdir("/proc/self/fd"))
                    print(
                        f"{n + 1:>7,} rolls: {fds} descriptors, {mappings(directory)} segment-file mappings"
                    )
        print(f"{rolls:,} rolls under a limit of {limit}: none failed")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
