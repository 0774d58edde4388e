"""wait_while_locked: bounded waiting for a lock another process holds briefly."""

from __future__ import annotations

import pytest

from oncelog import lock_wait
from oncelog.errors import LockTimeoutError, LogDirLockedError


class FakeTime:
    """A monotonic clock that only sleeping moves."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(lock_wait, "time", fake)
    return fake


def always_locked() -> None:
    raise LogDirLockedError("t-0 is locked")


def test_the_wait_ends_exactly_at_the_deadline_never_after(fake_time: FakeTime) -> None:
    with pytest.raises(LockTimeoutError, match=r"partitions: t-0 is locked \(still locked after 0.25 s\)"):
        lock_wait.wait_while_locked("partitions", always_locked, 0.25)
    assert fake_time.now_s == pytest.approx(100.25)  # the last pause was cut to what was left
    assert fake_time.sleeps[:3] == [
        lock_wait.FIRST_PAUSE_S,
        2 * lock_wait.FIRST_PAUSE_S,
        4 * lock_wait.FIRST_PAUSE_S,
    ]
    assert max(fake_time.sleeps) <= lock_wait.MAX_PAUSE_S


def test_a_lock_released_while_waiting_is_taken(fake_time: FakeTime) -> None:
    attempts = iter([LogDirLockedError("held"), LogDirLockedError("held"), None])

    def attempt() -> str:
        error = next(attempts)
        if error is not None:
            raise error
        return "locked it"

    assert lock_wait.wait_while_locked("t-0", attempt, 10.0) == "locked it"
    assert len(fake_time.sleeps) == 2


def test_a_zero_timeout_tries_once(fake_time: FakeTime) -> None:
    with pytest.raises(LockTimeoutError):
        lock_wait.wait_while_locked("t-0", always_locked, 0.0)
    assert fake_time.sleeps == []


def test_the_timeout_is_both_a_lock_error_and_a_timeout() -> None:
    assert issubclass(LockTimeoutError, LogDirLockedError) and issubclass(LockTimeoutError, TimeoutError)
