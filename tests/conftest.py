"""Suite-wide checks.

The compatibility tests read real Kafka partition directories from
../shared/fixtures/kafka (or $ONCELOG_FIXTURES). Without them those tests would
prove nothing, so a missing fixture tree fails the run instead of skipping.
"""

from __future__ import annotations

import pytest
from kafka_fixtures import kafka_fixtures_root


def pytest_sessionstart(session: pytest.Session) -> None:
    root = kafka_fixtures_root()
    if not any(root.glob("*/*/*.log")):
        raise pytest.UsageError(
            f"no Kafka fixtures under {root}: run from a checkout with ../shared beside it "
            "or set ONCELOG_FIXTURES to the directory holding <cluster>/<topic-partition>/*.log"
        )
