"""Process mode: a real child appends, runs transactions and flushes; the parent SIGKILLs it and checks.

The child prints one line per acknowledgement: `A offset pid epoch seq crc` after
append() returns (the batch is in the page cache, so it must survive kill -9),
`M offset pid epoch commit` after write_txn_marker() returns, and `F end` after
flush() returns. Beside the idempotent producers, transactional producers begin
transactions, send 1-3 transactional batches and commit or abort them; a child
that finds a transaction left open by the previous kill ends it first, as a
coordinator would. The parent kills the child at a random moment, reopens the same
directory on the real filesystem, and checks: every acknowledged batch and marker
is at its offset, no holes, producer state equals a full replay, each producer's
recovered window answers retries as duplicates, and read_committed returns only
committed data below the last stable offset. Each round continues the same log, so
the log grows across kills and every round recovers a real crash.

The log runs on the wall clock with Kafka's default 24-hour expiration, and some
producers stamp their batches two years behind it or three days ahead (a mirror
copying old records, a skewed client): none of them may expire, so every producer
must come back after each kill.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from oncelog.bench.sigint import sigint_deferred
from oncelog.config import LogConfig
from oncelog.log import Log
from oncelog.segments.batch import RecordBatch, encode_batch
from oncelog.segments.control import decode_txn_marker
from oncelog.torture.model import PRODUCERS, TXN_PRODUCERS, Violation
from oncelog.torture.recovered import check_producer_state
from oncelog.torture.txn import check_read_committed, read_all

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512, producer_capacity=64)
DAY_MS = 24 * 3600 * 1000
# Each producer's client clock against the wall clock: current, two years behind
# (a mirror keeping its source's timestamps), three days ahead.
CLIENT_SKEW_MS = {11: 0, 12: -2 * 365 * DAY_MS, 13: 3 * DAY_MS, 21: -2 * 365 * DAY_MS, 22: 0}


def _child(directory: str, seed: int) -> None:
    # A terminal's Ctrl-C reaches the whole process group: this child leaves it to the
    # parent, whose way out kills it (as each round does). A parent gone (its end of the
    # pipe closed) ends it at its next line, quietly.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    rng = random.Random(seed)
    log = Log.open(directory, CONFIG)
    # A transaction the last kill left open is ended first, at its stored epochs.
    for pid in TXN_PRODUCERS:
        entry = log.producer_state(pid)
        if entry is not None and entry.current_txn_first_offset >= 0:
            commit = rng.random() < 0.5
            result = log.write_txn_marker(
                pid, entry.producer_epoch, commit=commit, coordinator_epoch=max(entry.coordinator_epoch, 0)
            )
            print("M", result.first_offset, pid, entry.producer_epoch, int(commit), flush=True)
    # Continue each producer where the log left it (a fresh epoch keeps it simple).
    epochs = {
        pid: (entry.producer_epoch + 1 if (entry := log.producer_state(pid)) else 0)
        for pid in PRODUCERS + TXN_PRODUCERS
    }
    coordinator_epochs = {
        pid: max(entry.coordinator_epoch, 0) if (entry := log.producer_state(pid)) else 0
        for pid in TXN_PRODUCERS
    }
    sequences = dict.fromkeys(PRODUCERS + TXN_PRODUCERS, 0)
    planned = dict.fromkeys(TXN_PRODUCERS, 0)  # batches left to send in the open transaction
    in_txn = dict.fromkeys(TXN_PRODUCERS, False)
    while True:
        transactional = rng.random() < 0.35
        pid = rng.choice(TXN_PRODUCERS if transactional else PRODUCERS)
        if transactional and in_txn[pid] and planned[pid] == 0:
            commit = rng.random() < 0.5
            if rng.random() < 0.2:
                coordinator_epochs[pid] += 1
            result = log.write_txn_marker(
                pid, epochs[pid], commit=commit, coordinator_epoch=coordinator_epochs[pid]
            )
            print("M", result.first_offset, pid, epochs[pid], int(commit), flush=True)
            in_txn[pid] = False
            continue
        if transactional and not in_txn[pid]:
            in_txn[pid], planned[pid] = True, rng.randint(1, 3)
        records = [(b"k", rng.randbytes(rng.randrange(1, 200))) for _ in range(rng.randint(1, 3))]
        batch = encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epochs[pid],
            base_sequence=sequences[pid],
            is_transactional=transactional,
            timestamp_ms=int(time.time() * 1000) + CLIENT_SKEW_MS[pid],
        )
        result = log.append(batch)
        view = RecordBatch(batch)
        print("A", result.first_offset, pid, epochs[pid], sequences[pid], view.crc, flush=True)
        sequences[pid] += view.records_count
        if transactional:
            planned[pid] -= 1
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
    markers: dict[int, tuple[int, int, bool]] = {}  # offset -> (pid, epoch, commit)
    violations: list[Violation] = []
    for round_ in range(kills):
        child_seed = rng.getrandbits(32)
        wanted = rng.randint(1, 60)
        lines: list[str] = []
        child: subprocess.Popen[str] | None = None
        try:
            with sigint_deferred():  # a Ctrl-C during the spawn comes once `child` is held
                child = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        f"from oncelog.torture.process import _child; _child({directory!r}, {child_seed})",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            assert child.stdout is not None
            for line in child.stdout:
                lines.append(line)
                if len(lines) >= wanted:
                    break
        finally:
            if child is not None:  # (on a Ctrl-C too: the child appends forever)
                child.send_signal(signal.SIGKILL)
                rest, _ = child.communicate()
        lines.extend(line + "\n" for line in rest.split("\n")[:-1])  # a cut-off last line was no ack
        for line in lines:
            fields = line.split()
            if fields and fields[0] == "A":
                offset, pid, epoch, seq, crc = (int(f) for f in fields[1:])
                acked[offset] = (pid, epoch, seq, crc)
            elif fields and fields[0] == "M":
                offset, pid, epoch, commit = (int(f) for f in fields[1:])
                markers[offset] = (pid, epoch, bool(commit))
        violations.extend(_check(directory, acked, markers, seed, round_))
        if progress is not None:
            progress(round_ + 1, kills)
    return ProcessSummary(kills, len(acked) + len(markers), violations, time.perf_counter() - started, seed)


def _check(
    directory: str,
    acked: dict[int, tuple[int, int, int, int]],
    markers: dict[int, tuple[int, int, bool]],
    seed: int,
    round_: int,
) -> list[Violation]:
    found: list[Violation] = []

    def violation(invariant: str, detail: str) -> None:
        found.append(Violation(seed, "sigkill", invariant, f"round {round_}: {detail}"))

    with Log.open(directory, CONFIG) as log:
        present = {batch.base_offset: batch for batch in read_all(log)}
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
        for offset, (pid, epoch, commit) in markers.items():
            batch = present.get(offset)
            marker = decode_txn_marker(batch) if batch is not None and batch.is_control else None
            got_marker = (
                None
                if marker is None or batch is None
                else (batch.producer_id, batch.producer_epoch, marker.commit)
            )
            if got_marker != (pid, epoch, commit):
                violation(
                    "acknowledged data survives",
                    f"marker at {offset} was {(pid, epoch, commit)}, log has {got_marker}",
                )
        batches = [RecordBatch(present[offset].buffer.tobytes()) for offset in sorted(present)]
        check_producer_state(log, {b.base_offset: b.buffer.tobytes() for b in batches}, violation, batches)
        check_read_committed(log, batches, 4096, violation)
        for entry in list(log.producers()):
            for meta in entry.batches:
                result = log.append(present[meta.first_offset].buffer.tobytes())
                if not (result.duplicate and result.first_offset == meta.first_offset):
                    violation("retries are duplicates", f"retry of {meta.first_offset} gave {result}")
    return found
