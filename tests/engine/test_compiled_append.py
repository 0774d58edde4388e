"""The compiled append (oncelog._append) against the Python path it must equal (issue 19).

A hypothesis state machine drives two logs with the same operations, one on each
path: valid, duplicate, fenced, out-of-order, transactional, poison and oversize
batches, requests of several batches, markers, rolls, clock jumps past the
expiration, reopens. After every step the results, the raised errors, producer
state, the segment and index cursors and (after each reopen) every file's bytes
must be equal. The compiled path hands back to the Python one for what it does
not take, so these also hold when it declines: the tests below show it does take
the common cases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncelog import Log, LogConfig, compiled_append, encode_batch, pid_map
from oncelog.errors import OncelogError
from oncelog.log import Log as LogClass
from oncelog.pid_map import MAP_BUCKETS, MAP_COUNT, MAP_FIELDS, MAP_TOMBSTONES
from oncelog.producer_state import (
    PRODUCER_DTYPE,
    RING_EXPIRATION_MS,
    RING_FIELDS,
    RING_HEAD,
    RING_HOLES,
    RING_USED,
)
from oncelog.segments import cursor
from oncelog.segments.records import Record
from oncelog.storage.clean_marker import CLEAN_SHUTDOWN_FILE, decode_marker

compiled = compiled_append.compiled
needs_compiled = pytest.mark.skipif(
    compiled is None or not compiled_append.enabled(),
    reason="the compiled append is not built, or ONCELOG_PURE=1",
)
T0 = 1_700_000_000_000
EXPIRATION_MS = 60_000


@needs_compiled
def test_the_compiled_layout_is_the_python_layout() -> None:
    assert compiled is not None
    layout = compiled.LAYOUT
    for name in [n for n in dir(cursor) if n.startswith(("SEG_", "IDX_"))]:
        assert layout[name] == getattr(cursor, name), name
    ring = {"RING_HEAD": RING_HEAD, "RING_USED": RING_USED, "RING_HOLES": RING_HOLES}
    ring |= {"RING_EXPIRATION_MS": RING_EXPIRATION_MS, "RING_FIELDS": RING_FIELDS}
    ring |= {
        "MAP_COUNT": MAP_COUNT,
        "MAP_TOMBSTONES": MAP_TOMBSTONES,
        "MAP_BUCKETS": MAP_BUCKETS,
        "MAP_FIELDS": MAP_FIELDS,
    }
    for name, value in ring.items():
        assert layout[name] == value, name
    fields = PRODUCER_DTYPE.fields
    assert fields is not None
    rows = {
        "R_PID": "producer_id",
        "R_APPEND_MS": "last_append_ms",
        "R_TIMESTAMP_MS": "last_timestamp_ms",
        "R_TXN_FIRST": "txn_first_offset",
        "R_COORDINATOR_EPOCH": "coordinator_epoch",
        "R_EPOCH": "producer_epoch",
        "R_COUNT": "window_count",
        "R_LIVE": "live",
        "R_LAST_SEQ": "last_sequence",
        "R_LAST_OFFSET": "last_offset",
        "R_DELTA": "offset_delta",
        "R_MAX_TS": "max_timestamp_ms",
    }
    for name, field in rows.items():
        assert layout[name] == fields[field][1], name
    assert layout["ROW_BYTES"] == PRODUCER_DTYPE.itemsize


@needs_compiled
def test_the_compiled_header_offsets_hash_and_window_are_the_pythons() -> None:
    # One place each (segments/format.py, storage/producer_row.py, pid_map.py); C's copies
    # are checked here, so a change on one side fails until the other follows.
    from oncelog import pid_map
    from oncelog.segments import format as fmt
    from oncelog.segments import segment as segment_module
    from oncelog.storage import producer_row

    assert compiled is not None
    layout = compiled.LAYOUT
    offsets = {
        "H_BASE_OFFSET": fmt.BASE_OFFSET_OFFSET,
        "H_LENGTH": fmt.LENGTH_OFFSET,
        "H_LEADER_EPOCH": fmt.PARTITION_LEADER_EPOCH_OFFSET,
        "H_MAGIC": fmt.MAGIC_OFFSET,
        "H_CRC": fmt.CRC_OFFSET,
        "H_ATTRIBUTES": fmt.ATTRIBUTES_OFFSET,
        "H_LAST_OFFSET_DELTA": fmt.LAST_OFFSET_DELTA_OFFSET,
        "H_BASE_TIMESTAMP": fmt.BASE_TIMESTAMP_OFFSET,
        "H_MAX_TIMESTAMP": fmt.MAX_TIMESTAMP_OFFSET,
        "H_PRODUCER_ID": fmt.PRODUCER_ID_OFFSET,
        "H_PRODUCER_EPOCH": fmt.PRODUCER_EPOCH_OFFSET,
        "H_BASE_SEQUENCE": fmt.BASE_SEQUENCE_OFFSET,
        "H_RECORDS_COUNT": fmt.RECORDS_COUNT_OFFSET,
        "HEADER_SIZE": fmt.HEADER_SIZE,
        "LOG_OVERHEAD": fmt.LOG_OVERHEAD,
        "PREFIX_BYTES": fmt.SIZE_AND_MAGIC_BYTES,
        "CRC_START": fmt.ATTRIBUTES_OFFSET,
        "MAGIC_V2": fmt.MAGIC_V2,
        "COMPRESSION_AND_CONTROL": fmt.COMPRESSION_MASK | fmt.CONTROL_MASK,
        "TIMESTAMP_TYPE_MASK": fmt.TIMESTAMP_TYPE_MASK,
        "TRANSACTIONAL_MASK": fmt.TRANSACTIONAL_MASK,
        "WINDOW": producer_row.WINDOW,
        "HASH_SHIFT": pid_map.HASH_SHIFT,
        "MAP_EMPTY": pid_map.EMPTY,
        "MAP_TOMBSTONE": pid_map.TOMBSTONE,
        "MAX_OCCUPIED_LOAD_PERCENT": round(pid_map.MAX_OCCUPIED_LOAD * 100),
        "WRITE_SYSCALL_MIN_BYTES": segment_module.WRITE_SYSCALL_MIN_BYTES,
    }
    assert {name: layout[name] for name in offsets} == offsets
    assert compiled.HASH_MULTIPLIER == pid_map.HASH_MULTIPLIER


@needs_compiled
@given(st.binary(max_size=40_000), st.integers(0, 16))
@settings(max_examples=200, deadline=None)
def test_crc32c_matches_the_crc32c_package_at_every_length_and_alignment(data: bytes, skew: int) -> None:
    assert compiled is not None
    view = memoryview(data)[min(skew, len(data)) :]
    assert compiled.crc32c(view) == crc32c.crc32c(view)


@needs_compiled
@pytest.mark.parametrize("length", [0, 1, 7, 8, 767, 768, 769, 12_287, 12_288, 12_289, 3 * 4096 * 5 + 3])
def test_crc32c_is_right_on_each_side_of_the_three_stream_blocks(length: int) -> None:
    assert compiled is not None
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    assert compiled.crc32c(data) == crc32c.crc32c(data)


@needs_compiled
@given(st.binary(min_size=200, max_size=20_000), st.integers(0, 63))
@settings(max_examples=200, deadline=None)
def test_every_crc32c_path_this_cpu_has_matches_the_crc32c_package(data: bytes, skew: int) -> None:
    assert compiled is not None
    view = memoryview(data)[skew:]
    paths = compiled.crc32c_by_each_path(view)
    expected = crc32c.crc32c(view)
    assert paths["software"] == expected
    assert paths["three_streams"] in (None, expected)
    assert paths["folded"] in (None, expected)
    assert paths["folded256"] in (None, expected)


@needs_compiled
@pytest.mark.parametrize(
    "length",
    # 512-bit folds: 256-, 64- and 16-byte steps; 256-bit folds: 128-, 32- and 16-byte steps.
    [
        255,
        256,
        257,
        287,
        288,
        289,
        303,
        304,
        319,
        320,
        383,
        384,
        385,
        511,
        512,
        513,
        527,
        528,
        16_363,
        16_384,
        1_048_576 + 15,
    ],
)
def test_crc32c_folding_is_right_on_each_side_of_its_steps(length: int) -> None:
    assert compiled is not None
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    paths = compiled.crc32c_by_each_path(data)
    assert set(paths) == {"software", "three_streams", "folded", "folded256"}
    assert paths["software"] == crc32c.crc32c(data)
    assert paths["folded"] in (None, crc32c.crc32c(data))
    assert paths["folded256"] in (None, crc32c.crc32c(data))
    if length < 256:
        # too short to fold: the crc32 instruction's path
        assert paths["folded"] is None and paths["folded256"] is None
    assert compiled.crc32c(data) == crc32c.crc32c(data)


def _batch(
    pid: int, seq: int, records: int = 1, *, epoch: int = 0, txn: bool = False, value: int = 40
) -> bytes:
    # Timestamps that go up and down within the batch: maxTimestamp is not the last record's.
    return encode_batch(
        [Record(n, T0 + (n * 7919) % 5 * 1000, b"k%d" % n, b"v" * value) for n in range(records)],
        producer_id=pid,
        producer_epoch=epoch if pid >= 0 else -1,
        base_sequence=seq if pid >= 0 else -1,
        is_transactional=txn,
        timestamp_ms=T0,
    )


def python_path(*args: object, **kwargs: object) -> None:
    """Patched over a Python append route: the compiled path must take every append."""
    raise AssertionError("the Python path took an append the compiled one should")


@needs_compiled
def test_plain_idempotent_and_request_appends_take_the_compiled_path(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log.open(tmp_path / "log", LogConfig(index_interval_bytes=100), clock=lambda: T0)
    log.append(_batch(-1, 0))  # the first maps the segment (the Python path's)
    # monkeypatch, not assignment: its undo deletes what it set on the class, so the methods
    # are inherited again (from LogAppends, where later tests patch them).
    with monkeypatch.context() as patched:
        patched.setattr(LogClass, "_append_one", python_path)
        patched.setattr(LogClass, "_plan", python_path)
        assert log.append(_batch(-1, 0)).first_offset == 1
        assert log.append(_batch(7, 0, 3)) == (2, 4, -1, False)
        assert log.append(_batch(7, 0, 3)) == (2, 4, -1, True)  # its retry
        results = log.append_batches([_batch(7, 3), _batch(8, 0, 2), _batch(7, 3), _batch(-1, 0)])
        assert results == [(5, 5, -1, False), (6, 7, -1, False), (5, 5, -1, True), (8, 8, -1, False)]
    assert "_append_one" not in vars(LogClass) and "_plan" not in vars(LogClass)
    state = log.producer_state(7)
    assert state is not None and state.last_sequence == 3 and state.last_offset == 5
    assert log.active_segment.offset_index.entries > 0  # index entries written by the compiled path
    log.close()


@needs_compiled
def test_batches_that_open_transactions_take_the_compiled_path_and_hold_the_stable_offset(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log.open(tmp_path / "log", LogConfig(), clock=lambda: T0)
    log.append(_batch(-1, 0))  # the first maps the segment (the Python path's)
    with monkeypatch.context() as patched:
        patched.setattr(LogClass, "_append_one", python_path)
        patched.setattr(LogClass, "_plan", python_path)
        assert log.append(_batch(7, 0, 2, txn=True)) == (1, 2, -1, False)  # opens 7's transaction
        assert log.last_stable_offset == 1
        # A request opening another (8's) and continuing 7's: the oldest still bounds it.
        results = log.append_batches([_batch(8, 0, txn=True), _batch(7, 2, txn=True), _batch(-1, 0)])
        assert results == [(3, 3, -1, False), (4, 4, -1, False), (5, 5, -1, False)]
        assert log.last_stable_offset == 1
        assert log.append(_batch(7, 2, txn=True)) == (4, 4, -1, True)  # a retry: opens nothing
    assert log.read(0, isolation="read_committed").next_offset == 1  # nothing of either is read
    log.write_txn_marker(7, 0, commit=True, coordinator_epoch=0)  # at 6
    assert log.last_stable_offset == 3  # 8's, still open
    log.write_txn_marker(8, 0, commit=False, coordinator_epoch=0)  # at 7
    assert log.last_stable_offset == log.log_end_offset == 8
    with monkeypatch.context() as patched:
        patched.setattr(LogClass, "_append_one", python_path)
        assert log.append(_batch(7, 3, txn=True)) == (8, 8, -1, False)  # 7's next transaction
    assert log.last_stable_offset == 8
    # A request the compiled path leaves to Python (a poisoned batch in it) opens nothing.
    with pytest.raises(OncelogError):
        log.append_batches([_batch(9, 0, txn=True), _poison(_batch(-1, 0), "crc")])
    assert log.last_stable_offset == 8 and log.producer_state(9) is None
    log.close()
    reopened = Log.open(tmp_path / "log", LogConfig(), clock=lambda: T0)
    assert reopened.last_stable_offset == 8  # 7's second transaction is open still
    reopened.close()


@needs_compiled
def test_an_idle_log_makes_no_compiled_appender_until_its_next_append(tmp_path: Any) -> None:
    # Most of a broker's partitions open (or roll) and then sit idle: the appender, bound to
    # the active segment and the producer table, is made by the append that needs it.
    path = tmp_path / "log"
    with Log.open(path, LogConfig(segment_bytes=1024)) as log:
        log.append(_batch(7, 0))
    log = Log.open(path, LogConfig(segment_bytes=1024))
    assert log._compiled_appender is None
    assert log.append(_batch(7, 1)).first_offset == 1  # the reopened producer, on the bound appender
    first = log._compiled_appender
    assert first is not None
    while log.active_segment.base_offset == 0:  # until a roll rebinds it
        log.append(_batch(-1, 0))
    assert log._compiled_appender is None  # the roll unbound it
    appended = log.append_batches([_batch(7, 2)])  # a request binds it too
    assert appended[0].first_offset == log.log_end_offset - 1
    assert log._compiled_appender is not None and log._compiled_appender is not first
    log.close()
    assert log._compiled_appender is None


@needs_compiled
def test_a_close_between_a_compiled_append_and_its_flush_policy_leaves_the_append_acknowledged(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The compiled append writes under the lock and lets it go; the flush policy counts the
    # batch after. A close in between flushed it: the append is acknowledged (it raised
    # LogClosedError, found by red-teaming, and a retry would have stored it twice).
    path = tmp_path / "log"
    log = Log.open(path, LogConfig(flush_messages=1))
    log.append(_batch(-1, 0))
    counted = LogClass._count_for_flush

    def closed_meanwhile(self: LogClass, results: Any, batches: Any) -> None:
        self.close()
        counted(self, results, batches)

    monkeypatch.setattr(LogClass, "_count_for_flush", closed_meanwhile)
    assert log.append(_batch(-1, 0)).first_offset == 1
    monkeypatch.undo()
    with Log.open(path, LogConfig(flush_messages=1)) as reopened:
        assert reopened.log_end_offset == 2 and reopened.recovery_report.clean


def _python_calls_during(action: Any) -> list[str]:
    """The Python functions (file:name) entered while `action` runs."""
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: object) -> None:
        if event == "call":
            calls.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return [call for call in calls if not call.startswith("test_compiled_append.py")]


@needs_compiled
def test_a_plain_or_idempotent_append_on_the_wall_clock_runs_no_python_frame(tmp_path: Any) -> None:
    # The method, the clock and the lock are all read in C: Python around the C call cost
    # more than the append itself (bench/README.md, "performance round 3").
    log = Log.open(tmp_path / "log", LogConfig())
    log.append(_batch(-1, 0))  # the first maps the segment (the Python path's)
    log.append(_batch(7, 0))
    plain, idempotent = _batch(-1, 0), _batch(7, 1)
    assert _python_calls_during(lambda: [log.append(plain), log.append(idempotent)]) == []
    assert log.producer_state(7) is not None and log.producer_state(7).last_sequence == 1  # type: ignore[union-attr]
    # A flush policy counts each append in Python: that log goes through the Python method.
    counted = Log.open(tmp_path / "counted", LogConfig(flush_messages=1))
    counted.append(plain)
    assert "log_appends.py:append" in _python_calls_during(lambda: counted.append(plain))
    assert counted.durable_end_offset == 2  # flushed by the policy after the compiled append
    counted.close()
    log.close()


@needs_compiled
def test_the_wall_clock_read_in_c_keeps_the_python_clocks_high_mark(tmp_path: Any) -> None:
    from oncelog.clock import MonotonicWallClock, wall_clock_ms

    log = Log.open(tmp_path / "log", LogConfig())
    clock = log._clock
    assert isinstance(clock, MonotonicWallClock)
    log.append(_batch(-1, 0))
    # The wall clock stepped back an hour after the engine read a later time: C keeps the mark.
    ahead_ms = wall_clock_ms() + 3_600_000
    clock.cell[0] = ahead_ms
    log.append(_batch(7, 0))
    assert log.producer_state(7).last_append_ms == ahead_ms  # type: ignore[union-attr]
    assert clock() == ahead_ms
    # A mark behind the wall clock: C reads the time as int(time.time() * 1000) does, and
    # moves the mark Python reads.
    clock.cell[0] = 0
    before_ms = wall_clock_ms()
    log.append(_batch(7, 1))
    after_ms = wall_clock_ms()
    appended_ms = log.producer_state(7).last_append_ms  # type: ignore[union-attr]
    assert before_ms <= appended_ms <= after_ms
    assert appended_ms <= clock.high_ms <= after_ms
    log.close()


@needs_compiled
def test_append_keeps_its_signature_its_doc_and_every_other_call_shape(tmp_path: Any) -> None:
    import inspect

    from oncelog.errors import LogClosedError

    assert list(inspect.signature(Log.append).parameters) == ["self", "batch_bytes", "origin", "durable"]
    assert Log.append.__doc__ is not None and Log.append.__doc__.startswith("Validate one encoded batch")
    assert Log.append.__name__ == "append" and callable(Log.append.__wrapped__)
    assert Log.append.__qualname__ == "LogAppends.append"
    log = Log.open(tmp_path / "log", LogConfig())
    batch = _batch(-1, 0)
    assert log.append(batch).first_offset == 0
    assert log.append(bytearray(batch)).first_offset == 1
    assert log.append(memoryview(batch)).first_offset == 2
    assert log.append(batch, durable=True).first_offset == 3 and log.durable_end_offset == 4
    with pytest.raises(OncelogError, match="below the log end 4"):
        log.append(batch, origin="replication")  # a leader's offsets: the Python method's rule
    assert Log.append(log, batch).first_offset == 4  # called on the class
    with pytest.raises(TypeError):
        log.append()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        log.append(batch, "client")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Log.append(object(), batch)  # type: ignore[arg-type]
    with pytest.raises(OncelogError):
        log.append(b"x" * 70)  # not a batch: the Python method names what is wrong
    log.close()
    with pytest.raises(LogClosedError):
        log.append(batch)


def _subprocess(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "always::RuntimeWarning", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )


def test_a_machine_with_a_c_compiler_builds_the_compiled_append() -> None:
    # Otherwise every test above would skip and `make test` would pass on the Python path alone.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the Python path is the one to test")
    assert compiled is not None, f"{compiler} is here, yet oncelog._append is not built"


def test_oncelog_pure_forces_the_python_path_without_a_warning() -> None:
    run = _subprocess(
        "from oncelog import compiled_append; print(compiled_append.enabled())", ONCELOG_PURE="1"
    )
    assert run.stdout.strip() == "False" and "RuntimeWarning" not in run.stderr


def test_without_the_built_module_oncelog_warns_once_and_appends_on_the_python_path(tmp_path: Any) -> None:
    code = (
        "import sys; sys.modules['oncelog._append'] = None\n"  # as if no compiler had built it
        "import oncelog, oncelog.compiled_append as f, oncelog.log\n"
        f"log = oncelog.Log.open({str(tmp_path / 'log')!r})\n"
        "print(f.enabled(), log.append(oncelog.encode_batch([(b'k', b'v')], timestamp_ms=1)).first_offset)\n"
        "log.close()\n"
    )
    run = _subprocess(code, ONCELOG_PURE="0")
    assert run.stdout.strip() == "False 0"
    assert run.stderr.count("RuntimeWarning") == 1 and "not built" in run.stderr


@needs_compiled
def test_threads_appending_while_others_roll_flush_and_truncate_lose_and_repeat_nothing(
    tmp_path: Any,
) -> None:
    config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=512)
    log = Log.open(tmp_path / "log", config)
    stop = threading.Event()
    errors: list[BaseException] = []
    acked: dict[int, list[tuple[int, int]]] = {}

    def producer(pid: int) -> None:
        seq, mine = 0, acked.setdefault(pid, [])
        try:
            while not stop.is_set() and seq < 3000:
                result = log.append(_batch(pid, seq, 2))
                if not result.duplicate:
                    mine.append((result.first_offset, seq))
                seq += 2
        except BaseException as exc:
            errors.append(exc)

    def operator() -> None:
        try:
            for n in range(60):
                log.flush() if n % 2 else log.roll()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(pid,)) for pid in (1, 2, 3)]
    threads.append(threading.Thread(target=operator))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    assert errors == []
    offsets = sorted(first for pairs in acked.values() for first, _ in pairs)
    assert len(offsets) == len(set(offsets)) == 4500 and offsets[-1] == log.log_end_offset - 2
    for pid, pairs in acked.items():
        fetched = {}
        for first, seq in pairs[-5:]:
            batch = log.read(first, 1).batches[0]
            fetched[first] = (batch.producer_id, batch.base_sequence)
            assert fetched[first] == (pid, seq)
        retry = log.append(_batch(pid, pairs[-1][1], 2))  # the newest, retried: a duplicate
        assert retry.duplicate and retry.first_offset == pairs[-1][0]
    log.close()


# -- the differential state machine ----------------------------------------------------

POISONS = ("crc", "body", "headers", "oversize", "control", "count")
CONFIG = LogConfig(
    segment_bytes=6000,
    index_interval_bytes=200,
    segment_index_bytes=96,  # room for 12 offset entries: indexes fill and force rolls
    max_batch_bytes=1500,
    producer_capacity=4,
    producer_expiration_ms=EXPIRATION_MS,
)


def _poison(data: bytes, how: str) -> bytes:
    out = bytearray(data)
    if how == "crc":
        out[-1] ^= 0x40
        return bytes(out)
    if how == "oversize":
        return encode_batch([(b"k", b"x" * 1600)], timestamp_ms=T0)
    if how == "headers":
        return encode_batch([(b"k", b"v", [("h", b"1")])], timestamp_ms=T0)  # valid: the Python walk's
    if how == "body":
        out[62] ^= 0x7F  # the first record's attributes/timestamp, CRC made right below
    elif how == "control":
        out[22] |= 0x20
    elif how == "count":
        out[57:61] = (5).to_bytes(4, "big")
    out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def _outcome(call: Any) -> tuple[str, object]:
    try:
        return "ok", call()
    except OncelogError as exc:
        return type(exc).__name__, str(exc).replace("/pure", "/LOG").replace("/compiled", "/LOG")


class PurePathAndCompiledPathAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="oncelog-diff-")
        self.now_ms = T0
        self.next_seq: dict[int, int] = {}
        self.epoch: dict[int, int] = {}
        self.open_txn: set[int] = set()
        self.sent: list[bytes] = []
        self.logs: list[Log] = []

    def _open(self) -> None:
        def clock() -> int:
            return self.now_ms

        with compiled_append.forced_pure():
            pure = Log.open(os.path.join(self.root, "pure"), CONFIG, clock=clock)
        self.logs = [pure, Log.open(os.path.join(self.root, "compiled"), CONFIG, clock=clock)]

    @initialize()
    def start(self) -> None:
        self._open()

    def _both(self, call: Any) -> None:
        pure, compiled_ = (_outcome(lambda log=log: call(log)) for log in self.logs)  # type: ignore[misc]
        assert pure == compiled_

    def _data_batch(self, pid: int, records: int, seq_shift: int, txn: bool) -> bytes:
        seq = max(self.next_seq.get(pid, 0) + seq_shift, 0)
        batch = _batch(pid, seq, records, epoch=self.epoch.get(pid, 0), txn=txn)
        if pid >= 0 and seq_shift == 0:
            self.next_seq[pid] = (seq + records) % 2**31
        self.sent.append(batch)
        return batch

    @rule(
        pid=st.sampled_from([-1, 0, 1, 2, 3, 4, 5]),
        records=st.integers(1, 4),
        seq_shift=st.sampled_from([0, 0, 0, 0, -1, 1, -6]),
        txn=st.booleans(),
        many=st.integers(0, 3),
    )
    def append(self, pid: int, records: int, seq_shift: int, txn: bool, many: int) -> None:
        txn = txn and pid in (4, 5)
        if txn:
            self.open_txn.add(pid)
        batch = self._data_batch(pid, records, seq_shift, txn)
        if many:
            extra = [self._data_batch(pid if n % 2 else 1, 1, 0, False) for n in range(many)]
            self._both(lambda log: log.append_batches([batch, *extra]))
        else:
            self._both(lambda log: log.append(batch))

    @precondition(lambda self: bool(self.sent))
    @rule(back=st.integers(1, 8))
    def retry(self, back: int) -> None:
        batch = self.sent[-min(back, len(self.sent))]
        self._both(lambda log: log.append(batch))

    @rule(pid=st.sampled_from([0, 1, 4]), seq=st.sampled_from([0, 0, 3]))
    def bump_epoch(self, pid: int, seq: int) -> None:
        # A newer epoch must start at sequence 0 (3: refused as out of order).
        self.epoch[pid] = self.epoch.get(pid, 0) + 1
        batch = _batch(pid, seq, epoch=self.epoch[pid])
        self.next_seq[pid] = 1
        self._both(lambda log: log.append(batch))

    @precondition(lambda self: any(self.epoch.values()))
    @rule(data=st.data())
    def zombie(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(p for p, e in self.epoch.items() if e)))
        fenced = _batch(pid, self.next_seq.get(pid, 0), epoch=self.epoch[pid] - 1)
        self._both(lambda log: log.append(fenced))

    @rule(how=st.sampled_from(POISONS), pid=st.sampled_from([-1, 1]))
    def poison(self, how: str, pid: int) -> None:
        batch = _poison(_batch(pid, self.next_seq.get(pid, 0)), how)
        self._both(lambda log: log.append(batch))
        self._both(lambda log: log.append_batches([_batch(-1, 0), batch]))

    @precondition(lambda self: bool(self.open_txn))
    @rule(commit=st.booleans(), data=st.data())
    def marker(self, commit: bool, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(self.open_txn)))
        self.open_txn.discard(pid)
        epoch = self.epoch.get(pid, 0)
        self._both(lambda log: log.write_txn_marker(pid, epoch, commit=commit, coordinator_epoch=0))

    @rule(ms=st.sampled_from([1, 1000, EXPIRATION_MS // 2, EXPIRATION_MS + 1]))
    def clock_moves(self, ms: int) -> None:
        self.now_ms += ms

    @rule()
    def roll(self) -> None:
        self._both(lambda log: log.roll().base_offset)

    @rule()
    def reopen(self) -> None:
        for log in self.logs:
            log.close()
        self._same_files()
        self._open()

    def _same_files(self) -> None:
        pure_dir, compiled_dir = (os.path.join(self.root, name) for name in ("pure", "compiled"))
        names = sorted(n for n in os.listdir(pure_dir) if not n.startswith((".lock", "meta")))
        assert names == sorted(n for n in os.listdir(compiled_dir) if not n.startswith((".lock", "meta")))
        for name in names:
            with (
                open(os.path.join(pure_dir, name), "rb") as a,
                open(os.path.join(compiled_dir, name), "rb") as b,
            ):
                if name == CLEAN_SHUTDOWN_FILE:
                    # The store's copy, alike; the store's version names its own file.
                    pure, compiled = decode_marker(a.read()), decode_marker(b.read())
                    assert pure is not None and compiled is not None
                    assert pure.values == compiled.values
                else:
                    assert a.read() == b.read(), name

    @invariant()
    def same_state(self) -> None:
        if not self.logs:
            return
        pure, compiled_ = self.logs
        assert list(pure.producers()) == list(compiled_.producers())
        assert pure.last_stable_offset == compiled_.last_stable_offset
        assert pure.log_end_offset == compiled_.log_end_offset
        a, b = pure.active_segment, compiled_.active_segment
        skip = {cursor.SEG_WRITE_ADDR, cursor.SEG_MAPPED_BYTES, cursor.SEG_WRITE_FD, cursor.SEG_POPULATED}
        keep = [n for n in range(cursor.SEG_FIELDS) if n not in skip]
        assert a.cursor[keep].tolist() == b.cursor[keep].tolist()
        for x, y in ((a.offset_index, b.offset_index), (a.time_index, b.time_index)):
            assert x.entries == y.entries
            assert [x._entry(n) for n in range(x.entries)] == [y._entry(n) for n in range(y.entries)]

    def teardown(self) -> None:
        for log in self.logs:
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)


TestPurePathAndCompiledPathAgree = needs_compiled(PurePathAndCompiledPathAgree.TestCase)
TestPurePathAndCompiledPathAgree.settings = settings(
    max_examples=120, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_leaders_negative_base_sequence_answers_a_retry_the_same_before_and_after_a_reopen(
    tmp_path: Any,
) -> None:
    # The row keeps last sequence 2^31-5 and derives the first from it; the hot cache must agree.
    leader = encode_batch([(b"k", b"v")], producer_id=3, producer_epoch=0, base_sequence=-5, timestamp_ms=T0)
    retry = _batch(3, 2**31 - 5)
    answers = []
    for pure in (True, False):
        with compiled_append.forced_pure(pure):
            log = Log.open(tmp_path / f"log-{pure}", clock=lambda: T0)
        log.append_batches([leader], origin="replication")
        before = _outcome(lambda log=log: log.append(retry))  # type: ignore[misc]
        log.close()
        with compiled_append.forced_pure(pure):
            log = Log.open(tmp_path / f"log-{pure}", clock=lambda: T0)
        answers += [before, _outcome(lambda log=log: log.append(retry))]  # type: ignore[misc]
        log.close()
    assert answers == [("ok", (0, 0, -1, True))] * 4


_FILE_SIZE_LIMIT_CHILD = """
import errno, resource, signal, sys
from oncelog import Log, LogConfig, encode_batch, compiled_append
from oncelog.errors import LogFailedError
assert compiled_append.enabled()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit is EFBIG, not a kill
path = sys.argv[1]
log = Log.open(path, LogConfig(segment_bytes=64 * 1024 * 1024))
resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 1024 * 1024 + 100, resource.RLIM_INFINITY))
acked = []
try:
    for n in range(1000):
        batch = encode_batch([(b"k", bytes([n % 256]) * (16 * 1024 if n % 3 else 100))], timestamp_ms=1)
        acked.append((log.append(batch).first_offset, batch[17:]))
    raise AssertionError("no write failed")
