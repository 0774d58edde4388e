"""ProducerIdManager: PID leasing in durable blocks and epoch bumps (brief §7, issue 4).

The crash test kills a child process that is leasing PIDs with SIGKILL, twenty
times over the same root, and checks what the child printed: no PID twice across
runs, and at most one block of PIDs wasted per crash.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import ProducerIdManager, ProducerLease
from oncelog.config import LogConfig
from oncelog.errors import InvalidProducerEpochError, LogDirLockedError
from oncelog.log import Log
from oncelog.producer_ids import MAX_EPOCH, next_epoch
from oncelog.segments.batch import encode_batch

T0 = 1_700_000_000_000


# -- helpers --------------------------------------------------------------------
def batch(pid: int, seq: int, *, epoch: int, ts: int = T0) -> bytes:
    return encode_batch(
        [(f"{pid}-{epoch}-{seq}".encode(), b"v")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        timestamp_ms=ts,
    )


def open_log(root: Path) -> Log:
    return Log.open(root, LogConfig(), clock=lambda: T0)


def segment_digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.suffix in (".log", ".index", ".timeindex")
    }


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ProducerIdManager]:
    opened = ProducerIdManager.open(tmp_path / "ids", block_size=10, lease_ms=5_000, clock=lambda: T0)
    yield opened
    opened.close()


# -- lease ----------------------------------------------------------------------------
class TestLease:
    def test_lease_hands_out_increasing_pids_at_epoch_zero_sequence_zero(
        self, manager: ProducerIdManager
    ) -> None:
        leases = [manager.lease(T0 + i) for i in range(35)]  # crosses three block boundaries
        assert [lease.producer_id for lease in leases] == list(range(leases[0].producer_id, 35))
        assert all(isinstance(lease, ProducerLease) for lease in leases)
        assert {(lease.producer_epoch, lease.base_sequence) for lease in leases} == {(0, 0)}
        assert [lease.expire_ms for lease in leases] == [T0 + i + 5_000 for i in range(35)]

    def test_lease_without_a_time_uses_the_clock(self, manager: ProducerIdManager) -> None:
        assert manager.lease().expire_ms == T0 + 5_000

    def test_lease_ms_sets_the_lease_lifetime(self, tmp_path: Path) -> None:
        with ProducerIdManager.open(tmp_path, lease_ms=123) as ids:
            assert ids.lease(1_000).expire_ms == 1_123

    def test_reopening_starts_at_the_next_block_and_never_reissues(self, tmp_path: Path) -> None:
        issued: list[int] = []
        for leases_this_run in (3, 10, 1, 17, 0, 4):
            with ProducerIdManager.open(tmp_path, block_size=10) as ids:
                run = [ids.lease(T0).producer_id for _ in range(leases_this_run)]
            if issued and run:
                wasted = run[0] - issued[-1] - 1
                assert 0 <= wasted < 10, (issued[-1], run[0])
            issued.extend(run)
        assert issued == sorted(set(issued))

    def test_an_open_without_leases_reserves_nothing(self, tmp_path: Path) -> None:
        with ProducerIdManager.open(tmp_path, block_size=10) as ids:
            assert ids.lease(T0).producer_id == 0
        for _ in range(3):
            with ProducerIdManager.open(tmp_path, block_size=10):
                pass
        with ProducerIdManager.open(tmp_path, block_size=10) as ids:
            assert ids.lease(T0).producer_id == 10

    def test_lease_after_close_is_refused(self, tmp_path: Path) -> None:
        ids = ProducerIdManager.open(tmp_path)
        ids.close()
        ids.close()  # idempotent
        with pytest.raises(ValueError):
            ids.lease(T0)


# -- crash: kill -9 while leasing -----------------------------------------------------------
CHILD = """
import sys
from oncelog import ProducerIdManager

ids = ProducerIdManager.open(sys.argv[1], block_size=int(sys.argv[2]))
out = sys.stdout
while True:
    out.write(f"{ids.lease(0).producer_id}\\n")
    out.flush()
