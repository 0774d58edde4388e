"""Where the real Kafka partition directories are (../shared/fixtures/kafka or $ONCELOG_FIXTURES).

A module of its own, not conftest: two conftest modules (tests/ and tests/spark/) would
collide under the one name `conftest` when a test imports from it.
"""

from __future__ import annotations

import os
from pathlib import Path


def kafka_fixtures_root() -> Path:
    configured = os.environ.get("ONCELOG_FIXTURES")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "kafka"
