"""Exactly once through `oncelog serve`: transactions of a consume-transform-produce app under SIGKILLs.

A confluent-kafka app (eos_app.py: a read_committed group consumer and a transactional producer
that commits the consumer's offsets in each transaction) maps numbered input records to output
records while the server and the app are each SIGKILLed at seeded random moments and restarted;
then every input must have exactly one committed output, and the group's committed offsets must be
the input's ends. See eos_driver for the scenario and its knobs (ONCELOG_EOS_MESSAGES,
ONCELOG_EOS_KILLS, ONCELOG_EOS_SEED); `python tests/server/eos_driver.py --mock` runs the app and
the checks against librdkafka's mock cluster instead.
"""

from __future__ import annotations

from pathlib import Path

from eos_driver import EosConfig, count_outputs, run_eos


def test_transactions_survive_server_and_app_kills_with_every_input_processed_exactly_once(
    tmp_path: Path,
) -> None:
    config = EosConfig.from_env(messages=5000, kills=3)
    outcome = run_eos(tmp_path, config)
    print(outcome.report(), flush=True)
    assert not outcome.problems, outcome.report()
    assert len(outcome.kills) == config.server_kills + config.app_kills, outcome.report()
    assert outcome.counts is not None and outcome.counts.read == config.messages, outcome.report()


def test_the_count_maps_outputs_back_to_inputs_and_finds_duplicates_gaps_and_strays() -> None:
    records = [(b"0", b"out:0"), (b"1", b"out:1"), (b"1", b"out:1"), (b"3", b"out:3"), (b"3", b"out:3")]
    records += [(b"3", b"out:3"), (b"2", b"2"), (b"9", b"out:4"), (b"7", b"out:7")]
    counts = count_outputs(5, records)
    assert counts.read == 9
    assert counts.duplicated == [(1, 2), (3, 3)]
    assert counts.missing == [2, 4]
    assert len(counts.strays) == 3  # no "out:" prefix, a key that is not its number, a number past the input
