"""Exactly-once whatever the client's clock says: expiry runs on the engine's clock.

A producer's batch timestamps come from its client: a mirror copies yesterday's (or
2023's) records with their original CreateTime, a backfill job stamps old times, a
skewed client stamps years ahead. None of that may shorten or extend how long the
engine keeps the producer's dedupe window and epoch. These tests run on the real
wall clock with Kafka's default 24-hour expiration unless they pin a clock to move it.

For a producer stamping 2023, each scenario checks the full rules (`assert_rules_hold`):
each of its last 5 batches comes back as a duplicate at its original offsets, an older
epoch is fenced, and a gap is refused; live, after a clean close and reopen, after a
SIGKILL of the process that wrote it, and through a LogManager of many partitions.
"""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka_fixtures import kafka_fixtures_root

from oncelog import LogConfig, LogManager
from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from oncelog.log import Log
from oncelog.segments.batch import encode_batch

TS_2023 = 1_690_000_000_000  # 2023-07-22: more than two years before any run of these tests
DAY_MS = 24 * 3600 * 1000
YEAR_MS = 365 * DAY_MS
WINDOW = 5
EPOCH = 3  # above 0, so an older epoch exists to be fenced


@dataclass(frozen=True)
class Sent:
    raw: bytes
    first_offset: int
    last_offset: int


def batch(pid: int, seq: int, *, ts: int = TS_2023, epoch: int = EPOCH, records: int = 2) -> bytes:
    values = [(b"k", b"%d-%d" % (pid, seq + i)) for i in range(records)]
    return encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp_ms=ts)


def send_batches(log: Log, pid: int, count: int = 7, *, ts: int = TS_2023) -> list[Sent]:
    sent = []
    for n in range(count):
        raw = batch(pid, 2 * n, ts=ts)
        result = log.append(raw)
        assert not result.duplicate
        sent.append(Sent(raw, result.first_offset, result.last_offset))
    return sent


def assert_rules_hold(log: Log, pid: int, sent: list[Sent]) -> None:
    """Kafka's full rules for a known producer, none of which may write a byte."""
    end = log.log_end_offset
    for s in sent[-WINDOW:]:
        retry = log.append(s.raw)
        assert retry.duplicate, (pid, s.first_offset)
        assert (retry.first_offset, retry.last_offset) == (s.first_offset, s.last_offset)
    next_seq = 2 * len(sent)
    with pytest.raises(InvalidProducerEpochError):
        log.append(batch(pid, next_seq, epoch=EPOCH - 1))  # a zombie: fenced
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(pid, next_seq + 4))  # a gap
    assert log.log_end_offset == end


# -- one log, on the wall clock ---------------------------------------------------------------
def test_a_producer_stamping_2023_keeps_dedupe_and_fencing_live(tmp_path: Path) -> None:
    with Log.open(tmp_path / "mirror-0") as log:
        sent = send_batches(log, 7)
        assert log.expire_producers(exhaustive=True) == 0  # nothing is idle on the engine's clock
        assert_rules_hold(log, 7, sent)


def test_a_producer_stamping_2023_keeps_dedupe_and_fencing_after_a_clean_close_and_reopen(
    tmp_path: Path,
) -> None:
    with Log.open(tmp_path / "mirror-0") as log:
        sent = send_batches(log, 7)
    with Log.open(tmp_path / "mirror-0") as reopened:
        assert reopened.recovery_report.clean
        assert_rules_hold(reopened, 7, sent)


def test_a_producer_stamping_2023_is_kept_by_a_crash_recovery_that_replays_it(tmp_path: Path) -> None:
    # A roll leaves a snapshot (with append times) for the first batches; the rest is
    # replayed from the tail and counts as appended at the load.
    log = Log.open(tmp_path / "mirror-0")
    first = send_batches(log, 7, count=4)
    log.roll()
    rest = []
    for seq in (8, 10, 12):
        result = log.append(batch(7, seq))
        rest.append(Sent(batch(7, seq), result.first_offset, result.last_offset))
    log.flush()
    shutil.copytree(tmp_path / "mirror-0", tmp_path / "crashed-0")
    log.close()
    with Log.open(tmp_path / "crashed-0") as recovered:
        assert not recovered.recovery_report.clean
        assert recovered.recovery_report.snapshot_offset is not None
        assert_rules_hold(recovered, 7, first + rest)


# -- a real process, killed ---------------------------------------------------------------------
# Appends with 2023 timestamps through one Log (argv[2] == "log") or a LogManager of 12
# partitions ("manager"), prints what it appended, then waits for SIGKILL: no close,
# no flush, so reopening recovers from the page cache.
CHILD = textwrap.dedent(
    """
    import json, sys
    from oncelog import LogManager
    from oncelog.log import Log
    from oncelog.segments.batch import encode_batch
    TS_2023, EPOCH = 1_690_000_000_000, 3

    def send(log, pid):
        sent = []
        for n in range(7):
            raw = encode_batch(
                [(b"k", b"%d-%d" % (pid, 2 * n + i)) for i in range(2)],
                producer_id=pid, producer_epoch=EPOCH, base_sequence=2 * n, timestamp_ms=TS_2023,
            )
            result = log.append(raw)
            sent.append([raw.hex(), result.first_offset, result.last_offset])
        return sent

    if sys.argv[2] == "log":
        log = Log.open(sys.argv[1])
        appended = {"0": send(log, 7)}
    else:
        manager = LogManager.open(sys.argv[1], progress=False)
        appended = {str(p): send(manager.log("mirror", p), 100 + p) for p in range(12)}
    print(json.dumps(appended), flush=True)
    sys.stdin.read()
    """
)


