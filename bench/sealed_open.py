"""What opening a trusted sealed segment costs: `python bench/sealed_open.py DIR`.

DIR is a partition directory with many sealed segments (for one: the `image-100` crash
image `oncelog.bench.recovery.recovery_figures` builds). Makes the segment object of each
sealed segment as an unclean open below the recovery point does, 200 times over, and
prints the median and minimum per segment.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from oncelog.segments.segment import LOG_SUFFIX, LogSegment, segment_file_name
from oncelog.storage.fs import OsFileSystem

LOOPS = 200
LIMITS = (4096, 2 << 20, 10 << 20)  # index_interval_bytes, max_segment_bytes, max_index_bytes


def main(directory: str) -> None:
    fs = OsFileSystem()
    bases = sorted(int(name[:20]) for name in os.listdir(directory) if name.endswith(LOG_SUFFIX))
    paths = [os.path.join(directory, segment_file_name(base, LOG_SUFFIX)) for base in bases]
    pairs = list(zip(bases[:-1], bases[1:], paths, strict=False))
    per_segment_s = []
    for _ in range(LOOPS):
        started = time.perf_counter()
        for base, next_base, path in pairs:
            LogSegment.open_trusted(fs, directory, path, base, next_base, LIMITS, listed_regular=True)
        per_segment_s.append((time.perf_counter() - started) / len(pairs))
    print(
        f"{len(pairs)} sealed segments: median {statistics.median(per_segment_s) * 1e6:.2f} µs "
        f"a segment, min {min(per_segment_s) * 1e6:.2f} µs"
    )


if __name__ == "__main__":
    main(sys.argv[1])