"""


def lease_until_killed(root: Path, block_size: int, lines_before_kill: int) -> list[int]:
    """Run the leasing child, read some of its lines, SIGKILL it; every PID it printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, os.fspath(root), str(block_size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        head = [child.stdout.readline() for _ in range(lines_before_kill)]
        os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
        stderr = child.stderr.read() if child.stderr else b""
        if child.stderr:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL, stderr.decode(errors="replace")
    data = b"".join(head) + rest
    lines = data.split(b"\n")
    complete = lines[:-1]  # the last piece is empty or a line cut by the kill
    assert all(head_line.endswith(b"\n") for head_line in head), stderr.decode(errors="replace")
    return [int(line) for line in complete]


def test_kill_9_while_leasing_twenty_times_never_reissues_and_wastes_at_most_a_block(
    tmp_path: Path,
) -> None:
    block_size = 50
    rng = random.Random(20240604)
    runs: list[list[int]] = []
    for _ in range(20):
        runs.append(lease_until_killed(tmp_path, block_size, rng.randint(1, 300)))
    issued = [pid for run in runs for pid in run]
    assert len(issued) == len(set(issued)), "a PID was issued twice"
    assert runs[0][0] == 0
    for run in runs:
        assert run, "every run printed at least the lines read before the kill"
        assert run == list(range(run[0], run[0] + len(run))), "PIDs within a run are consecutive"
    for previous, following in itertools.pairwise(runs):
        wasted = following[0] - previous[-1] - 1
        assert 0 <= wasted <= block_size, (previous[-1], following[0])
    # A clean open after the last crash still never goes back.
    with ProducerIdManager.open(tmp_path, block_size=block_size) as ids:
        after = ids.lease(T0).producer_id
    assert 0 < after - issued[-1] <= block_size + 1


# -- init_producer_id ---------------------------------------------------------------------
class TestInitProducerId:
    def test_first_call_gives_a_new_pid_at_epoch_zero_and_later_calls_bump_the_epoch(
        self, manager: ProducerIdManager
    ) -> None:
        pid, epoch = manager.init_producer_id("orders")
        assert epoch == 0
        assert [manager.init_producer_id("orders") for _ in range(5)] == [(pid, e) for e in range(1, 6)]

    def test_init_producer_id_survives_reopen(self, tmp_path: Path) -> None:
        with ProducerIdManager.open(tmp_path) as ids:
            pid, _ = ids.init_producer_id("orders")
            ids.init_producer_id("orders")
        with ProducerIdManager.open(tmp_path) as ids:
            assert ids.init_producer_id("orders") == (pid, 2)

    def test_different_transactional_ids_get_different_pids_and_no_leased_pid(
        self, manager: ProducerIdManager
    ) -> None:
        leased = {manager.lease(T0).producer_id for _ in range(5)}
        txn_pids = {manager.init_producer_id(f"txn-{n}")[0] for n in range(25)}
        leased |= {manager.lease(T0).producer_id for _ in range(5)}
        assert len(txn_pids) == 25
        assert not txn_pids & leased

    def test_epoch_overflow_issues_a_new_pid_at_epoch_zero(self, manager: ProducerIdManager) -> None:
        pid, _ = manager.init_producer_id("x")
        leased = manager.lease(T0).producer_id
        manager._store.put({"txn/x": struct.pack(">qh", pid, MAX_EPOCH - 1)})
        assert manager.init_producer_id("x") == (pid, MAX_EPOCH)  # the last epoch is still usable
        new_pid, epoch = manager.init_producer_id("x")
        assert epoch == 0
        assert new_pid not in (pid, leased)
        assert new_pid > leased
        assert manager.init_producer_id("x") == (new_pid, 1)

    def test_a_new_pid_after_overflow_survives_reopen(self, tmp_path: Path) -> None:
        with ProducerIdManager.open(tmp_path) as ids:
            pid, _ = ids.init_producer_id("x")
            ids._store.put({"txn/x": struct.pack(">qh", pid, MAX_EPOCH)})
            new_pid, _ = ids.init_producer_id("x")
        with ProducerIdManager.open(tmp_path) as ids:
            assert ids.init_producer_id("x") == (new_pid, 1)
            assert ids.lease(T0).producer_id > new_pid

    @pytest.mark.parametrize("bad", ["", "t" * 508])
    def test_an_empty_or_too_long_transactional_id_is_refused(
        self, manager: ProducerIdManager, bad: str
    ) -> None:
        with pytest.raises(ValueError):
            manager.init_producer_id(bad)
        assert manager.init_producer_id("t" * 507)[1] == 0  # the longest accepted id


# -- fencing through Log.append ------------------------------------------------------------------
def test_an_epoch_bump_fences_the_previous_incarnation_in_log_append(tmp_path: Path) -> None:
    with ProducerIdManager.open(tmp_path / "ids") as ids, open_log(tmp_path / "log") as log:
        pid, epoch = ids.init_producer_id("payments")
        assert epoch == 0
        log.append(batch(pid, 0, epoch=0))
        log.append(batch(pid, 1, epoch=0))
        pid_again, epoch = ids.init_producer_id("payments")
        assert (pid_again, epoch) == (pid, 1)
        log.append(batch(pid, 0, epoch=1))
        before = segment_digest(tmp_path / "log")
        end = log.log_end_offset
        with pytest.raises(InvalidProducerEpochError):
            log.append(batch(pid, 2, epoch=0))  # the zombie's next batch
        assert log.log_end_offset == end
        assert segment_digest(tmp_path / "log") == before
        state = log.producer_state(pid)
        assert state is not None
        assert (state.producer_epoch, state.last_sequence) == (1, 0)


# -- sharing a root with a Log --------------------------------------------------------------------
def test_manager_and_log_share_a_root_without_interfering(tmp_path: Path) -> None:
    root = tmp_path / "partition-0"
    log = open_log(root)
    ids = ProducerIdManager.open(root, block_size=10)
    leased = [ids.lease(T0).producer_id for _ in range(3)]
    txn = ids.init_producer_id("shared")
    for seq in range(4):
        log.append(batch(leased[0], seq, epoch=0))
    log.append(batch(txn[0], 0, epoch=txn[1]))
    log.roll()
    log.append(batch(leased[1], 0, epoch=0))
    keys = [r.key for r in log.read(0, 1 << 20).records()]
    end = log.log_end_offset
    states = {pid: log.producer_state(pid) for pid in (*leased, txn[0])}
    ids.close()
    log.close()

    # Reopen in the other order; each finds its own state.
    ids = ProducerIdManager.open(root, block_size=10)
    log = open_log(root)
    try:
        assert log.recovery_report.clean
        assert log.log_end_offset == end == 6
        assert {pid: log.producer_state(pid) for pid in states} == states
        assert states[leased[2]] is None
        assert [r.key for r in log.read(0, 1 << 20).records()] == keys
        assert ids.init_producer_id("shared") == (txn[0], txn[1] + 1)
        assert ids.lease(T0).producer_id > max(*leased, txn[0])
        log.append(batch(leased[0], 4, epoch=0))  # the producer's sequence carried over
        assert log.log_end_offset == 7
    finally:
        ids.close()
        log.close()


def test_an_unclean_log_recovers_beside_a_manager(tmp_path: Path) -> None:
    root = tmp_path / "p"
    with ProducerIdManager.open(root) as ids:
        pid = ids.lease(T0).producer_id
    log = open_log(root)
    log.append(batch(pid, 0, epoch=0))
    log.flush()
    copy = tmp_path / "crashed"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("*.lock", ".lock"))
    log.close()
    with open_log(copy) as recovered, ProducerIdManager.open(copy) as ids:
        assert not recovered.recovery_report.clean
        state = recovered.producer_state(pid)
        assert state is not None
        assert state.last_sequence == 0
        assert ids.lease(T0).producer_id > pid


