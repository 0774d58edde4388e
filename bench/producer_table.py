"""Snapshot load and expiry at 1M producers, C and numpy: `python bench/producer_table.py [ROUNDS]`.

Writes a snapshot of 1M producers (1% of them expired), then in alternating rounds,
one process, times on each path of the pid map (the compiled `load_pid_map` and
`delete_pid_slots`, and numpy's vectorised fallback, which a build without a C
compiler or `ONCELOG_PURE=1` takes):

- load: `read_snapshot(into=table)` then `load_rows`, as an open does;
- expire: `expire()` of the 1% due at the ring's head, on the cold table a load leaves
  (after the backstop full pass, as the bench's expiry row times it).

Prints the median and min-max of each, in seconds and milliseconds. The figures follow
the machine (see bench/README.md, "Snapshot load and expiry in C").
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import tempfile
import time

from oncelog import pid_map
from oncelog.bench.recovery import EXPIRATION_MS, NOW_MS, producer_table_rows
from oncelog.producer_state import ProducerStateManager
from oncelog.storage import snapshot
from oncelog.storage.fs import OsFileSystem

PRODUCERS = 1_000_000
PATHS = {
    "C": (pid_map.compiled_load, pid_map.compiled_delete),
    "numpy": (None, None),
}


def _round(manager: ProducerStateManager, fs: OsFileSystem, directory: str) -> tuple[float, float]:
    gc.collect()
    started = time.perf_counter()
    manager.load_rows(snapshot.read_snapshot(fs, directory, 0, into=manager.table))
    load_s = time.perf_counter() - started
    manager.expire(NOW_MS - 2000)  # the backstop full pass, untimed
    gc.collect()
    started = time.perf_counter()
    expired = manager.expire(NOW_MS)
    expire_s = time.perf_counter() - started
    assert expired == PRODUCERS // 100, expired
    return load_s, expire_s


def main(rounds: int) -> None:
    if pid_map.compiled_load is None:
        sys.exit("the compiled module is not built (or ONCELOG_PURE=1): nothing to compare")
    directory = tempfile.mkdtemp(prefix="oncelog-producer-table-")
    try:
        fs = OsFileSystem()
        snapshot.write_snapshot(fs, directory, 0, producer_table_rows(PRODUCERS, expired_fraction=0.01))
        manager = ProducerStateManager(PRODUCERS, EXPIRATION_MS)
        times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in PATHS}
        for _ in range(rounds):
            for name, (load, delete) in PATHS.items():  # in turn, so drift hits both alike
                pid_map.compiled_load, pid_map.compiled_delete = load, delete
                load_s, expire_s = _round(manager, fs, directory)
                times[name][0].append(load_s)
                times[name][1].append(expire_s)
    finally:
        shutil.rmtree(directory)
    for name, (loads, expiries) in times.items():
        print(
            f"{name:6} snapshot load {statistics.median(loads):.3f} s ({min(loads):.3f}-{max(loads):.3f})"
            f"   expire 1% {statistics.median(expiries) * 1000:.2f} ms "
            f"({min(expiries) * 1000:.2f}-{max(expiries) * 1000:.2f})"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
