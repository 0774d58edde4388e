"""Process mode: a real child appends and flushes; the parent SIGKILLs it and checks.

The child prints one line per acknowledgement: `A offset pid epoch seq crc` after
append() returns (the batch is in the page cache, so it must survive kill -9), and
`F end` after flush() returns. The parent kills it at a random moment, reopens the
same directory on the real filesystem, and checks: every acknowledged batch is at
its offset with its CRC, no holes, producer state equals a full replay, and each
producer's recovered window answers retries as duplicates. Each round continues
the same log, so the log grows across kills and every round recovers a real crash.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.recovery.torture import PRODUCERS, Violation, _check_producer_state, _read_all
from oncelog.segments.batch import RecordBatch, encode_batch

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512, producer_expiration_ms=10**13)


def _child(directory: str, seed: int) -> None:
    rng = random.Random(seed)
    log = Log.open(directory, CONFIG)
    # Continue each producer where the log left it (a fresh epoch keeps it simple).
    epochs = {
        pid: (entry.producer_epoch + 1 if (entry := log.producer_state(pid)) else 0) for pid in PRODUCERS
    }
    sequences = dict.fromkeys(PRODUCERS, 0)
    while True:
        pid = rng.choice(PRODUCERS)
        records = [(b"k", rng.randbytes(rng.randrange(1, 200))) for _ in range(rng.randint(1, 3))]
        batch = encode_batch(
            records, producer_id=pid, producer_epoch=epochs[pid], base_sequence=sequences[pid]
        )
        result = log.append(batch)
        view = RecordBatch(batch)
        print("A", result.first_offset, pid, epochs[pid], sequences[pid], view.crc, flush=True)
        sequences[pid] += view.records_count
        if rng.random() < 0.2:
            log.flush()
            print("F", log.log_end_offset, flush=True)


class ProcessSummary(NamedTuple):
    kills: int
    acks: int
    violations: list[Violation]
    seconds: float
    seed: int


def run_process_mode(
    directory: str, seed: int, kills: int, progress: Callable[[int, int], None] | None = None
) -> ProcessSummary:
    rng = random.Random(seed)
    started = time.perf_counter()
    acked: dict[int, tuple[int, int, int, int]] = {}  # offset -> (pid, epoch, seq, crc)
    violations: list[Violation] = []
    for round_ in range(kills):
        child_seed = rng.getrandbits(32)
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from oncelog.recovery.torture_process import _child; _child({directory!r}, {child_seed})",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        wanted = rng.randint(1, 60)
        lines: list[str] = []
        for line in child.stdout:
            lines.append(line)
            if len(lines) >= wanted:
                break
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
        lines.extend(line + "\n" for line in rest.split("\n")[:-1])  # a cut-off last line was no ack
        for line in lines:
            fields = line.split()
            if fields and fields[0] == "A":
                offset, pid, epoch, seq, crc = (int(f) for f in fields[1:])
                acked[offset] = (pid, epoch, seq, crc)
        violations.extend(_check(directory, acked, seed, round_))
        if progress is not None:
            progress(round_ + 1, kills)
    return ProcessSummary(kills, len(acked), violations, time.perf_counter() - started, seed)


def _check(
    directory: str, acked: dict[int, tuple[int, int, int, int]], seed: int, round_: int
) -> list[Violation]:
    found: list[Violation] = []

    def violation(invariant: str, detail: str) -> None:
        found.append(Violation(seed, "sigkill", invariant, f"round {round_}: {detail}"))

    with Log.open(directory, CONFIG) as log:
        present = {batch.base_offset: batch for batch in _read_all(log)}
        expected = log.log_start_offset
        for offset in sorted(present):
            if offset != expected:
                violation("no holes", f"batch at {offset}, expected {expected}")
            expected = present[offset].last_offset + 1
        for offset, (pid, epoch, seq, crc) in acked.items():
            batch = present.get(offset)
            got = (
                None
                if batch is None
                else (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.crc)
            )
            if got != (pid, epoch, seq, crc):
                violation(
                    "acknowledged data survives",
                    f"ack at {offset} was {(pid, epoch, seq, crc)}, log has {got}",
                )
        _check_producer_state(log, {o: b.buffer.tobytes() for o, b in present.items()}, violation)
        for entry in list(log.producers()):
            for meta in entry.batches:
                result = log.append(present[meta.first_offset].buffer.tobytes())
                if not (result.duplicate and result.first_offset == meta.first_offset):
                    violation("retries are duplicates", f"retry of {meta.first_offset} gave {result}")
    return found
