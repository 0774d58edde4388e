"""The child process of test_descriptors: many rolls under a small open-files limit.

Run as `python many_rolls_child.py DIRECTORY ROLLS LIMIT [--lose-store]`. Lowers its
own soft RLIMIT_NOFILE to LIMIT before oncelog is imported (so the segment file cache
sizes itself from it), appends one batch and rolls ROLLS times, then reads every
segment back, closes, reopens and reads again. With --lose-store the metadata store
is removed before the reopen, so the reopen validates every segment (as for a Kafka
directory). Prints, as JSON, what it read and the most descriptors it held; an EMFILE
ends it with a traceback and a non-zero status.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys


def main() -> None:
    directory, rolls, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lose_store = "--lose-store" in sys.argv[4:]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from oncelog import Log, encode_batch
    from oncelog.log import METADATA_DIR
    from oncelog.segments import file_cache

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def read_values(log: Log) -> list[str]:
        out: list[str] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            fetched = log.read(offset, 64 * 1024)
            out += [(record.value or b"").decode() for batch in fetched.batches for record in batch.records()]
            offset = fetched.next_offset
        return out

    most = descriptors()
    with Log.open(directory) as log:
        for n in range(rolls):
            log.append(encode_batch([(b"k", b"%d" % n)], timestamp_ms=1_700_000_000_000 + n))
            log.roll()
            if n % 500 == 0:
                most = max(most, descriptors())
        segments = len(log.segments)
        most = max(most, descriptors())
        first_read = read_values(log)
        most = max(most, descriptors())
    if lose_store:
        shutil.rmtree(os.path.join(directory, METADATA_DIR))
    with Log.open(directory) as log:
        second_read = read_values(log)
        most = max(most, descriptors())
    print(
        json.dumps(
            {
                "segments": segments,
                "first_read": first_read,
                "second_read": second_read,
                "most_descriptors": most,
                "cache_capacity": file_cache.SEGMENT_FILES.capacity,
            }
        )
    )


if __name__ == "__main__":
    main()
