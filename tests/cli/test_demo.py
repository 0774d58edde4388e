"""The real `oncelog demo` (what `make demo` runs) passes its own checks and shows what it should."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from oncelog.cli.demo import run_demo


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One run of the demo (it takes a few seconds), shared by the tests below."""
    out = io.StringIO()
    status = run_demo(str(tmp_path_factory.mktemp("demo") / "demo"), out)
    text = out.getvalue()
    assert status == 0, text
    assert "FAILED" not in text
    return text


def test_the_demo_recovers_every_acknowledged_batch_and_answers_retries_as_duplicates(
    demo_output: str,
) -> None:
    text = demo_output
    assert "InvalidProducerEpochError" in text and "OutOfOrderSequenceError" in text
    # A LogManager with a few topics: every partition recovers from its tail only.
    assert "recovered 5 partitions" in text and "0 clean, 5 unclean" in text
    for tp in ("orders-0", "orders-1", "orders-2", "payments-0", "rules-0"):
        assert re.search(rf"   {tp}: clean=False segments=\d+ scanned=1 ", text), tp
    assert "every acknowledged batch is at its offset: True" in text
    assert text.count("duplicates at original offsets") == 9  # 3 producers x 3 partitions
    assert ": False" not in text


def test_the_demo_shows_an_open_an_aborted_and_a_committed_transaction(demo_output: str) -> None:
    text = demo_output
    # The child's transaction survives the SIGKILL: the LSO stays at its first offset.
    opened = re.search(r"producer (\d+)'s transaction, opened at offset (\d+), was never committed", text)
    assert opened is not None
    pid, first = opened.groups()
    assert f"payments-0: last stable offset {first}: the child's transaction is still open" in text
    assert f"payments-0 producer {pid}: epoch 0, last seq 0 at offset {first}, " in text
    assert f"transaction open since offset {first}" in text
    assert "5. Transactions in payments-0" in text
    assert "the coordinator aborts the child's transaction: ABORT marker at offset" in text
    # Then another producer's transaction is aborted, and its next one committed.
    txn = re.search(r"in a transaction at offsets (\d+)-(\d+): LSO (\d+) while it is open", text)
    assert txn is not None
    start, end, lso = (int(group) for group in txn.groups())
    assert (end - start, lso) == (2, start)
    assert f"ABORT (coordinator epoch 1) at offset {end + 1}; 2 more records at {end + 2}-{end + 3}, " in text
    assert f"COMMIT at {end + 4}: LSO {end + 5} (= log end)" in text
    committed = re.search(rf"read_committed from {start}: +(.*), aborted_transactions (.*)", text)
    assert committed is not None
    assert committed.group(1) == "['committed-0', 'committed-1']"
    assert re.fullmatch(rf"\[\(\d+, {start}\)\]", committed.group(2))
    everything = ["aborted-0", "aborted-1", "aborted-2", "committed-0", "committed-1"]
    assert f"read_uncommitted from {start}: {everything}" in text
    assert "all but the 4 aborted ones: True" in text
    assert "tail -n 16   # the markers and the .txnindex" in text


def test_the_demo_streams_a_kafka_client_through_serve_across_sigkills_with_no_loss_or_duplicates(
    demo_output: str,
) -> None:
    text = demo_output
    assert "6. Kafka clients over the wire" in text
    kills = re.findall(r"SIGKILL with (\d+) acknowledged and (\d+) in flight", text)
    assert len(kills) == 2 and all(int(in_flight) > 0 for _, in_flight in kills), kills
    assert text.count("restarted on the same port: recovered 1 partitions") == 2
    assert "producer: 20000 sent, 20000 acknowledged, 0 failed, 0 in flight" in text
    assert "consumer (assign, from offset 0): 20000 records; duplicates 0, lost 0" in text
    assert "exited 0" in text


def test_the_demo_shows_each_fence_refusing_a_zombie_kafka_client(demo_output: str) -> None:
    text = demo_output
    assert "7. The three fences, with real clients: sequence, epoch, generation" in text
    step = text[text.index("7. The three fences") :]
    # (a) sequence: the acknowledgement was lost, the retry answered with the original offset, stored once.
    retried = re.search(
        r"answered as a duplicate, delivery report offset (\d+); copies in fences-seq-0: 1\n", step
    )
    assert retried is not None, step
    offset = retried.group(1)
    stored = re.search(
        rf"fences-seq-0 holds 'probe' once \(offset {offset}: producer (\d+) epoch 0 seq 3\)", step
    )
    assert stored is not None, step
    # (b) epoch: the first incarnation cannot commit; only the second one's records are read_committed.
    assert re.search(
        r"A's commit_transaction -> FATAL (_FENCED|PRODUCER_FENCED|INVALID_PRODUCER_EPOCH)", step
    )
    assert "read_committed: ['B-0', 'B-1'] (read_uncommitted: ['A-0', 'A-1', 'A-2', 'B-0', 'B-1'])" in step
    epochs = re.search(
        r"epochs: A's records (\d+), the ABORT marker (\d+), B's records (\d+), COMMIT (\d+)", step
    )
    assert epochs is not None, step
    a, abort, b, commit = (int(epoch) for epoch in epochs.groups())
    assert a < abort <= b == commit
    # (c) generation: c1 is dropped while it stalls, c2 takes every partition in a later generation,
    # and c1's late commit is refused by the server, leaving c2's offsets.
    joined = re.search(
        r"consumer c1 joins group 'fences' \(generation (\d+)\), is assigned fences-gen \[0, 1\]", step
    )
    took_over = re.search(r"c2 joins \(generation (\d+)\), is assigned \[0, 1\], reads 10 from each", step)
    assert joined is not None and took_over is not None, step
    assert int(took_over.group(1)) > int(joined.group(1))
    assert "c1 stalls (the relay holds its bytes) and commits {0: 5, 1: 5}" in step
    assert "commits {0: 10, 1: 10}" in step
    refused = re.search(
        rf"its late commit \(generation {joined.group(1)}\) -> (UNKNOWN_MEMBER_ID|ILLEGAL_GENERATION)", step
    )
    assert refused is not None, step
    assert "the group's committed offsets stay {0: 10, 1: 10}" in step


def test_without_confluent_kafka_the_demo_skips_its_kafka_steps_names_the_extra_once_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As installed without the `kafka` extra: `import confluent_kafka` fails.
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    out = io.StringIO()
    status = run_demo(str(tmp_path / "demo"), out)
    text = out.getvalue()
    assert status == 0, text
    assert "FAILED" not in text and "every acknowledged batch is at its offset: True" in text
    assert "6. Kafka clients" not in text and "7. The three fences" not in text
    hints = [line for line in text.splitlines() if "oncelog[kafka]" in line or "confluent-kafka" in line]
    assert hints == [
        "Skipped (not failed) steps 6 and 7, real Kafka clients through `oncelog serve`: "
        "they need confluent-kafka: pip install 'oncelog[kafka]'"
    ]
    assert text.rstrip("\n").endswith(hints[0])


def test_a_second_demo_run_reuses_the_directory_of_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # (steps 1-5 leave every kind of root entry)
    for run in range(2):
        out = io.StringIO()
        assert run_demo(str(tmp_path / "demo"), out) == 0, (run, out.getvalue())
