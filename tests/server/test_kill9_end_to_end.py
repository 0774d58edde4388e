"""SIGKILL of `oncelog serve` mid-stream: nothing acknowledged is lost, nothing is duplicated.

Two idempotent producers (confluent-kafka and kafka-python, acks=all, unlimited retries) stream
uniquely numbered messages while the server is SIGKILLed at seeded random moments and restarted on
its port (half the kills first hold back a Produce acknowledgement, so the retried batch must be
answered as a duplicate); a consumer then reads every partition from offset 0. See kill9_driver
for the scenario and its knobs (ONCELOG_KILL9_MESSAGES, ONCELOG_KILL9_KILLS, ONCELOG_KILL9_SEED);
`make serve-soak` runs the long variant.
"""

from __future__ import annotations

import collections
from pathlib import Path

from kill9_driver import (
    CLIENTS,
    CREATE_TIME_2023_MS,
    Kill9Config,
    Kill9Outcome,
    count_copies,
    parse_value,
    run_kill9,
    value_of,
)


def _run_and_check(tmp_path: Path, config: Kill9Config) -> Kill9Outcome:
    print(f"\nkill -9 scenario {config.name!r}: seed {config.seed}", flush=True)
    outcome = run_kill9(tmp_path, config)
    print(outcome.report(), flush=True)
    assert not outcome.problems, outcome.report()
    assert len(outcome.kills) == config.kills, outcome.report()
    assert set(outcome.counts) == set(CLIENTS), outcome.report()
    return outcome


def test_kill9_mid_stream_keeps_every_acknowledged_message_exactly_once(tmp_path: Path) -> None:
    _run_and_check(tmp_path, Kill9Config.from_env("send-time"))


def test_kill9_mid_stream_keeps_explicit_2023_create_times_and_every_acknowledged_message_once(
    tmp_path: Path,
) -> None:
    outcome = _run_and_check(
        tmp_path, Kill9Config.from_env("create-2023", timestamp_base=CREATE_TIME_2023_MS)
    )
    assert all(counts.wrong_timestamp == 0 for counts in outcome.counts.values()), outcome.report()


def test_the_count_calls_a_missing_acknowledged_message_lost_and_a_second_copy_a_duplicate() -> None:
    # Messages 0-3 sent; 0, 1 and 2 acknowledged, 3 failed. Read: 0 twice, 2 once, 3 once.
    reports = {"sent": 4, "acked": [0, 1, 2], "failed": [3], "errors": {"timed out": 1}}
    counts = count_copies("confluent", reports, collections.Counter({0: 2, 2: 1, 3: 1}))
    assert (counts.sent, counts.acked, counts.failed, counts.found) == (4, 3, 1, 3)
    assert (counts.duplicates, counts.duplicate_examples) == (1, [0])
    assert (counts.lost, counts.lost_examples) == (1, [1])
    assert counts.unacked_found == 1


def test_message_values_name_their_client_and_number() -> None:
    assert value_of("confluent", 123) == b"confluent-000123"
    assert parse_value(b"kafka-python-000123") == ("kafka-python", 123)
    assert parse_value(b"someone-else-000001") is None
