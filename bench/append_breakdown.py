"""Where a 170 B append's time goes: `python bench/append_breakdown.py [ROUNDS]`.

Prints the median and the spread (min-max over rounds) of microseconds per call for
`Log.append` and for the reference, one `os.write` of the same bytes to an O_APPEND
file, for plain and for idempotent batches, in alternating rounds of 20,000 calls in
one process; and for plain batches the bound compiled appender called directly (what
`Log.append` adds around it is the difference). Ratios of the bench's append rows follow from these;
the absolute times follow the CPU (see bench/README.md, "Performance, round 3").
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from oncelog import Log, LogConfig
from oncelog.bench.harness import batch_of_size, idempotent_batches

CALLS = 20_000


def _batches(producer: bool, first_sequence: int) -> list[bytes]:
    """The bench's 170-byte batches: one plain batch repeated, or one producer's in sequence."""
    if not producer:
        return [batch_of_size(170)] * CALLS
    return idempotent_batches(CALLS, first_sequence)


def _per_call_us(call: Callable[[bytes], object], batches: list[bytes]) -> float:
    started = time.perf_counter()
    for batch in batches:
        call(batch)
    return (time.perf_counter() - started) / len(batches) * 1e6


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        reference_fd = os.open(os.path.join(scratch, "reference"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for producer in (False, True):
            log = Log.open(os.path.join(scratch, f"log-{producer}"), LogConfig())
            sequence = 0

            calls: list[tuple[str, Callable[[bytes], object]]] = [("Log.append", log.append)]
            appender = log._compiled_for_append()  # (bound at the first append otherwise)
            if appender is not None and not producer:
                # Plain batches only: a None (the rare batch it leaves to Python) is not appended,
                # which a producer's next batch would take for a gap.
                calls.append(("compiled appender", appender.append))
            times: dict[str, list[float]] = {name: [] for name, _ in calls}
            times["os.write"] = []
            for _ in range(rounds + 1):  # the first round warms up
                for name, call in calls:
                    batches = _batches(producer, sequence)
                    sequence += CALLS
                    times[name].append(_per_call_us(call, batches))
                reference = _batches(False, 0)
                times["os.write"].append(_per_call_us(lambda b: os.write(reference_fd, b), reference))
            kind = "idempotent" if producer else "plain"
            for name, samples in times.items():
                kept = samples[1:]
                print(
                    f"{kind:10s} {name:18s} {statistics.median(kept):.3f} us "
                    f"({min(kept):.3f}-{max(kept):.3f})"
                )
            log.close()
        os.close(reference_fd)
    print(f"load average {os.getloadavg()[0]:.2f}, {rounds} rounds of {CALLS:,} calls")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
