"""A Ctrl-C (or any exception) between a write and its producer state, or in a roll, fails the log closed.

A KeyboardInterrupt lands wherever the main thread is running Python. Inside the
Python append path, between the write of a batch into the segment and the update of
its producer's state, it would leave a batch the state does not know: a clean close
would then write a snapshot that does not match the segment, and a retry of that
batch would be taken again (a duplicate). In the middle of a roll, a sealed segment
the compiled appender may still be bound to, or a recovery point past a segment the
log does not list. So whatever escapes there marks the log failed and goes on
unchanged: appends are refused, close() leaves no clean-shutdown marker, and the next
open recovers as after a kill (its recovery report says unclean). A Ctrl-C before
anything is written changes nothing: the log goes on and closes cleanly.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog import compiled_append
from oncelog.config import LogConfig
from oncelog.errors import LogFailedError
from oncelog.log import Log
from oncelog.producer_state import ProducerStateManager
from oncelog.segments.batch import encode_batch
from oncelog.segments.segment import LogSegment
from oncelog.storage import snapshot as snapshots

T0 = 1_700_000_000_000
PID = 7
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def batch(sequence: int, value_size: int = 300) -> bytes:
    """Producer PID's batch at `sequence`; each is past the index interval, so each is indexed."""
    return encode_batch(
        [(b"k", b"v" * value_size)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=sequence,
        timestamp_ms=T0 + sequence,
    )


def interrupt_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, *, after: bool = False) -> None:
    """`owner.name` raises KeyboardInterrupt at its next call: before running, or after (`after`)."""
    real: Callable[..., Any] = getattr(owner, name)
    calls: list[None] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if calls:
            return real(*args, **kwargs)
        calls.append(None)
        if after:
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, name, interrupted)


@pytest.fixture(params=["python", "compiled"])
def route(request: pytest.FixtureRequest) -> Iterator[str]:
    """The log's route: forced to Python, or compiled where built (rolls go through Python anyway)."""
    with compiled_append.forced_pure(request.param == "python"):
        yield request.param


def fails_closed_and_recovers(log: Log, directory: Path, retry: bytes, end: int) -> Log:
    """The log refuses appends and closes without its marker; the reopen is unclean, ends at
    `end`, and answers `retry` (a batch written before the interrupt) as a duplicate."""
    with pytest.raises(LogFailedError, match="refuses appends until reopened"):
        log.append(batch(99))
    with pytest.raises(LogFailedError, match="without a flush"):
        log.close()
    reopened = Log.open(directory, CONFIG)
    assert not reopened.recovery_report.clean
    assert reopened.log_end_offset == end
    again = reopened.append(retry)
    assert again.duplicate, again
    return reopened


class TestBetweenTheWriteAndTheProducerState:
    @pytest.mark.parametrize(
        ("where", "owner", "name", "after"),
        [
            ("in the segment write, after the bytes", LogSegment, "_index_batch", True),
            ("before the producer state", Log, "_publish", False),
            ("in the producer state update", ProducerStateManager, "put", True),
        ],
    )
    @pytest.mark.parametrize("call", ["append", "append_batches"])
    def test_a_ctrl_c_fails_the_log_and_the_reopen_recovers_it_as_after_a_kill(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        where: str,
        owner: Any,
        name: str,
        after: bool,
        call: str,
    ) -> None:
        with compiled_append.forced_pure():  # (the compiled append runs no Python in this window)
            log = Log.open(tmp_path, CONFIG)
        log.append(batch(0))
        interrupt_once(monkeypatch, owner, name, after=after)
        with pytest.raises(KeyboardInterrupt):
            if call == "append":
                log.append(batch(1))
            else:
                log.append_batches([batch(1)])
        monkeypatch.undo()
        # The batch was written before the interrupt: the reopen finds it, and its retry is a duplicate.
        with fails_closed_and_recovers(log, tmp_path, batch(1), end=2) as reopened:
            assert reopened.append(batch(2)).first_offset == 2

    def test_a_ctrl_c_before_anything_is_written_changes_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with compiled_append.forced_pure():
            log = Log.open(tmp_path, CONFIG)
        log.append(batch(0))
        interrupt_once(monkeypatch, Log, "_plan")
        with pytest.raises(KeyboardInterrupt):
            log.append_batches([batch(1)])
        monkeypatch.undo()
        assert log.append(batch(1)).first_offset == 1
        log.close()
        with Log.open(tmp_path, CONFIG) as reopened:
            assert reopened.recovery_report.clean
            assert reopened.log_end_offset == 2


