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
