"""Shared fixtures for the micro-benchmarks (run with `make bench`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import LogConfig
from oncelog.log import Log

# Large segments so a roll never lands inside a timed loop.
BENCH_CONFIG = LogConfig(segment_bytes=1024 * 1024 * 1024)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    opened = Log.open(tmp_path / "bench-0", BENCH_CONFIG)
    yield opened
    opened.close()
