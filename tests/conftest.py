"""Suite-wide checks, and how the suite's units of work are shared by two workers.

The compatibility tests read real Kafka partition directories from
../shared/fixtures/kafka (or $ONCELOG_FIXTURES). Without them those tests would
prove nothing, so a missing fixture tree fails the run instead of skipping.

`make test` runs the suite on two pytest-xdist workers with `--dist loadscope`, which
this file's scheduler (HeavyFirstScheduling) carries out: each module is one unit of
work, run on one worker, so that its module fixtures (a server, a Spark cluster) start
once; a test function named in HEAVY_S is a unit of its own (its parameters shared out).
Units go out heaviest first, by HEAVY_S (tests/work_units.py), so that no long unit
starts last while the other worker idles. (Not `--dist loadgroup`: pytest 9.2 ignores the
node ids xdist 3.8 renames for it, and every test became a unit, its module fixtures
started on both workers.)
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka_fixtures import kafka_fixtures_root
from work_units import unit_of, weight_s
from xdist.scheduler import LoadScopeScheduling


class HeavyFirstScheduling(LoadScopeScheduling):
    """xdist's loadscope with this suite's units (unit_of); units go out in collection
    order (`--no-loadscope-reorder`), which pytest_collection_modifyitems sorts."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(optionalhook=True)  # (a run with -p no:xdist does not know the hook)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadscope":
        return None  # another distribution asked for: xdist's own
    return HeavyFirstScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest unit first (stable: a unit's tests keep their order, and stay together)."""
    first_seen: dict[str, int] = {}
    for n, item in enumerate(items):
        first_seen.setdefault(unit_of(item.nodeid), n)

    def order(item: pytest.Item) -> tuple[float, int]:
        unit = unit_of(item.nodeid)
        return -weight_s(unit), first_seen[unit]

    items.sort(key=order)


def pytest_sessionstart(session: pytest.Session) -> None:
    root = kafka_fixtures_root()
    if not any(root.glob("*/*/*.log")):
        raise pytest.UsageError(
            f"no Kafka fixtures under {root}: run from a checkout with ../shared beside it "
            "or set ONCELOG_FIXTURES to the directory holding <cluster>/<topic-partition>/*.log"
        )
