"""The compaction figures of `oncelog bench --compaction` (issue 33): the cleaner's
throughput and the memory of its key map.

The log: keyed records of about 150 bytes (a 14-byte key, a 120-byte random value, 16
records a batch), keys drawn uniformly from `cleaner_keys`, about one in twenty a
tombstone, `cleaner_log_bytes` of it cut into 8 sealed segments (the active one is
empty, so all of it may be cleaned), built once and closed. Every round copies it
(untimed, then a sync, so no round pays for writing back the copy), times a plain
read + CRC-32C of the copy's segment files (the reference), then `Log.clean()`
of the copy: the first pass over a log that is dirty from its start. Throughput is the
dirty bytes over the time, in MB/s, for both; the spread is that of the per-round ratios.

The key map's memory per key is `KeyMap.memory_bytes / keys` after the pass, against
the 24 bytes of Kafka's offset map entry (a 16-byte MD5 and an 8-byte offset). Its peak
while merging (the map grows by a sorted merge per segment) is measured apart with
tracemalloc: the same digests put segment by segment into a fresh map, as the pass does.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import shutil
import tracemalloc
from collections.abc import Sequence

import crc32c
import numpy as np
import numpy.typing as npt

from oncelog.bench.harness import (
    MIB,
    BenchResults,
    BenchSettings,
    Progress,
    Target,
    make_row,
    median,
    now_ms,
    timed,
)
from oncelog.config import LogConfig
from oncelog.key_map import BYTES_PER_KEY, KeyMap, key_digests
from oncelog.log import Log
from oncelog.log_cleaner import CleanResult
from oncelog.segments.batch import encode_batch

MB = 1e6  # decimal: MB/s is 10^6 bytes per second
SEGMENTS = 8
BATCH_RECORDS = 16
VALUE_BYTES = 120
TOMBSTONE_EVERY = 20  # about one record in this many is a tombstone
SEED = 33
READ_CHUNK_BYTES = MIB


@dataclasses.dataclass(frozen=True)
class CompactedImage:
    """A closed compacted log, all of it in sealed segments, and what was written to it."""

    path: str
    config: LogConfig
    key_ids: npt.NDArray[np.int64]  # the key of each offset, in offset order
    segment_names: tuple[str, ...]  # the sealed segments' .log files
    segment_bases: tuple[int, ...]  # their base offsets, and the log end last
    log_bytes: int

    @property
    def keys(self) -> int:
        """The distinct keys written (tombstones' included: the key map holds them too)."""
        return len(np.unique(self.key_ids))


def key_bytes(key_id: int) -> bytes:
    return b"key-%010d" % key_id


def build_compacted_image(path: str, log_bytes: int, keys: int) -> CompactedImage:
    """A compacted log of about `log_bytes` of keyed records over `keys` keys, in SEGMENTS
    full sealed segments and an empty active one (see the module)."""
    segment_bytes = max(1024, log_bytes // SEGMENTS)
    config = LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact")
    rng = random.Random(SEED)
    stamp_ms = now_ms()
    key_ids: list[int] = []
    with Log.open(path, config) as log:
        while True:
            ids = [rng.randrange(keys) for _ in range(BATCH_RECORDS)]
            batch = encode_batch(
                [
                    (
                        key_bytes(key_id),
                        None if rng.randrange(TOMBSTONE_EVERY) == 0 else rng.randbytes(VALUE_BYTES),
                    )
                    for key_id in ids
                ],
                timestamp_ms=stamp_ms,
            )
            if len(log.segments) == SEGMENTS and log.active_segment.size + len(batch) > segment_bytes:
                break  # the batch would start one segment too many
            log.append(batch)
            key_ids.extend(ids)
        log.roll()  # the active segment is never cleaned: leave it empty
        sealed = log.segments[:-1]
        names = tuple(os.path.basename(segment.path) for segment in sealed)
        bases = (*(segment.base_offset for segment in sealed), log.log_end_offset)
        size = sum(segment.size for segment in sealed)
    return CompactedImage(path, config, np.array(key_ids, dtype=np.int64), names, bases, size)


def read_and_crc(paths: Sequence[str]) -> int:
    """The reference: a plain read + CRC-32C of each file, a MiB at a time into one buffer
    (a fresh buffer per read would time page faults, not reading); the bytes read."""
    view = memoryview(bytearray(READ_CHUNK_BYTES))
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            while read := file.readinto(view):
                crc32c.crc32c(view[:read])
                total += read
    return total


@dataclasses.dataclass
class CleanerRounds:
    clean_s: list[float] = dataclasses.field(default_factory=list)
    reference_s: list[float] = dataclasses.field(default_factory=list)
    results: list[CleanResult] = dataclasses.field(default_factory=list)


def _clean_round(image: CompactedImage, copy: str, rounds: CleanerRounds) -> None:
    """One round on a fresh copy of the image: the reference, then the pass; the copy is removed."""
    shutil.copytree(image.path, copy)
    try:
        os.sync()  # untimed: neither side pays for writing back the copy
        paths = [os.path.join(copy, name) for name in image.segment_names]
        read: list[int] = []
        rounds.reference_s.append(timed(lambda: read.append(read_and_crc(paths))))
        if read != [image.log_bytes]:
            raise AssertionError(f"the reference read {read} bytes of {image.log_bytes}")
        with Log.open(copy, image.config) as log:
            part = log.cleanable_part()
            if (part.count, part.dirty_bytes) != (len(image.segment_names), image.log_bytes):
                raise AssertionError(f"the copy's cleanable part is {part}, not all {image.log_bytes} bytes")
            cleaned: list[CleanResult] = []
            rounds.clean_s.append(timed(lambda: cleaned.append(log.clean())))
        rounds.results.append(cleaned[0])
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def check_pass(image: CompactedImage, result: CleanResult) -> None:
    """A pass that did not clean the whole log, or missed keys, is no figure."""
    stats = result.stats
    if not result.cleaned or stats.bytes_read != image.log_bytes or result.keys != image.keys:
        raise AssertionError(
            f"the pass cleaned={result.cleaned}, read {stats.bytes_read} of {image.log_bytes} bytes, "
            f"mapped {result.keys} of {image.keys} keys"
        )
    if not 0 < stats.bytes_written < stats.bytes_read:
        raise AssertionError(f"the pass wrote {stats.bytes_written} bytes of {stats.bytes_read}")


def key_map_peak_bytes(image: CompactedImage) -> int:
    """Peak bytes traced while the image's digests are put into a fresh map, one segment at a
    time as the pass does (the digests of each segment made beforehand, not counted)."""
    digests_of = key_digests(key_bytes(key_id) for key_id in range(int(image.key_ids.max()) + 1))
    bases = image.segment_bases
    segments = [
        (digests_of[image.key_ids[first:end]], np.arange(first, end, dtype=np.int64))
        for first, end in itertools.pairwise(bases)
    ]
    key_map = KeyMap(len(image.key_ids))
    tracemalloc.start()
    try:
        for digests, offsets in segments:
            key_map.put(digests, offsets)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if len(key_map) != image.keys:
        raise AssertionError(f"the replayed map holds {len(key_map)} keys, not {image.keys}")
    return peak


def cleaner_figures(
    settings: BenchSettings, directory: str, results: BenchResults, progress: Progress
) -> None:
    size_mib, keys = settings.cleaner_log_bytes / MIB, f"{settings.cleaner_keys:,}"
    progress(f"  a compacted log of {size_mib:g} MiB over {keys} keys, {SEGMENTS} sealed segments")
    image = build_compacted_image(
        os.path.join(directory, "image"), settings.cleaner_log_bytes, settings.cleaner_keys
    )
    rounds = CleanerRounds()
    progress(f"  {settings.cleaner_rounds} rounds, each on a fresh copy: read + CRC-32C, then Log.clean()")
    for n in range(settings.cleaner_rounds):
        _clean_round(image, os.path.join(directory, f"round-{n}"), rounds)
        check_pass(image, rounds.results[-1])
    dirty_mb = image.log_bytes / MB
    results.rows.append(
        make_row(
            f"log cleaning, {size_mib:g} MiB dirty over {keys} keys (vs read + CRC-32C)",
            dirty_mb / median(rounds.clean_s),
            "MB/s",
            dirty_mb / median(rounds.reference_s),
            Target(),  # issue 33: reported
            [ref / clean for clean, ref in zip(rounds.clean_s, rounds.reference_s, strict=True)],
        )
    )
    result = rounds.results[-1]
    results.rows.append(
        make_row(
            f"key map memory per key, {keys} keys (vs Kafka's offset map entry)",
            result.key_map_bytes / result.keys,
            "B",
            BYTES_PER_KEY,
            Target(max_value=BYTES_PER_KEY),  # issue 33
        )
    )
    progress("  the key map's peak while merging, replayed under tracemalloc")
    results.rows.append(
        make_row(
            f"key map peak while merging, per key, {keys} keys",
            key_map_peak_bytes(image) / image.keys,
            "B",
            BYTES_PER_KEY,
            Target(),
        )
    )
    stats = result.stats
    results.notes.append(
        f"cleaner: {len(image.key_ids):,} records in {len(image.segment_names)} segments cleaned to "
        f"{stats.bytes_written / MB:.3g} MB ({stats.records_removed:,} records removed, "
        f"{stats.segments_rewritten} segments rewritten); the pass reads the dirty segments twice "
        f"(key map, then rewrite) and fsyncs each rewritten one"
    )
