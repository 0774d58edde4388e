"""Fixtures for the wire front end: a real `oncelog serve` process per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import ServeProcess


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One server for the module's tests; each test uses its own topics."""
    root: Path = tmp_path_factory.mktemp("serve-root")
    with ServeProcess(root) as server:
        yield server
