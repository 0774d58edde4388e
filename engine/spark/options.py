"""The data source's options, Kafka-style, parsed and checked before any task runs.

Spark hands options over as a case-insensitive map with lower-cased keys; every
option is read here so that a typo or a bad value fails the query at planning time
with the option's name, not deep inside a task. An option this source does not take
fails too, naming the closest one it does (spark-sql-kafka's habit of ignoring
unknown options hides typos such as `startingOffset`).

The root path is made absolute here, on the driver: a relative path means the
driver's working directory, which executors do not share. Pure apart from reading
the working directory: no I/O.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from oncelog.errors import CorruptMetadataError, LogDirectoryError
from oncelog.layout import validate_topic_partition
from oncelog.spark.write_registry import check_write_id

Isolation = Literal["read_committed", "read_uncommitted"]
EARLIEST, LATEST = -2, -1  # Kafka's sentinels in JSON offsets
# An offset spec: "earliest", "latest", or per partition (absent partitions: the default).
OffsetSpec = int | dict[int, int]


SOURCE_NAME = "oncelog"  # the format name: spark.read.format(SOURCE_NAME)
_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() takes any script's
_PARTITION = re.compile(r"0|[1-9][0-9]*")


class OptionError(ValueError):
    """A missing or malformed option; the message names it."""


# Every option by its documented spelling (Spark lower-cases the keys it hands over).
COMMON_OPTIONS = ("path", "topic")
READ_OPTIONS = (
    "startingOffsets",
    "endingOffsets",
    "failOnDataLoss",
    "isolation",
    "minPartitions",
    "maxRecordsPerPartition",
    "maxOffsetsPerTrigger",
    "maxRowsPerBatch",
)
WRITE_OPTIONS = (
    "writeId",
    "numPartitions",
    "batchRecords",
    "maxPendingBytes",
    "lockTimeoutMs",
    "transactionTimeoutMs",
)
# Options Spark itself passes along to a source: the query's checkpoint (streaming writes),
# and the several paths of load(a, b) (refused below with a clearer message).
SPARK_OPTIONS = ("checkpointLocation", "paths")


@contextlib.contextmanager
def root_as_option() -> Iterator[None]:
    """A root that is missing or not a directory fails the query as a bad `path` (one line);
    a damaged id file (CorruptMetadataError) stays what it is."""
    try:
        yield
    except CorruptMetadataError:
        raise
    except LogDirectoryError as exc:
        raise OptionError(str(exc)) from None


def check_option_names(options: Mapping[str, str], *, reading: bool) -> None:
    """Refuse an option this direction does not take, naming the closest one that it does."""
    own = (*COMMON_OPTIONS, *(READ_OPTIONS if reading else WRITE_OPTIONS))
    other = WRITE_OPTIONS if reading else READ_OPTIONS
    by_key = {name.lower(): name for name in own}
    allowed = set(by_key) | {name.lower() for name in SPARK_OPTIONS}
    for key in sorted(options):
        if key.lower() in allowed:
            continue
        direction = "read" if reading else "write"
        if key.lower() in {name.lower() for name in other}:
            raise OptionError(f"option {key} is for {'writes' if reading else 'reads'}, not a {direction}")
        close = difflib.get_close_matches(key.lower(), list(by_key), n=1, cutoff=0.6)
        hint = f"; did you mean {by_key[close[0]]}?" if close else ""
        raise OptionError(
            f"unknown option {key} for an oncelog {direction}{hint} (options: {', '.join(own)})"
        )


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None else str(value)


def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = _get(options, name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw.strip()):
        raise OptionError(f"option {name} must be an integer, got {raw!r}")
    value = int(raw)
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, got {raw!r}")
    return raw.lower() == "true"


def root_path(options: Mapping[str, str]) -> str:
    """The root as an absolute path, resolved against the driver's working directory."""
    if _get(options, "paths") not in (None, "[]"):
        raise OptionError("load() takes one oncelog root, not several paths")
    path = _get(options, "path")
    if not path:
        raise OptionError("no path: load(root) / save(root) takes the oncelog root directory")
    # Joined, not normalised: a lexical ".." is wrong where the path crosses a symlink.
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def topic(options: Mapping[str, str]) -> str:
    name = _get(options, "topic")
    if name is None:
        raise OptionError('option topic is required: .option("topic", "orders")')
    try:
        validate_topic_partition(name, 0)
    except ValueError as exc:
        raise OptionError(f"option topic: {exc}") from None
    return name


