"""The unsent-bytes budget's rules, one by one (engine/server/unsent.py)."""

from __future__ import annotations

import asyncio

import pytest

from oncelog.server.unsent import UnsentBytes


def test_a_reservation_takes_what_is_free_once_its_minimum_is_and_nothing_before() -> None:
    unsent = UnsentBytes(100)
    assert unsent.reserve(60, 10) == 60
    assert unsent.reserve(60, 50) == 0  # 40 free, 50 needed: nothing taken
    assert unsent.reserve(60, 40) == 40  # all that is free
    assert (unsent.held_bytes, unsent.peak_bytes) == (100, 100)


def test_alone_a_reservation_gets_the_whole_budget_whatever_its_minimum() -> None:
    unsent = UnsentBytes(100)
    assert unsent.reserve(500, 300) == 100


def test_a_holding_grows_past_what_is_free_only_when_it_is_all_that_is_held() -> None:
    unsent = UnsentBytes(100)
    alone = unsent.reserve(90, 1)
    assert unsent.grow(alone, 50)  # a batch larger than the budget still goes out
    assert unsent.held_bytes == 140
    unsent.release(140)
    first, second = unsent.reserve(50, 1), unsent.reserve(40, 1)
    assert not unsent.grow(second, 20)  # 10 free, another holding: refused, nothing taken
    assert unsent.grow(second, 10)
    assert unsent.held_bytes == first + second + 10 == 100


def test_small_responses_are_counted_whatever_is_free() -> None:
    unsent = UnsentBytes(100)
    unsent.reserve(100, 1)
    unsent.take(30)
    assert (unsent.held_bytes, unsent.free_bytes(), unsent.peak_bytes) == (130, 0, 130)


def test_a_wait_for_room_ends_when_enough_is_released_or_nothing_is_held() -> None:
    async def scenario() -> None:
        unsent = UnsentBytes(100)
        unsent.reserve(80, 1)
        unsent.take(10)
        wants_50, wants_30 = unsent.room(50), unsent.room(30)
        assert unsent.waiting == 2
        unsent.release(10)  # 20 free: neither
        assert not wants_50.done() and not wants_30.done()
        unsent.release(20)  # 40 free
        assert wants_30.done() and not wants_50.done()
        unsent.release(60)  # nothing held
        assert wants_50.done() and unsent.waiting == 0
        assert unsent.room(1000).done()  # nothing held: no wait whatever the size

    asyncio.run(scenario())


def test_a_shutdown_wakes_every_waiting_fetch_and_a_timed_out_wait_is_forgotten() -> None:
    async def scenario() -> None:
        unsent = UnsentBytes(100)
        unsent.reserve(100, 1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(unsent.room(50), 0)
        assert unsent.waiting == 0
        waiting = unsent.room(50)
        unsent.wake_all()
        assert waiting.done() and unsent.waiting == 0

    asyncio.run(scenario())


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        UnsentBytes(0)