class TestInTheMiddleOfARoll:
    @pytest.mark.parametrize(
        ("where", "owner", "name"),
        [
            ("writing the snapshot at the new base", snapshots, "write_snapshot"),
            ("committing the recovery point", Log, "_set_recovery_point"),
            ("after the new segment is listed", Log, "_watch_index_maps"),
            ("binding the compiled append to the new segment", Log, "_bind_compiled"),
        ],
    )
    def test_a_ctrl_c_fails_the_log_and_the_reopen_recovers_it_as_after_a_kill(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        route: str,
        where: str,
        owner: Any,
        name: str,
    ) -> None:
        log = Log.open(tmp_path, CONFIG)
        sequence = 0
        while log.active_segment.size + len(batch(sequence, 1000)) <= CONFIG.segment_bytes:
            log.append(batch(sequence, 1000))
            sequence += 1
        interrupt_once(monkeypatch, owner, name)
        with pytest.raises(KeyboardInterrupt):
            log.append(batch(sequence, 1000))  # rolls first
        monkeypatch.undo()
        # The interrupted batch was never written; the last one before it answers as a duplicate.
        with fails_closed_and_recovers(log, tmp_path, batch(sequence - 1, 1000), end=sequence) as reopened:
            assert reopened.append(batch(sequence, 1000)).first_offset == sequence

    def test_a_roll_that_is_not_interrupted_still_closes_cleanly(self, tmp_path: Path, route: str) -> None:
        with Log.open(tmp_path, CONFIG) as log:
            for sequence in range(10):
                log.append(batch(sequence, 1000))
            assert len(log.segments) > 1
        with Log.open(tmp_path, CONFIG) as reopened:
            assert reopened.recovery_report.clean
            assert reopened.log_end_offset == 10


