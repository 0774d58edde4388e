"""`oncelog demo`: idempotent producers, a SIGKILL, recovery, and retries after it.

Self-checking: it exits non-zero if any acknowledged batch is missing or moved,
or if a retry after recovery is not recognised as a duplicate.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import TextIO

from oncelog.config import LogConfig
from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from oncelog.log import Log
from oncelog.producer_ids import ProducerIdManager
from oncelog.segments import encode_batch

DEMO_CONFIG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024)
PRODUCERS = 3
ACKS_BEFORE_KILL = 1500


def _batch(producer_id: int, epoch: int, sequence: int) -> bytes:
    value = f"producer={producer_id} epoch={epoch} seq={sequence} ".encode() * 3
    return encode_batch(
        [(b"key-%d" % producer_id, value)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        timestamp_ms=int(time.time() * 1000),
    )


def _child(directory: str, data_dir: str, seed: int) -> None:
    """Lease PIDs, then append forever; print 'offset pid seq duplicate' for each ack."""
    rng = random.Random(seed)
    with ProducerIdManager.open(data_dir) as pids:
        producer_ids = [pids.lease().producer_id for _ in range(PRODUCERS)]
    log = Log.open(directory, DEMO_CONFIG)
    sequence = dict.fromkeys(producer_ids, 0)
    while True:
        pid = rng.choice(producer_ids)
        batch = _batch(pid, 0, sequence[pid])
        result = log.append(batch)
        # append() returned: the batch is in the page cache and survives kill -9.
        print(result.first_offset, pid, sequence[pid], 0, flush=True)
        if rng.random() < 0.1:
            # A producer that timed out waiting for its ack sends the batch again.
            retry = log.append(batch)
            print(retry.first_offset, pid, sequence[pid], int(retry.duplicate), flush=True)
        sequence[pid] += 1


def run_demo(data_dir: str, out: TextIO = sys.stdout) -> int:
    directory = os.path.join(data_dir, "demo-0")
    if os.path.exists(data_dir):
        shutil.rmtree(data_dir)
    failures: list[str] = []

    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"1. The append rules, on {directory}")
    with ProducerIdManager.open(data_dir) as pid_manager, Log.open(directory, DEMO_CONFIG) as log:
        pid, epoch = pid_manager.init_producer_id("demo-app")
        say(f"   init_producer_id('demo-app') -> producer {pid}, epoch {epoch}")
        first = log.append(_batch(pid, epoch, 0))
        retry = log.append(_batch(pid, 0, 0))
        say(
            f"   producer {pid} seq 0 -> offset {first.first_offset}; the same batch again -> "
            f"duplicate={retry.duplicate}, offset {retry.first_offset}"
        )
        if not retry.duplicate or retry.first_offset != first.first_offset:
            failures.append("a retry was not recognised as a duplicate")
        try:
            log.append(_batch(pid, epoch, 5))
            failures.append("a sequence gap was accepted")
        except OutOfOrderSequenceError as exc:
            say(f"   seq 5 after seq 0 -> OutOfOrderSequenceError: {exc}")
        same_pid, new_epoch = pid_manager.init_producer_id("demo-app")
        bumped = log.append(_batch(same_pid, new_epoch, 0))
        say(
            f"   init_producer_id('demo-app') again -> producer {same_pid}, epoch {new_epoch}; "
            f"its seq 0 -> offset {bumped.first_offset}"
        )
        try:
            log.append(_batch(pid, epoch, 1))
            failures.append("a zombie producer was not fenced")
        except InvalidProducerEpochError as exc:
            say(f"   the old incarnation (epoch {epoch}) again -> InvalidProducerEpochError: {exc}")

    say(f"2. A child process leases {PRODUCERS} producer ids and appends, retrying 10% of its batches;")
    say(f"   it is killed with SIGKILL after {ACKS_BEFORE_KILL} acknowledgements, without close()")
    child = subprocess.Popen(
        [sys.executable, "-c", f"from oncelog.demo import _child; _child({directory!r}, {data_dir!r}, 7)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines: list[str] = []
    for line in child.stdout:
        lines.append(line)
        if len(lines) >= ACKS_BEFORE_KILL:
            break
    child.send_signal(signal.SIGKILL)
    # Acks still in the pipe count too; a line cut short by the kill was never an ack.
    rest, _ = child.communicate()
    lines.extend(line + "\n" for line in rest.split("\n")[:-1])
    acks = [tuple(int(field) for field in line.split()) for line in lines]
    retried = sum(1 for *_, duplicate in acks if duplicate)
    say(f"   child killed: {len(acks)} acks, {retried} of them retries answered as duplicates")

    say("3. Reopening after the crash")
    with Log.open(directory, DEMO_CONFIG) as log:
        report = log.recovery_report
        say(
            f"   clean={report.clean} segments={len(log.segments)} scanned={report.segments_scanned} "
            f"bytes_scanned={report.bytes_scanned} replayed={report.batches_replayed} "
            f"snapshot_offset={report.snapshot_offset} truncated={report.truncated_bytes} "
            f"in {report.duration_s * 1000:.1f} ms"
        )
        say(f"   log end offset {log.log_end_offset}")
        for entry in log.producers():
            say(
                f"   producer {entry.producer_id}: epoch {entry.producer_epoch}, "
                f"last seq {entry.last_sequence} at offset {entry.last_offset}, "
                f"{len(entry.batches)} batches in its dedupe window"
            )
        for offset, pid, seq, _ in acks:
            batch = log.read(offset, max_bytes=1).batches[0]
            if (batch.base_offset, batch.producer_id, batch.base_sequence) != (offset, pid, seq):
                failures.append(f"acknowledged batch pid={pid} seq={seq} is not at offset {offset}")
        say(f"   every acknowledged batch is at its offset: {not failures}")

        say("4. Each producer retries the 5 batches its recovered dedupe window holds")
        say("   (a batch written just before the kill may never have been acked: a real client retries it)")
        acked_offset = {(p, s): o for o, p, s, d in acks if not d}
        for pid in sorted({p for _, p, _, _ in acks}):
            state = log.producer_state(pid)
            window = state.batches if state else ()
            answers = [log.append(_batch(pid, 0, meta.first_sequence)) for meta in window]
            ok = all(
                a.duplicate
                and a.first_offset == meta.first_offset
                and acked_offset.get((pid, meta.first_sequence), meta.first_offset) == meta.first_offset
                for a, meta in zip(answers, window, strict=True)
            )
            if not ok or not window:
                failures.append(f"producer {pid}: a retry after recovery was not answered as a duplicate")
            shown = [
                f"{m.first_sequence}{'' if (pid, m.first_sequence) in acked_offset else '*'}" for m in window
            ]
            say(
                f"   producer {pid}: seqs {shown} -> duplicates at original offsets "
                f"{[a.first_offset for a in answers]}: {ok}"
            )
        say("   (* written but not acknowledged before the kill)")
    say()
    say(f"Inspect it: oncelog dump {directory} | head")
    for failure in failures:
        say(f"FAILED: {failure}")
    return 1 if failures else 0