# -- locking and arguments ----------------------------------------------------------------------
def test_a_second_open_on_the_same_root_raises_log_dir_locked(tmp_path: Path) -> None:
    with ProducerIdManager.open(tmp_path) as first:
        with pytest.raises(LogDirLockedError):
            ProducerIdManager.open(tmp_path)
        assert first.lease(T0).producer_id == 0  # the first is unaffected
    with ProducerIdManager.open(tmp_path) as again:  # the lock was released by close
        assert again.lease(T0).producer_id > 0


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"block_size": -5}, {"lease_ms": 0}])
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ProducerIdManager.open(tmp_path, **kwargs)  # type: ignore[arg-type]
    with ProducerIdManager.open(tmp_path) as ids:  # a refused open holds no lock
        assert ids.lease(T0).producer_id == 0


def test_next_epoch_is_the_one_epoch_rule_of_transactional_ids() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(MAX_EPOCH - 1) == MAX_EPOCH  # the last epoch is usable by init_producer_id
    assert next_epoch(MAX_EPOCH) is None  # then a new producer id, at epoch 0
    # The transaction coordinator keeps the last epoch back for the bump that fences at an abort.
    assert next_epoch(MAX_EPOCH - 2, kept_back=1) == MAX_EPOCH - 1
    assert next_epoch(MAX_EPOCH - 1, kept_back=1) is None
