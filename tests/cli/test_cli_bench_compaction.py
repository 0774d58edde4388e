"""`oncelog bench --compaction` (issue 33): the cleaner's rows are well formed, not fast.

The quick form runs at a tiny scale (ONCELOG_BENCH_SCALE), through the command line with
only the compaction step kept: the table and the JSON carry the cleaning throughput against
a read + CRC-32C of the same segments with its spread, and the key map's memory per key
against Kafka's 24 bytes. Nothing here asserts a speed.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_bench import ROW_KEYS, SMOKE_SCALE

from oncelog.bench import cleaner as bench_cleaner
from oncelog.bench import run as bench_run
from oncelog.bench.harness import REPORT, BenchSettings, Step, settings_for
from oncelog.cli import bench as bench_cli
from oncelog.cli import main as cli
from oncelog.key_map import BYTES_PER_KEY
from oncelog.log_cleaner import CleanResult
from oncelog.segment_cleaning import CleanStats

CLEANING = "log cleaning, "
PER_KEY = "key map memory per key, "
PEAK = "key map peak while merging, per key, "


@dataclasses.dataclass(frozen=True)
class CompactionRun:
    status: int
    out: str
    err: str
    rows: dict[str, dict[str, Any]]  # by the start of the figure's name
    root: Path


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> CompactionRun:
    root = tmp_path_factory.mktemp("bench-compaction")
    json_path = root / "bench.json"
    real_steps = bench_run.benchmark_steps

    def compaction_only(settings: BenchSettings, **options: bool) -> list[tuple[str, Step]]:
        return [step for step in real_steps(settings, **options) if step[1] is bench_cleaner.cleaner_figures]

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(bench_cli.SCALE_ENV, SMOKE_SCALE)
        patch.setattr(bench_run, "benchmark_steps", compaction_only)
        argv = ["bench", "--quick", "--compaction", "--json", str(json_path), "--dir", str(root)]
        status = cli.main(argv, out=out, err=err)
    listed = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else []
    rows = {
        start: row for row in listed for start in (CLEANING, PER_KEY, PEAK) if row["figure"].startswith(start)
    }
    return CompactionRun(status, out.getvalue(), err.getvalue(), rows, root)


class TestQuickRun:
    def test_it_exits_0_with_the_three_rows_and_removes_its_scratch(self, quick: CompactionRun) -> None:
        assert quick.status == 0, quick.err
        assert set(quick.rows) == {CLEANING, PER_KEY, PEAK}, quick.out
        assert "[1/1] log compaction" in quick.err
        assert [path.name for path in quick.root.iterdir()] == ["bench.json"]

    def test_every_row_has_the_promised_keys_and_types(self, quick: CompactionRun) -> None:
        for row in quick.rows.values():
            assert set(row) == set(ROW_KEYS), row
            for key, kind in ROW_KEYS.items():
                kinds = kind if isinstance(kind, tuple) else (kind,)
                assert type(row[key]) in kinds, (key, row)
            assert row["value"] > 0 and row["reference"] > 0, row
            assert row["ratio"] == pytest.approx(row["value"] / row["reference"], rel=1e-12), row

    def test_cleaning_is_in_mb_per_s_of_dirty_log_against_the_reference_with_its_spread(
        self, quick: CompactionRun
    ) -> None:
        row = quick.rows[CLEANING]
        assert "vs read + CRC-32C" in row["figure"] and " MiB dirty over " in row["figure"]
        assert row["unit"] == "MB/s" and row["target"] == REPORT and row["met"]
        low, high = row["spread_low"], row["spread_high"]
        assert isinstance(low, float) and isinstance(high, float) and 0 < low <= high, row

    def test_the_key_map_is_held_to_kafkas_24_bytes_a_key(self, quick: CompactionRun) -> None:
        row = quick.rows[PER_KEY]
        assert (row["unit"], row["reference"], row["target"]) == ("B", BYTES_PER_KEY, "≤ 24 B")
        assert row["met"] is (row["value"] <= BYTES_PER_KEY)
        peak = quick.rows[PEAK]
        # The peak holds the whole map at least, and whatever the merge adds.
        assert peak["unit"] == "B" and peak["target"] == REPORT and peak["value"] >= row["value"]

    def test_the_table_shows_the_rows_and_a_note_on_the_pass(self, quick: CompactionRun) -> None:
        for row in quick.rows.values():
            assert any(line.startswith(str(row["figure"]) + "  ") for line in quick.out.splitlines())
        assert "note: cleaner: " in quick.out and "records removed" in quick.out
        assert "load average" in quick.out


class TestOption:
    def test_the_step_runs_only_when_asked(self) -> None:
        settings = settings_for(True)
        steps = [step for _, step in bench_run.benchmark_steps(settings)]
        assert bench_cleaner.cleaner_figures not in steps
        asked = [step for _, step in bench_run.benchmark_steps(settings, compaction=True)]
        assert asked == [*steps, bench_cleaner.cleaner_figures]

    def test_help_explains_the_option_and_its_reference(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(["bench", "--help"]) == 0
        text = capsys.readouterr().out
        assert "--compaction" in text and "read + CRC-32C" in text and "KeyMap.memory_bytes" in text


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> bench_cleaner.CompactedImage:
    return bench_cleaner.build_compacted_image(str(tmp_path_factory.mktemp("image") / "log"), 1 << 20, 200)


class TestPieces:
    def test_the_image_is_all_sealed_and_the_reference_reads_all_of_it(
        self, image: bench_cleaner.CompactedImage
    ) -> None:
        paths = [str(Path(image.path) / name) for name in image.segment_names]
        assert len(paths) == bench_cleaner.SEGMENTS and len(image.segment_bases) == len(paths) + 1
        assert image.segment_bases[-1] == len(image.key_ids)
        assert (
            bench_cleaner.read_and_crc(paths) == image.log_bytes == sum(Path(p).stat().st_size for p in paths)
        )
        assert image.keys == 200  # every key drawn in so many records

    def test_a_pass_that_missed_keys_or_bytes_is_no_figure(self, image: bench_cleaner.CompactedImage) -> None:
        stats = CleanStats(bytes_read=image.log_bytes, bytes_written=image.log_bytes // 10)
        whole = CleanResult(True, 1.0, 0, image.segment_bases[-1], image.keys, image.keys * 24, stats)
        bench_cleaner.check_pass(image, whole)
        for broken in (
            dataclasses.replace(whole, keys=image.keys - 1),
            dataclasses.replace(whole, cleaned=False),
            dataclasses.replace(whole, stats=dataclasses.replace(stats, bytes_read=image.log_bytes - 1)),
            dataclasses.replace(whole, stats=dataclasses.replace(stats, bytes_written=0)),
        ):
            with pytest.raises(AssertionError):
                bench_cleaner.check_pass(image, broken)

    def test_the_peak_while_merging_holds_the_map_at_least(self, image: bench_cleaner.CompactedImage) -> None:
        assert bench_cleaner.key_map_peak_bytes(image) >= image.keys * BYTES_PER_KEY