except LogFailedError as exc:
    assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EFBIG, repr(exc.__cause__)
try:
    log.append(encode_batch([(b"k", b"v")], timestamp_ms=1))
    raise AssertionError("a failed log took an append")
except LogFailedError:
    pass
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
try:
    log.close()
except LogFailedError:
    pass
log = Log.open(path)
for offset, body in acked:
    assert log.read(offset, 1).batches[0].buffer.tobytes()[17:] == body, offset
print(len(acked), log.log_end_offset)
"""


@needs_compiled
def test_a_file_size_limit_hit_by_a_compiled_pwritev_fails_the_log_and_keeps_every_ack(tmp_path: Any) -> None:
    # RLIMIT_FSIZE makes the write that crosses it fail with EFBIG, as a full disk fails it
    # with ENOSPC: the compiled write declines, the Python path writes again and fails the log.
    run = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT_CHILD, str(tmp_path / "log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    acked, end = map(int, run.stdout.split())
    assert acked > 100 and end == acked


@needs_compiled
def test_new_producers_past_the_pid_maps_first_range_are_all_kept_through_growth_and_a_reopen(
    tmp_path: Any,
) -> None:
    # The map's range in use grows in Python (the compiled path hands over the append that
    # would pass its load): every producer before and after each step still dedupes its retry.
    producers = 3 * pid_map.FIRST_BUCKETS
    log = Log.open(tmp_path / "log", clock=lambda: T0)
    firsts = [log.append(_batch(1000 + 17 * n, 0)).first_offset for n in range(producers)]
    assert log._producers._slots.buckets > pid_map.FIRST_BUCKETS
    for reopen in (False, True):
        if reopen:
            log.close()
            log = Log.open(tmp_path / "log", clock=lambda: T0)
        retries = [log.append(_batch(1000 + 17 * n, 0)) for n in range(producers)]
        assert [(r.first_offset, r.duplicate) for r in retries] == [(first, True) for first in firsts]
    log.close()
