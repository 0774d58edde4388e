"""keep_freed_read_buffers: a fetch's freed read buffers are reused, not faulted in afresh."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# In a process of its own (the setting is process-wide): page faults per round of four
# 1 MiB reads held together then freed, on a thread as a fetch thread reads, before and
# after the call. Fault counts, not times: a busy machine changes neither.
CHILD = """
import os, resource, sys, threading
from oncelog.server.memory_reuse import keep_freed_read_buffers
path = sys.argv[1]
with open(path, "wb") as file:
    file.write(os.urandom(1 << 20))
fd = os.open(path, os.O_RDONLY)
def faults_per_round():
    counts = []
    def work():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(50):
            held = [os.pread(fd, 1 << 20, 0) for _ in range(4)]
            assert all(len(data) == 1 << 20 for data in held)
            del held
        counts.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return counts[0]
default = faults_per_round()
kept = keep_freed_read_buffers()
print(default, faults_per_round(), kept)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
def test_freed_fetch_buffers_are_reused_instead_of_faulted_in_afresh(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path) + "/data"], capture_output=True, text=True, check=True
    ).stdout.split()
    default, kept, applied = float(out[0]), float(out[1]), out[2]
    assert applied == "True"
    assert default >= 400  # fresh megabytes: 256 pages each (measured: 740 a round of four)
    assert kept < default / 10, (default, kept)  # measured: 4 a round quiet, up to 21 beside two CPU hogs
