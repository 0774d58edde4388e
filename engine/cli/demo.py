"""`oncelog demo`: a LogManager with a few topics, idempotent producers, a SIGKILL,
parallel recovery, retries after it, transactions, a Kafka client through
`oncelog serve` across SIGKILLs (`demo_wire`), and the three fences (sequence, epoch,
generation) refusing zombie Kafka clients (`demo_fences`).

Self-checking: it exits non-zero if any acknowledged batch is missing or moved,
if a retry after recovery is not recognised as a duplicate, if the transaction
the killed child left open is not still open after recovery, or if a
read_committed read returns aborted data or misses committed data.

Steps 6 and 7 need confluent-kafka (the `kafka` extra). Without it the demo runs
steps 1 to 5, ends with one line naming the steps it skipped and the command that
installs the extra, and exits 0: an optional extra left out is not a failure.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple, TextIO

from oncelog import producer_ids
from oncelog.bench.sigint import sigint_deferred
from oncelog.cli.demo_fences import FENCES_DIR, run_fences_step
from oncelog.cli.demo_wire import KAFKA_EXTRA, WIRE_DIR, kafka_client_missing, run_wire_step
from oncelog.cli.exits import EXIT_BAD_INPUT, PROG
from oncelog.config import LogConfig
from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from oncelog.layout import parse_partition_dir_name
from oncelog.log import Log
from oncelog.log_manager import LogManager
from oncelog.producer_ids import ProducerIdManager
from oncelog.results import Isolation
from oncelog.root_config import ROOT_LOCK_FILE, ROOT_METADATA_DIR
from oncelog.root_identity import ROOT_ID_FILE, ROOT_ID_LOCK_FILE
from oncelog.segments import Record, encode_batch
from oncelog.storage.log_dirs import PARTITION_LOCKS_DIR

DEMO_CONFIG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024)
PRODUCERS = 3
ACKS_BEFORE_KILL = 1500
ORDERS, ORDER_PARTITIONS = "orders", 3  # the idempotent producers spread over these
PAYMENTS = "payments"  # the transactional producers write here
RULES = "rules"  # section 1
# Said once, at the end, by a demo run without confluent-kafka (the `kafka` extra), followed by the
# command that installs it; skipping them is no failure (exit 0).
SKIPPED_KAFKA_STEPS = (
    "Skipped (not failed) steps 6 and 7, real Kafka clients through `oncelog serve`: "
    "they need confluent-kafka"
)


def _batch(producer_id: int, epoch: int, sequence: int, *, transactional: bool = False) -> bytes:
    value = f"producer={producer_id} epoch={epoch} seq={sequence} ".encode() * 3
    return encode_batch(
        [(b"key-%d" % producer_id, value)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=transactional,
        timestamp_ms=int(time.time() * 1000),
    )


def _txn_batch(producer_id: int, epoch: int, sequence: int, keys: list[str]) -> bytes:
    return encode_batch(
        [(key.encode(), b"demo") for key in keys],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=True,
        timestamp_ms=int(time.time() * 1000),
    )


def _read_all(log: Log, start: int, isolation: Isolation) -> tuple[list[Record], list[tuple[int, int]]]:
    """The records from `start` up to where `isolation` may read, and the aborted transactions reported."""
    records: list[Record] = []
    aborted: list[tuple[int, int]] = []
    offset = start
    while True:
        fetched = log.read(offset, max_bytes=1 << 20, isolation=isolation)
        if not fetched.batches:
            return records, aborted
        records.extend(fetched.records())
        aborted.extend(txn for txn in fetched.aborted_transactions if txn not in aborted)
        offset = fetched.next_offset


def _keys(records: Iterable[Record]) -> list[str]:
    return [(record.key or b"").decode(errors="replace") for record in records]


def _child(data_dir: str, seed: int) -> None:
    """Lease PIDs and open a transaction (print 'txn pid offset'), then append forever to
    random partitions; print 'partition offset pid seq duplicate' for each ack."""
    rng = random.Random(seed)
    manager = LogManager.open(data_dir, DEMO_CONFIG, progress=False)
    producer_ids = [manager.producer_ids.lease().producer_id for _ in range(PRODUCERS)]
    txn_pid = manager.producer_ids.lease().producer_id
    # A transactional producer opens a transaction that the kill leaves unfinished.
    opened = manager.log(PAYMENTS, 0).append(_batch(txn_pid, 0, 0, transactional=True))
    print("txn", txn_pid, opened.first_offset, flush=True)
    orders = [manager.log(ORDERS, partition) for partition in range(ORDER_PARTITIONS)]
    # Sequences are per producer and partition, as in Kafka.
    sequence = {(pid, p): 0 for pid in producer_ids for p in range(ORDER_PARTITIONS)}
    while True:
        pid, partition = rng.choice(producer_ids), rng.randrange(ORDER_PARTITIONS)
        seq = sequence[pid, partition]
        batch = _batch(pid, 0, seq)
        result = orders[partition].append(batch)
        # append() returned: the batch is in the page cache and survives kill -9.
        print(partition, result.first_offset, pid, seq, 0, flush=True)
        if rng.random() < 0.1:
            # A producer that timed out waiting for its ack sends the batch again.
            retry = orders[partition].append(batch)
            print(partition, retry.first_offset, pid, seq, int(retry.duplicate), flush=True)
        sequence[pid, partition] += 1


# What a demo run leaves in its data directory, and nothing else may be there.
_DEMO_ROOT_ENTRIES = {
    ROOT_LOCK_FILE,
    PARTITION_LOCKS_DIR,
    ROOT_METADATA_DIR,
    producer_ids.LOCK_FILE,
    producer_ids.STORE_DIR,
    ROOT_ID_FILE,
    ROOT_ID_LOCK_FILE,
    WIRE_DIR,
    FENCES_DIR,
}


def unusable_data_dir(data_dir: str) -> str | None:
    """Why the demo may not use (and first delete) `data_dir`, or None if it may.

    It may be missing, an empty directory, or what an earlier demo left: deleting
    anything else (a real log someone pointed it at) is not the demo's to do.
    """
    if not os.path.lexists(data_dir):
        return None
    if not os.path.isdir(data_dir) or os.path.islink(data_dir):
        return f"{data_dir} exists and is not a directory"
    try:
        names = os.listdir(data_dir)
    except OSError as exc:
        return f"cannot list {data_dir}: {exc.strerror or exc}"
    for name in names:
        tp = parse_partition_dir_name(name)
        if name not in _DEMO_ROOT_ENTRIES and (tp is None or tp.topic not in (RULES, ORDERS, PAYMENTS)):
            return f"{data_dir} holds {name!r}, which no demo made: refusing to delete it"
    return None


def run_demo(data_dir: str, out: TextIO = sys.stdout) -> int:
    why = unusable_data_dir(data_dir)
    if why is not None:
        raise ValueError(why)
    if os.path.exists(data_dir):
        shutil.rmtree(data_dir)
    failures: list[str] = []

    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"1. The append rules, on {RULES}-0 of a LogManager at {data_dir}")
    with LogManager.open(data_dir, DEMO_CONFIG, progress=False) as manager:
        _append_rules(manager.log(RULES, 0), manager.producer_ids, say, failures)

    acks, open_pid, open_first = _run_child_and_kill_it(data_dir, say)

    say("3. Reopening the LogManager after the crash: every partition recovers in parallel")
    with LogManager.open(data_dir, DEMO_CONFIG) as manager:
        payments, orders = _recover(manager, acks, open_first, say, failures)

        say("4. Each producer retries the 5 batches its recovered dedupe window holds, in each partition")
        say("   (a batch written just before the kill may never have been acked: a real client retries it)")
        for partition, log in enumerate(orders):
            _retry_windows(
                log, f"{ORDERS}-{partition}", [a for a in acks if a.partition == partition], say, failures
            )
        say("   (* written but not acknowledged before the kill)")

        say(
            f"5. Transactions in {PAYMENTS}-0: read_committed reads stop at the last stable offset (LSO)"
            " and skip aborted data"
        )
        _transactions(payments, manager.producer_ids, open_pid, open_first, say, failures)

    skipped = kafka_client_missing()
    if not skipped:
        say(
            "6. Kafka clients over the wire: an unmodified confluent-kafka idempotent producer streams into "
            "`oncelog serve`, which is SIGKILLed and restarted twice"
        )
        run_wire_step(data_dir, say, failures)
        say("7. The three fences, with real clients: sequence, epoch, generation")
        run_fences_step(data_dir, say, failures)
    payments_dir = os.path.join(data_dir, f"{PAYMENTS}-0")
    say()
    say(f"Inspect it: oncelog stat {data_dir}")
    say(f"            oncelog verify {data_dir}")
    say(f"            oncelog dump --records {payments_dir} | tail -n 16   # the markers and the .txnindex")
    if skipped:
        # An optional extra that is not installed is not a failure: the exit status stays 0.
        say(f"{SKIPPED_KAFKA_STEPS}: {KAFKA_EXTRA}")
    for failure in failures:
        say(f"FAILED: {failure}")
    return 1 if failures else 0


def _run_child_and_kill_it(data_dir: str, say: Callable[..., None]) -> tuple[list[Ack], int, int]:
    """Step 2: a child appends and is SIGKILLed; its acks, and the transaction it left open."""
    say(f"2. A child process opens the LogManager and leases {PRODUCERS} producer ids; they append to")
    say(f"   {ORDERS}-0..{ORDER_PARTITIONS - 1} at random, retrying 10% of their batches; first a 4th")
    say(f"   producer opens a transaction in {PAYMENTS}-0 that it never ends; the child is killed")
    say(f"   with SIGKILL after {ACKS_BEFORE_KILL} acknowledgements, without close()")
    # A terminal's Ctrl-C reaches the child too: it leaves it to this process, whose way out
    # kills it; this process gone (its end of the pipe closed), it ends at its next line.
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL); "
        f"from oncelog.cli.demo import _child; _child({data_dir!r}, 7)"
    )
    child: subprocess.Popen[str] | None = None
    lines: list[str] = []
    try:
        with sigint_deferred():  # a Ctrl-C during the spawn comes once `child` is held
            child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        opened = child.stdout.readline().split()
        if len(opened) != 3 or opened[0] != "txn":
            raise RuntimeError(f"the demo's child process failed before opening its transaction: {opened}")
        open_pid, open_first = int(opened[1]), int(opened[2])
        for line in child.stdout:
            lines.append(line)
            if len(lines) >= ACKS_BEFORE_KILL:
                break
    finally:
        if child is not None:  # (on an error or a Ctrl-C too: the child appends forever)
            child.send_signal(signal.SIGKILL)
            # Acks still in the pipe count too; a line cut short by the kill was never an ack.
            rest, _ = child.communicate()
    lines.extend(line + "\n" for line in rest.split("\n")[:-1])
    acks = [Ack(*(int(field) for field in line.split())) for line in lines]
    retried = sum(1 for ack in acks if ack.duplicate)
    say(f"   child killed: {len(acks)} acks, {retried} of them retries answered as duplicates;")
    say(
        f"   producer {open_pid}'s transaction, opened at offset {open_first}, was never committed or aborted"
    )

    return acks, open_pid, open_first


def _recover(
    manager: LogManager, acks: list[Ack], open_first: int, say: Callable[..., None], failures: list[str]
) -> tuple[Log, list[Log]]:
    """Step 3: what recovery found, the open transaction, and every ack at its offset."""
    for line in str(manager.recovery_summary).splitlines():
        say(f"   {line}")
    for tp, log in manager.logs().items():
        report = log.recovery_report
        say(
            f"   {tp}: clean={report.clean} segments={len(log.segments)} "
            f"scanned={report.segments_scanned} bytes_scanned={report.bytes_scanned} "
            f"replayed={report.batches_replayed} "
            f"snapshot_offset={report.snapshot_offset} truncated={report.truncated_bytes} "
            f"log end {log.log_end_offset}"
        )
    payments = manager.log(PAYMENTS, 0, create=False)
    lso = payments.last_stable_offset
    committed_end = payments.read(0, max_bytes=1 << 20, isolation="read_committed").next_offset
    say(
        f"   {PAYMENTS}-0: last stable offset {lso}: the child's transaction is still open;"
        " read_committed stops there"
    )
    if lso != open_first or committed_end > open_first:
        failures.append(f"after recovery the last stable offset is {lso}, not {open_first}")
    for entry in payments.producers():
        txn = entry.current_txn_first_offset
        say(
            f"   {PAYMENTS}-0 producer {entry.producer_id}: epoch {entry.producer_epoch}, "
            f"last seq {entry.last_sequence} at offset {entry.last_offset}"
            + (f", transaction open since offset {txn}" if txn >= 0 else "")
        )
    orders = [manager.log(ORDERS, p, create=False) for p in range(ORDER_PARTITIONS)]
    for ack in acks:
        batch = orders[ack.partition].read(ack.offset, max_bytes=1).batches[0]
        if (batch.base_offset, batch.producer_id, batch.base_sequence) != (ack.offset, ack.pid, ack.seq):
            failures.append(f"acknowledged batch {ack} is not at its offset")
    say(f"   every acknowledged batch is at its offset: {not failures}")
    return payments, orders


class Ack(NamedTuple):
    partition: int
    offset: int
    pid: int
    seq: int
    duplicate: int


def _append_rules(
    log: Log, pid_manager: ProducerIdManager, say: Callable[[str], None], failures: list[str]
) -> None:
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


def _retry_windows(
    log: Log, name: str, acks: list[Ack], say: Callable[[str], None], failures: list[str]
) -> None:
    acked_offset = {(a.pid, a.seq): a.offset for a in acks if not a.duplicate}
    for pid in sorted({a.pid for a in acks}):
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
            failures.append(f"{name} producer {pid}: a retry after recovery was not answered as a duplicate")
        shown = [
            f"{m.first_sequence}{'' if (pid, m.first_sequence) in acked_offset else '*'}" for m in window
        ]
        say(
            f"   {name} producer {pid}: seqs {shown} -> duplicates at original offsets "
            f"{[a.first_offset for a in answers]}: {ok}"
        )


def _transactions(
    log: Log,
    pid_manager: ProducerIdManager,
    open_pid: int,
    open_first: int,
    say: Callable[[str], None],
    failures: list[str],
) -> None:
    """Abort the child's transaction, then one transaction aborted and one committed."""
    marker = log.write_txn_marker(open_pid, 0, commit=False, coordinator_epoch=0)
    say(
        f"   the coordinator aborts the child's transaction: ABORT marker at offset {marker.first_offset};"
        f" LSO {log.last_stable_offset} (= log end)"
    )
    if log.last_stable_offset != log.log_end_offset:
        failures.append("the last stable offset did not move to the log end after the abort")

    pid, epoch = pid_manager.init_producer_id("demo-txn")
    aborted_keys = [f"aborted-{i}" for i in range(3)]
    committed_keys = [f"committed-{i}" for i in range(2)]
    first = log.append(_txn_batch(pid, epoch, 0, aborted_keys))
    open_lso = log.last_stable_offset
    say(f"   init_producer_id('demo-txn') -> producer {pid}, epoch {epoch}")
    say(
        f"   it writes 3 records in a transaction at offsets {first.first_offset}-{first.last_offset}: "
        f"LSO {open_lso} while it is open, log end {log.log_end_offset}"
    )
    if open_lso != first.first_offset:
        failures.append(
            f"the last stable offset of an open transaction is {open_lso}, not {first.first_offset}"
        )
    abort = log.write_txn_marker(pid, epoch, commit=False, coordinator_epoch=1)
    second = log.append(_txn_batch(pid, epoch, 3, committed_keys))
    commit = log.write_txn_marker(pid, epoch, commit=True, coordinator_epoch=1)
    say(
        f"   ABORT (coordinator epoch 1) at offset {abort.first_offset}; 2 more records at "
        f"{second.first_offset}-{second.last_offset}, COMMIT at {commit.first_offset}: "
        f"LSO {log.last_stable_offset} (= log end)"
    )

    committed, aborted = _read_all(log, first.first_offset, "read_committed")
    uncommitted, _ = _read_all(log, first.first_offset, "read_uncommitted")
    # Leave out the markers' control records, if records() returns them.
    data = [r for r in uncommitted if r.offset not in (abort.first_offset, commit.first_offset)]
    say(f"   read_committed from {first.first_offset}:   {_keys(committed)}, aborted_transactions {aborted}")
    say(f"   read_uncommitted from {first.first_offset}: {_keys(data)}")
    if aborted != [(pid, first.first_offset)] or _keys(committed) != committed_keys:
        failures.append("read_committed did not return exactly the committed transaction")
    if _keys(data) != aborted_keys + committed_keys:
        failures.append("read_uncommitted did not return every record")

    # The whole log: every record but the markers and the aborted ones, the child's included.
    everything, _ = _read_all(log, 0, "read_uncommitted")
    markers_at = {marker.first_offset, abort.first_offset, commit.first_offset}
    aborted_at = {open_first, *range(first.first_offset, first.last_offset + 1)}
    data_offsets = [r.offset for r in everything if r.offset not in markers_at]
    committed_all, aborted_all = _read_all(log, 0, "read_committed")
    ok = [r.offset for r in committed_all] == [o for o in data_offsets if o not in aborted_at]
    ok &= sorted(aborted_all) == [(open_pid, open_first), (pid, first.first_offset)]
    say(
        f"   read_committed over the whole log: {len(committed_all)} of its {len(data_offsets)} data records,"
        f" all but the {len(aborted_at)} aborted ones: {ok}"
    )
    if not ok:
        failures.append("read_committed over the whole log returned aborted data or missed committed data")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    why = unusable_data_dir(args.data_dir)
    if why is not None:
        print(f"{PROG} demo: {why}", file=err)
        return EXIT_BAD_INPUT
    return int(run_demo(args.data_dir))