class TestInTheMiddleOfExpiry:
    """Found by a red-team helper: expiry empties a run of the ring before it moves the live
    producers of that run to the tail. A Ctrl-C in between left them out of the table; the
    clean close then wrote that table, and a retry of their acknowledged batches was stored
    again. Now whatever escapes expiry (or making room, or retiring) fails the log closed."""

    EXPIRATION = LogConfig(producer_expiration_ms=10_000)
    PRODUCERS = 40

    @staticmethod
    def idempotent(pid: int, sequence: int) -> bytes:
        return encode_batch(
            [(b"k", b"v%d" % sequence)], producer_id=pid, producer_epoch=0, base_sequence=sequence
        )

    def live_producers_due_for_a_second_chance(self, directory: Path, clock: list[int]) -> Log:
        """Every producer appended at T0 and again at T0 + 9 s; at T0 + 10.5 s the ring's head
        is due, every producer in it live: expiry keeps them all, moving each."""
        log = Log.open(directory, self.EXPIRATION, clock=lambda: clock[0])
        for sequence, at in enumerate((T0, T0 + 9_000)):
            clock[0] = at
            for pid in range(1, self.PRODUCERS + 1):
                log.append(self.idempotent(pid, sequence))
        clock[0] = T0 + 10_500
        return log

    def interrupt_expiry_at(self, directory: Path, line: int) -> bool:
        """A Ctrl-C at `line` of expiry, in the append that runs it, then close and reopen:
        every producer's last batch is still a duplicate. Whether the line was reached."""
        code = ProducerStateManager.expire.__code__
        clock = [T0]
        reached = False

        def at_line(frame: Any, event: str, _: Any) -> Any:
            if event == "line" and frame.f_lineno == line:
                raise KeyboardInterrupt
            return at_line

        with compiled_append.forced_pure():
            log = self.live_producers_due_for_a_second_chance(directory, clock)
            sys.settrace(lambda frame, event, arg: at_line if frame.f_code is code else None)
            try:
                log.append(self.idempotent(self.PRODUCERS + 1, 0))  # expiry runs first
            except KeyboardInterrupt:
                reached = True
            finally:
                sys.settrace(None)
            with contextlib.suppress(LogFailedError):
                log.close()
            with Log.open(directory, self.EXPIRATION, clock=lambda: clock[0]) as reopened:
                for pid in range(1, self.PRODUCERS + 1):
                    retry = reopened.append(self.idempotent(pid, 1))
                    assert retry.duplicate and retry.first_offset == self.PRODUCERS + pid - 1, (line, pid)
        return reached

    def test_a_ctrl_c_at_any_line_of_expiry_loses_no_producer_after_the_reopen(self, tmp_path: Path) -> None:
        code = ProducerStateManager.expire.__code__
        lines = sorted({line for _, _, line in code.co_lines() if line and line > code.co_firstlineno})
        reached = [line for line in lines if self.interrupt_expiry_at(tmp_path / f"line-{line}", line)]
        assert len(reached) >= 10  # (the loop body's lines were reached: the sweep means something)

    @pytest.mark.parametrize(
        ("what", "name", "call"),
        [
            ("expiry before an append", "expire_due", lambda log: log.append(batch(2))),
            ("an explicit expiry", "expire", lambda log: log.expire_producers()),
        ],
    )
    def test_whatever_escapes_expiry_fails_the_log_closed(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        route: str,
        what: str,
        name: str,
        call: Callable[[Log], object],
    ) -> None:
        # PID appends at T0 and T0 + 9 s, producer 99 at T0: at T0 + 10.5 s expiry is due (the
        # compiled append hands a due expiry to the Python route), 99 goes and PID stays.
        clock = [T0]
        log = Log.open(tmp_path, self.EXPIRATION, clock=lambda: clock[0])
        log.append(batch(0))
        log.append(self.idempotent(99, 0))
        clock[0] = T0 + 9_000
        log.append(batch(1))
        clock[0] = T0 + 10_500
        interrupt_once(monkeypatch, ProducerStateManager, name)
        with pytest.raises(KeyboardInterrupt):
            call(log)
        monkeypatch.undo()
        with fails_closed_and_recovers(log, tmp_path, batch(1), end=3):
            pass

    def test_whatever_escapes_retiring_fails_the_log_closed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
    ) -> None:
        log = Log.open(tmp_path, CONFIG)
        log.append(batch(0))
        interrupt_once(monkeypatch, ProducerStateManager, "retire")
        with pytest.raises(KeyboardInterrupt):
            log.retire_producers([PID])
        monkeypatch.undo()
        with pytest.raises(LogFailedError, match="refuses appends until reopened"):
            log.append(batch(1))
        with pytest.raises(LogFailedError, match="without a flush"):
            log.close()
        # The retirement was durable before the table changed: the reopen recovers it retired.
        with Log.open(tmp_path, CONFIG) as reopened:
            assert not reopened.recovery_report.clean
            assert reopened.producer_state(PID) is None


class TestAsTheCloseBegins:
    def test_a_ctrl_c_before_the_close_began_lets_a_later_close_close_the_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Found by a red-team helper: the close was marked begun, so the second close()
        # returned at once and left the log open, its directory locked.
        log = Log.open(tmp_path, CONFIG)
        log.append(batch(0))
        interrupt_once(monkeypatch, Log, "_close")
        with pytest.raises(KeyboardInterrupt):
            log.close()
        monkeypatch.undo()
        log.close()
        with Log.open(tmp_path, CONFIG) as reopened:  # (the directory's lock was let go of)
            assert reopened.recovery_report.clean
            assert reopened.append(batch(0)).duplicate
