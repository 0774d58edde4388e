"""The real `oncelog demo` (what `make demo` runs) passes its own checks."""

from __future__ import annotations

import io
from pathlib import Path

from oncelog.demo import run_demo


def test_the_demo_recovers_every_acknowledged_batch_and_answers_retries_as_duplicates(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(str(tmp_path / "demo"), out) == 0
    text = out.getvalue()
    assert "FAILED" not in text
    assert "InvalidProducerEpochError" in text and "OutOfOrderSequenceError" in text
    assert "clean=False" in text and "scanned=1" in text
    assert "every acknowledged batch is at its offset: True" in text
    assert text.count("duplicates at original offsets") == 3
    assert ": False" not in text
