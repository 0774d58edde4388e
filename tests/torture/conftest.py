"""What every torture test shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def quiet_recovery_logs() -> Iterator[None]:
    # Recovery warns for every torn tail it cuts; thousands of crash states would flood the output.
    logger = logging.getLogger("oncelog")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)
