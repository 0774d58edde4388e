"""The child process of test_full_disk: a LogManager filling a small filesystem.

Run as `python full_disk_child.py ROOT FILLER`. Eight partitions take appends in
turn while a filler file grows beside them in 32 KiB steps until the filesystem is
full; appending goes on until every partition has failed, then a ninth partition is
created on the full disk. A SIGBUS would kill this process (exit status -7 to the
parent); instead it prints, as JSON, every acknowledged batch and every error seen,
and exits 0.
"""

from __future__ import annotations

import errno
import hashlib
import json
import sys

from oncelog.config import LogConfig
from oncelog.errors import OncelogError
from oncelog.log_manager import LogManager
from oncelog.segments.batch import encode_batch

# Small segments (rolls: snapshots and recovery point commits), an index entry per
# batch (index growth): every way an append can need more disk happens often.
CONFIG = LogConfig(segment_bytes=128 * 1024, index_interval_bytes=0, segment_index_bytes=64 * 1024)
PARTITIONS = 8
FILLER_STEP_BYTES = 32 * 1024
MAX_ROUNDS = 20_000
T0 = 1_700_000_000_000


def batch(partition: int, n: int) -> bytes:
    value = hashlib.sha256(b"%d/%d" % (partition, n)).digest() * 5
    return encode_batch([(b"p%d-%d" % (partition, n), value)], timestamp_ms=T0 + n)


def grow_filler(path: str) -> bool:
    """One more step of filler; False once the filesystem is full."""
    try:
        with open(path, "ab") as filler:
            filler.write(bytes(FILLER_STEP_BYTES))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return False
    return True


def main(root: str, filler_path: str) -> None:
    acked: dict[str, list[tuple[int, str]]] = {str(p): [] for p in range(PARTITIONS)}
    failed: dict[str, str] = {}
    filling = True
    with LogManager.open(root, CONFIG, progress=False) as manager:
        logs = {str(p): manager.log("t", p) for p in range(PARTITIONS)}
        for n in range(MAX_ROUNDS):
            if filling and n % 4 == 0:
                filling = grow_filler(filler_path)
            for name, log in logs.items():
                if name in failed:
                    continue
                data = batch(int(name), n)
                try:
                    result = log.append(data)
                except OncelogError as exc:
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    continue
                # Stored as sent, but for the base offset (bytes 0-7) the log stamps.
                acked[name].append((result.first_offset, hashlib.sha256(data[8:]).hexdigest()))
            if len(failed) == PARTITIONS:
                break
        try:
            manager.log("late", 0)
            late = "created"
        except OncelogError as exc:
            late = f"{type(exc).__name__}: {exc}"
        try:
            manager.close()
        except OncelogError as exc:
            failed["close"] = f"{type(exc).__name__}: {exc}"
    json.dump({"acked": acked, "failed": failed, "late": late, "filled": not filling}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