def parse_offsets(raw: str | None, name: str, topic_name: str, default: int) -> OffsetSpec:
    """'earliest' / 'latest' / Kafka's JSON {"topic": {"0": 23, "1": -2}} (-2 earliest, -1 latest)."""
    if raw is None:
        return default
    text = raw.strip()
    if text.lower() == "earliest":
        return EARLIEST
    if text.lower() == "latest":
        return LATEST
    try:
        parsed = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKeyError as exc:
        raise OptionError(f"option {name}: {exc}") from None
    except json.JSONDecodeError:
        raise OptionError(f'option {name} must be "earliest", "latest" or JSON, got {raw!r}') from None
    if (
        not isinstance(parsed, dict)
        or set(parsed) != {topic_name}
        or not isinstance(parsed[topic_name], dict)
    ):
        raise OptionError(
            f'option {name} must be JSON of the form {{"{topic_name}": {{"0": 42}}}}, got {raw!r}'
        )
    offsets: dict[int, int] = {}
    for partition, offset in parsed[topic_name].items():
        if not _PARTITION.fullmatch(partition):
            raise OptionError(f"option {name}: partition {partition!r} is not a partition number")
        number = int(partition)
        # bool is an int to Python, not an offset to anyone.
        if type(offset) is not int or offset < EARLIEST:
            raise OptionError(f"option {name}: offset {offset!r} of partition {number} is not >= -2")
        offsets[number] = offset
    return offsets


class _DuplicateKeyError(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise _DuplicateKeyError(f"{repeated[0]!r} is given twice")
    return dict(pairs)


def _named(spec: OffsetSpec, sentinel: int) -> list[int]:
    """The partitions a JSON spec gives the sentinel."""
    return sorted(p for p, offset in spec.items() if offset == sentinel) if isinstance(spec, dict) else []


@dataclass(frozen=True)
class ReadOptions:
    root: str
    topic: str
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool
    isolation: Isolation
    min_partitions: int  # split partitions into ranges until there are at least this many
    max_records_per_partition: int  # and no range holds more offsets than this
    max_offsets_per_trigger: int | None  # streaming: rows per micro-batch
    max_rows_per_arrow_batch: int
    # Filled on the driver at planning (planning.plan_read_root): the root's id and the
    # driver's host, which every task checks against the root it opens. None: unchecked.
    root_id: str | None = None
    planned_on: str | None = None


def read_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    check_option_names(options, reading=True)
    name = topic(options)
    isolation = (_get(options, "isolation") or "read_committed").lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(f"option isolation must be read_committed or read_uncommitted, got {isolation!r}")
    # Kafka's defaults: a batch read spans the whole log, a stream starts at the end.
    starting = parse_offsets(
        _get(options, "startingOffsets"), "startingOffsets", name, LATEST if streaming else EARLIEST
    )
    ending = parse_offsets(_get(options, "endingOffsets"), "endingOffsets", name, LATEST)
    if streaming and _get(options, "endingOffsets") is not None:
        raise OptionError("option endingOffsets is for batch reads; a stream reads on")
    batch_latest = [] if streaming else _named(starting, LATEST)
    if (starting == LATEST and not streaming) or batch_latest:
        raise OptionError(
            'option startingOffsets "latest" (-1) would read nothing in a batch query'
            + (f" (partitions {batch_latest})" if batch_latest else "")
        )
    if ending == EARLIEST or _named(ending, EARLIEST):
        raise OptionError('option endingOffsets cannot be "earliest" (-2)')
    trigger = _get(options, "maxOffsetsPerTrigger")
    return ReadOptions(
        root=root_path(options),
        topic=name,
        starting=starting,
        ending=ending,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        isolation=isolation,  # type: ignore[arg-type]
        min_partitions=_int(options, "minPartitions", 1, 1),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", 1_000_000, 1),
        max_offsets_per_trigger=None if trigger is None else _int(options, "maxOffsetsPerTrigger", 0, 1),
        # Spark takes a few large Arrow batches faster than many small ones (bench/README.md);
        # a batch's bytes stay under arrow_batches.MAX_GROUP_BYTES whatever the row count.
        max_rows_per_arrow_batch=_int(options, "maxRowsPerBatch", 262_144, 1),
    )


@dataclass(frozen=True)
class WriteOptions:
    root: str
    topic: str
    write_id: str
    user_write_id: bool  # given by the user (re-runs are idempotent) or made up for this job
    new_topic_partitions: int  # partitions of a topic that does not exist yet
    batch_records: int  # records per transactional batch
    max_pending_bytes: int  # encoded batches a task holds before appending them
    lock_timeout_s: float
    # An undecided write older than this (its driver died) is aborted by the next write:
    # its open transactions would hold every reader's last stable offset back forever.
    transaction_timeout_s: float


def write_options(options: Mapping[str, str]) -> WriteOptions:
    check_option_names(options, reading=False)
    given = _get(options, "writeId")
    try:
        write_id = check_write_id(given) if given is not None else f"job-{uuid.uuid4()}"
    except ValueError as exc:
        raise OptionError(f"option writeId: {exc}") from None
    return WriteOptions(
        root=root_path(options),
        topic=topic(options),
        write_id=write_id,
        user_write_id=given is not None,
        new_topic_partitions=_int(options, "numPartitions", 1, 1),
        batch_records=_int(options, "batchRecords", 1000, 1),
        max_pending_bytes=_int(options, "maxPendingBytes", 64 << 20, 1),
        lock_timeout_s=_int(options, "lockTimeoutMs", 60_000, 1) / 1000,
        transaction_timeout_s=_int(options, "transactionTimeoutMs", 15 * 60_000, 1) / 1000,
    )
