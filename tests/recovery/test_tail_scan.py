"""Recovery's compiled tail scan against the reference loop it stands in for.

Every scenario recovers the same crash image twice, once with the compiled scan
(oncelog._append.scan_tail) and once on the Python path alone, and compares all that
recovery decides: the log end, every stored byte, the indexes it rebuilt, producer
state, open and aborted transactions, what it reports, or the error it raises.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from log_helpers import read_all

from oncelog import compiled_append
from oncelog.config import LogConfig
from oncelog.errors import OncelogError
from oncelog.log import Log
from oncelog.producer_replay import ReplayBuffer
from oncelog.producer_state import ProducerStateManager
from oncelog.recovery import tail_rows
from oncelog.segments import encode_batch, segment
from oncelog.segments.records import Record

needs_compiled = pytest.mark.skipif(
    compiled_append.compiled is None or not compiled_append.enabled(),
    reason="the compiled append is not built, or ONCELOG_PURE=1",
)
T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=256 * 1024, index_interval_bytes=512, producer_expiration_ms=10**12)


class _Producers:
    def __init__(self, producers: int):
        self.count = producers
        self.sequences = {pid: 0 for pid in range(producers)}
        self.epochs = {pid: 0 for pid in range(producers)}
        self.in_txn: set[int] = set()


def _workload(log: Log, rng: random.Random, batches: int, state: _Producers, transactions: bool) -> None:
    """Plain, idempotent (epoch bumps) and transactional batches, with markers."""
    sequences, epochs, in_txn, producers = state.sequences, state.epochs, state.in_txn, state.count
    for n in range(batches):
        pid = rng.randrange(-1, producers)
        records = [
            Record(k, T0 + rng.randrange(-5000, 5000), b"k%d" % k, b"v" * rng.randrange(0, 900))
            for k in range(rng.randrange(1, 4))
        ]
        if pid < 0:
            log.append(encode_batch(records, timestamp_ms=T0))
            continue
        if rng.random() < 0.03:
            epochs[pid] += 1  # a new incarnation starts at sequence 0
            sequences[pid] = 0
            if pid in in_txn:
                log.write_txn_marker(pid, epochs[pid], commit=False, coordinator_epoch=0)
                in_txn.discard(pid)
        transactional = transactions and (pid in in_txn or rng.random() < 0.1)
        batch = encode_batch(
            records,
            producer_id=pid,
            producer_epoch=epochs[pid],
            base_sequence=sequences[pid],
            is_transactional=transactional,
            timestamp_ms=T0 + n,
        )
        log.append(batch)
        sequences[pid] += len(records)
        if transactional:
            in_txn.add(pid)
            if rng.random() < 0.3:
                log.write_txn_marker(pid, epochs[pid], commit=rng.random() < 0.5, coordinator_epoch=0)
                in_txn.discard(pid)


def _crash_image(
    tmp_path: Path, seed: int, *, batches: int = 600, producers: int = 12, transactions: bool = True
) -> Path:
    live, image = tmp_path / "live", tmp_path / "image"
    log = Log.open(live, CONFIG, clock=lambda: T0)
    rng = random.Random(seed)
    state = _Producers(producers)
    _workload(log, rng, batches, state, transactions)
    log.flush()  # a recovery point inside the active segment, then more past it
    _workload(log, rng, batches // 3, state, transactions)
    shutil.copytree(live, image)  # copied while open: no clean-shutdown marker
    log.close()
    return image


def _damage(image: Path, rng: random.Random, kind: str) -> None:
    active = max(p for p in image.iterdir() if p.suffix == ".log")
    data = bytearray(active.read_bytes())
    end = len(data.rstrip(b"\0")) or 1
    at = rng.randrange(end * 3 // 4, end)  # past the recovery point, most likely
    if kind == "flip":
        data[at] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        del data[at:]
    elif kind == "garbage":
        data[end:end] = rng.randbytes(rng.randrange(1, 300))
    active.write_bytes(bytes(data))


def _outcome(image: Path, target: Path, *, compiled: bool) -> Any:
    shutil.copytree(image, target)
    try:
        with compiled_append.forced_pure(not compiled):
            log = Log.open(target, CONFIG, clock=lambda: T0)
    except OncelogError as exc:
        return ("raised", type(exc).__name__, str(exc).replace(str(target), "DIR"))
    report = log.recovery_report._replace(duration_s=0)
    report = report._replace(tail_error=(report.tail_error or "").replace(str(target), "DIR"))
    active = log.active_segment
    indexes = (
        bytes(active.offset_index._view[: active.offset_index.entries * 8]),
        bytes(active.time_index._view[: active.time_index.entries * 12]),
        active.next_offset,
        active.max_timestamp_ms,
        active.offset_of_max_timestamp,
        active.first_batch_timestamp_ms,
        active.bytes_since_last_index_entry,
    )
    outcome = (
        log.log_end_offset,
        report,
        read_all(log),
        list(log.producers()),  # in the ring's order
        log.open_transactions(),
        log.last_stable_offset,
        [(s.base_offset, s.txn_index.entries()) for s in log.segments],
        indexes,
    )
    log.close()
    return outcome


@needs_compiled
@pytest.mark.parametrize("kind", ["none", "flip", "cut", "garbage"])
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_tail_scan_recovers_what_the_reference_loop_recovers(
    tmp_path: Path, seed: int, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _crash_image(tmp_path, seed)
    if kind != "none":
        _damage(image, random.Random(seed), kind)
    taken: list[int] = []
    on_rows = tail_rows.CompiledTailScan.on_rows
    monkeypatch.setattr(
        tail_rows.CompiledTailScan,
        "on_rows",
        lambda self, count: (taken.append(count), on_rows(self, count))[1],
    )
    compiled = _outcome(image, tmp_path / "compiled", compiled=True)
    assert sum(taken) > 0  # the compiled loop took batches (the rest went to the reference loop)
    reference = _outcome(image, tmp_path / "reference", compiled=False)
    assert compiled == reference
    if kind == "none":
        assert compiled[1].batches_replayed > 0 and not compiled[1].clean


@needs_compiled
def test_chunks_smaller_than_a_batch_and_a_full_rows_buffer_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _crash_image(tmp_path, 99, transactions=False)
    reference = _outcome(image, tmp_path / "reference", compiled=False)
    monkeypatch.setattr(segment, "TAIL_SCAN_CHUNK_BYTES", 700)  # batches of up to 2.8 KB: many go to Python
    monkeypatch.setattr(tail_rows, "ROWS_PER_SCAN", 3)
    monkeypatch.setattr(tail_rows, "KEPT_ROWS_LIMIT", 5)
    assert _outcome(image, tmp_path / "compiled", compiled=True) == reference


@needs_compiled
def test_more_producers_than_the_table_holds_shed_the_same_ones(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=256 * 1024, producer_capacity=40, producer_expiration_ms=10**12)
    live, image = tmp_path / "live", tmp_path / "image"
    with Log.open(live, config, clock=lambda: T0) as log:
        for n in range(300):  # producers come and go: each appends once, expiring at the engine's time
            log.expire_producers(T0 + 10**13)
            log.append(
                encode_batch(
                    [(b"k", b"v")], producer_id=n, producer_epoch=0, base_sequence=0, timestamp_ms=T0
                )
            )
        shutil.copytree(live, image)
    outcomes = []
    for compiled in (True, False):
        with compiled_append.forced_pure(not compiled):
            recovered = Log.open(
                shutil.copytree(image, tmp_path / f"open-{compiled}"), config, clock=lambda: T0
            )
        outcomes.append((list(recovered.producers()), recovered.recovery_report.producers_shed))
        recovered.close()
    assert outcomes[0] == outcomes[1] and outcomes[0][1] > 0


def test_the_compiled_layout_is_recoverys() -> None:
    if compiled_append.compiled is None:
        pytest.skip("the compiled append is not built")
    layout = compiled_append.compiled.LAYOUT
    assert layout["TAIL_ROW_COLUMNS"] == tail_rows.ROW_COLUMNS
    assert (layout["SCAN_END"], layout["SCAN_PYTHON"], layout["SCAN_ROWS_FULL"]) == (
        segment.TAIL_SCAN_END,
        segment.TAIL_SCAN_PYTHON,
        segment.TAIL_SCAN_ROWS_FULL,
    )


_rows = st.lists(
    st.tuples(
        st.integers(0, 6),  # producer
        st.integers(0, 2),  # epoch
        st.integers(0, 40),  # first sequence
        st.integers(0, 3),  # more records
        st.booleans(),  # in sequence with the producer's last
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_rows, st.integers(0, 30), st.sampled_from([4, 8, 100]))
def test_replaying_plain_rows_at_once_equals_one_at_a_time(
    rows: list[tuple[int, int, int, int, bool]], retired_below: int, capacity: int
) -> None:
    next_sequence: dict[int, int] = {}
    table = []
    for offset, (pid, epoch, first, more, follows) in enumerate(rows):
        first = next_sequence.get(pid, first) if follows else first
        last = first + more
        next_sequence[pid] = last + 1
        table.append([pid, epoch, first, last, offset * 10, offset * 10 + more, T0 + offset % 7, 0])
    array = np.array(table, dtype=np.int64).reshape(-1, 8)
    states = []
    for at_once in (True, False):
        manager = ProducerStateManager(capacity, 10**12)
        replay = ReplayBuffer(manager, T0, {3: retired_below})
        if at_once:
            replay.replay_plain_rows(array)
        else:
            for row in table:
                replay.replay_batch(*row[:7], False, False)
        replay.flush()
        states.append((list(manager.entries()), replay.shed))
    assert states[0] == states[1]


def _both_ways(image: Path, tmp_path: Path, config: LogConfig) -> list[Any]:
    outcomes = []
    for compiled in (True, False):
        target = tmp_path / f"open-{compiled}"
        shutil.copytree(image, target)
        with compiled_append.forced_pure(not compiled):
            recovered = Log.open(target, config, clock=lambda: T0)
        report = recovered.recovery_report._replace(duration_s=0)
        report = report._replace(tail_error=(report.tail_error or "").replace(str(target), "DIR"))
        outcomes.append((report, recovered.log_end_offset, list(recovered.producers()), recovered))
    return outcomes


@needs_compiled
def test_a_leaders_negative_base_sequence_recovers_the_sequence_a_live_log_keeps(tmp_path: Path) -> None:
    # Found by a red team: C kept a negative last sequence where Python wraps it.
    live, image = tmp_path / "live", tmp_path / "image"
    log = Log.open(live, LogConfig(), clock=lambda: T0)
    for n, sequence in enumerate([-2, -7]):
        batch = encode_batch(
            [(b"k", b"v")] * 3,
            producer_id=7,
            producer_epoch=0,
            base_sequence=sequence,
            timestamp_ms=T0,
            base_offset=3 * n,
        )
        log.append_batches([batch], origin="replication")
    expected = log.producer_state(7)
    shutil.copytree(live, image)
    log.close()
    outcomes = _both_ways(image, tmp_path, LogConfig())
    assert outcomes[0][:3] == outcomes[1][:3]
    for *_, recovered in outcomes:
        assert recovered.producer_state(7) == expected._replace(last_append_ms=T0)  # type: ignore[union-attr]
        follows = encode_batch(
            [(b"k", b"v")], producer_id=7, producer_epoch=0, base_sequence=2147483644, timestamp_ms=T0
        )
        assert recovered.append(follows).first_offset == 6
        recovered.close()


@needs_compiled
def test_rows_replayed_early_are_counted_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a red team: rows replayed because too many were kept went uncounted.
    monkeypatch.setattr(tail_rows, "KEPT_ROWS_LIMIT", 4)
    config = LogConfig(index_interval_bytes=2**31 - 1)  # no index entry hands a batch to Python
    live, image = tmp_path / "live", tmp_path / "image"
    with Log.open(live, config, clock=lambda: T0) as log:
        for n in range(20):
            log.append(
                encode_batch(
                    [(b"k", b"v")],
                    producer_id=1 + n % 3,
                    producer_epoch=0,
                    base_sequence=n // 3,
                    timestamp_ms=T0,
                )
            )
        shutil.copytree(live, image)
    outcomes = _both_ways(image, tmp_path, config)
    assert outcomes[0][:3] == outcomes[1][:3] and outcomes[0][0].batches_replayed == 20
    for *_, recovered in outcomes:
        recovered.close()


@needs_compiled
def test_a_flipped_base_offset_past_the_segments_range_is_a_torn_tail_not_a_crash(tmp_path: Path) -> None:
    # Found by a red team (older than the compiled scan): baseOffset is outside the CRC, and an
    # offset past the index's i32 made the index raise struct.error in a replicated log.
    live, image = tmp_path / "live", tmp_path / "image"
    log = Log.open(live, LogConfig(), clock=lambda: T0)
    for n in range(6):
        log.append_batches(
            [encode_batch([(b"k", b"v")], timestamp_ms=T0, base_offset=n)], origin="replication"
        )
    path, size = log.active_segment.path, log.active_segment.size
    shutil.copytree(live, image)
    log.close()
    damaged = image / os.path.basename(path)
    data = bytearray(damaged.read_bytes())
    data[size - 70 + 3] ^= 1  # the last batch's baseOffset gains 2**32
    damaged.write_bytes(bytes(data))
    outcomes = _both_ways(image, tmp_path, LogConfig())
    assert outcomes[0][:3] == outcomes[1][:3]
    report, end, *_ = outcomes[0]
    assert end == 5 and "past what a segment based at 0 can hold" in report.tail_error
    for *_, recovered in outcomes:
        recovered.close()


@needs_compiled
def test_a_log_opened_on_the_python_path_reloads_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a red team: a reload asked the process-wide switch, not the log's own choice.
    scans: list[object] = []
    original = segment.LogSegment.rebuild

    def spy(self: segment.LogSegment, **kwargs: Any) -> Any:
        scans.append(kwargs.get("tail_scan"))
        return original(self, **kwargs)

    monkeypatch.setattr(segment.LogSegment, "rebuild", spy)
    with compiled_append.forced_pure():
        log = Log.open(tmp_path / "log", LogConfig(), clock=lambda: T0)
    for _ in range(5):
        log.append(encode_batch([(b"k", b"v")], timestamp_ms=T0))
    log.truncate_to(3)  # reloads the log outside the block
    assert scans and all(scan is None for scan in scans)
    log.close()