def run_and_kill(directory: Path, mode: str) -> dict[int, list[Sent]]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    appended = json.loads(line)
    return {
        int(p): [Sent(bytes.fromhex(raw), first, last) for raw, first, last in sent]
        for p, sent in appended.items()
    }


def test_a_producer_stamping_2023_keeps_dedupe_and_fencing_after_its_process_is_sigkilled(
    tmp_path: Path,
) -> None:
    sent = run_and_kill(tmp_path / "mirror-0", "log")[0]
    with Log.open(tmp_path / "mirror-0") as recovered:
        assert not recovered.recovery_report.clean
        assert_rules_hold(recovered, 7, sent)


def test_producers_stamping_2023_keep_their_rules_across_a_sigkilled_log_manager(tmp_path: Path) -> None:
    appended = run_and_kill(tmp_path, "manager")
    assert len(appended) == 12
    with LogManager.open(tmp_path, progress=False) as manager:
        summary = manager.recovery_summary
        assert (summary.partitions, summary.unclean) == (12, 12)
        for p, sent in appended.items():
            assert_rules_hold(manager.log("mirror", p, create=False), 100 + p, sent)
    with LogManager.open(tmp_path, progress=False) as manager:  # and after its clean close
        for p, sent in appended.items():
            assert_rules_hold(manager.log("mirror", p, create=False), 100 + p, sent)


# -- client clocks ahead, and the engine's clock moving --------------------------------------
class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


T0 = 1_800_000_000_000


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_a_producer_stamping_ten_years_ahead_expires_once_the_expiration_passes_on_the_engine_clock(
    tmp_path: Path, timestamp_type: str
) -> None:
    clock = Clock(T0)
    config = LogConfig(timestamp_type=timestamp_type)  # Kafka's default 24 h
    with Log.open(tmp_path / "t-0", config, clock=clock) as log:
        send_batches(log, 7, count=2, ts=T0 + 10 * YEAR_MS)
        clock.now = T0 + DAY_MS - 1
        assert log.expire_producers(exhaustive=True) == 0
        clock.now = T0 + DAY_MS
        assert log.expire_producers() == 1
        assert log.producer_state(7) is None
    # The same through a close: the snapshot keeps the engine's time of the last append.
    clock.now = T0
    with Log.open(tmp_path / "t-1", config, clock=clock) as log:
        send_batches(log, 7, count=2, ts=T0 + 10 * YEAR_MS)
    with Log.open(tmp_path / "t-1", config, clock=Clock(T0 + DAY_MS - 1)) as reopened:
        assert reopened.producer_state(7) is not None
    with Log.open(tmp_path / "t-1", config, clock=Clock(T0 + DAY_MS)) as reopened:
        assert reopened.producer_state(7) is None


def test_an_expired_producer_stamping_2023_starts_again_at_any_sequence(tmp_path: Path) -> None:
    clock = Clock(T0)
    with Log.open(tmp_path / "t-0", clock=clock) as log:
        send_batches(log, 7, count=3)
        clock.now = T0 + DAY_MS
        assert log.expire_producers() == 1
        result = log.append(batch(7, 12345))  # unknown again (KIP-360): any sequence
        assert not result.duplicate
        entry = log.producer_state(7)
        assert entry is not None and (entry.last_append_ms, entry.last_timestamp_ms) == (T0 + DAY_MS, TS_2023)


def test_dump_shows_both_times_for_each_producer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oncelog.cli.main import main

    with Log.open(tmp_path / "t-0", clock=Clock(T0)) as log:
        send_batches(log, 7, count=1)
    assert main(["dump", "--producers", str(tmp_path / "t-0")]) == 0
    out = capsys.readouterr().out
    assert f"producerId: 7 producerEpoch: {EPOCH}" in out
    assert f"lastTimestamp: {TS_2023} lastAppend: {T0}" in out


# -- real Kafka data on the wall clock ---------------------------------------------------------
def test_the_promotions_fixture_on_the_wall_clock_restores_producers_45_and_46(tmp_path: Path) -> None:
    source = kafka_fixtures_root() / "flink-on-prem" / "promotions-0"
    assert source.is_dir(), f"no Kafka fixtures at {source}"
    partition = tmp_path / "promotions-0"
    shutil.copytree(source, partition)
    for path in [partition, *partition.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    with Log.open(partition) as log:  # the wall clock; the batches are stamped in 2024
        p45, p46 = log.producer_state(45), log.producer_state(46)
        assert p45 is not None and p46 is not None
        assert (p45.producer_epoch, p45.last_sequence, p45.last_offset) == (0, 2, 26)
        assert (p46.producer_epoch, p46.last_sequence, p46.last_offset) == (0, 25, 28)
        assert p46.last_timestamp_ms < p46.last_append_ms  # stamped in 2024, replayed at the open
        last_46 = log.read(27).batches[0]
        retry = log.append(bytes(last_46.buffer))
        assert retry.duplicate and (retry.first_offset, retry.last_offset) == (27, 28)
