"""`oncelog bench`: the comparative report's structure, not its speed (issue 6).

One smoke run at a tiny scale (ONCELOG_BENCH_SCALE) feeds most tests: the JSON
rows have exactly the promised keys and types, every figure of brief §11 is
there, each ratio is value / reference, `met` agrees with the target text, and
the plot is a PNG. Whether targets are met depends on the machine, so nothing
here asserts it.
"""

from __future__ import annotations

import inspect
import io
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from oncelog.bench.harness import (
    REPORT,
    BenchResults,
    Target,
    codec_figures,
    durable_append,
    make_row,
    settings_for,
)
from oncelog.cli import bench as bench_cli
from oncelog.cli import main as cli
from oncelog.log import Log
from oncelog.segments.batch import encode_batch

SMOKE_SCALE = "0.01"
ROW_KEYS = {
    "figure": str,
    "value": float,
    "unit": str,
    "reference": float,
    "ratio": float,
    "target": str,
    "met": bool,
    "spread_low": (float, type(None)),
    "spread_high": (float, type(None)),
    "unclear": bool,
}
# One entry per figure of brief §11 (plus the informational rows), as the figure names begin.
FIGURES = [
    "append 170 B (1 record) batches, no fsync",
    "append 1 KiB batches, no fsync",
    "append 16 KiB batches, no fsync",
    "append 1 MiB batches, no fsync",
    "append 170 B idempotent batches (1 producer), no fsync",
    "append_batches of 10 x 170 B vs 10 single appends",
    "build a batch of 100 x 100 B records",
    "decode the records of that batch",
    "unclean recovery, 100 vs 10 sealed segments",
    "tail scan on recovery, 16 KiB batches",
    "snapshot write, ",
    "snapshot load, ",
    "memory per producer, ",
    "expire 1% of ",
    "durable appends, 16 threads (group commit)",
    "durable appends, 1 thread, vs raw os.write+fsync loop",
    "open ",  # N partitions, clean (LogManager vs one Log.open at a time)
    "open ",  # N partitions, unclean
    "descriptors per idle partition, ",
    "memory per idle partition, ",
]
OPTIONS = ["--quick", "--json", "--plot", "--dir"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class SmokeRun:
    status: int
    out: str
    err: str
    rows: list[dict[str, Any]]
    plot: Path


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    root = tmp_path_factory.mktemp("bench")
    json_path, plot_path = root / "bench.json", root / "bench.png"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(bench_cli.SCALE_ENV, SMOKE_SCALE)
        argv = ["bench", "--quick", "--json", str(json_path), "--plot", str(plot_path), "--dir", str(root)]
        status = cli.main(argv, out=out, err=err)
    rows = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else []
    return SmokeRun(status, out.getvalue(), err.getvalue(), rows, plot_path)


def met_by_target(target: str, value: float, ratio: float) -> bool:
    """Read the target text independently of Target: clauses joined by ' and '."""
    if target == REPORT:
        return True
    met = True
    for clause in target.split(" and "):
        match = re.fullmatch(r"(ratio )?([≥≤]) ([\d,.]+)(?: .+)?", clause)
        assert match, f"unreadable target clause {clause!r}"
        subject = ratio if match.group(1) else value
        bound = float(match.group(3).replace(",", ""))
        met = met and (subject >= bound if match.group(2) == "≥" else subject <= bound)
    return met


class TestSmokeRun:
    def test_it_exits_0_and_removes_its_scratch_directory(self, smoke: SmokeRun) -> None:
        assert smoke.status == 0, smoke.err
        assert [p.name for p in smoke.plot.parent.iterdir() if p.name.startswith("oncelog-bench-")] == []

    def test_every_json_row_has_exactly_the_promised_keys_and_types(self, smoke: SmokeRun) -> None:
        assert smoke.rows
        for row in smoke.rows:
            assert set(row) == set(ROW_KEYS), row
            for key, kind in ROW_KEYS.items():
                kinds = kind if isinstance(kind, tuple) else (kind,)
                assert type(row[key]) in kinds, (key, row)

    def test_every_figure_of_the_brief_is_a_row(self, smoke: SmokeRun) -> None:
        figures = [str(row["figure"]) for row in smoke.rows]
        for expected in FIGURES:
            assert sum(figure.startswith(expected) for figure in figures) == FIGURES.count(expected), (
                expected,
                figures,
            )
        assert len(figures) == len(FIGURES)

    def test_ratio_is_value_over_reference(self, smoke: SmokeRun) -> None:
        for row in smoke.rows:
            value, reference, ratio = float(row["value"]), float(row["reference"]), float(row["ratio"])
            # What opening a handful of partitions adds to the resident set can round to nothing
            # (the row clamps a shrink at 0): a tiny smoke run's only row that may be 0.
            may_be_zero = str(row["figure"]).startswith("memory per idle partition")
            assert reference > 0 and (value > 0 or (value == 0 and may_be_zero)), row
            assert ratio == pytest.approx(value / reference, rel=1e-12), row

    def test_met_agrees_with_the_target_at_the_median_and_across_the_spread(self, smoke: SmokeRun) -> None:
        for row in smoke.rows:
            value, reference, ratio = float(row["value"]), float(row["reference"]), float(row["ratio"])
            at_median = met_by_target(str(row["target"]), value, ratio)
            ends = [row["spread_low"], row["spread_high"]] if row["spread_low"] is not None else []
            across = all(met_by_target(str(row["target"]), end * reference, end) for end in ends)  # type: ignore[operator]
            assert row["met"] is (at_median and across), row
            assert row["unclear"] is (at_median and not across), row

    def test_append_rows_carry_the_spread_of_their_rounds(self, smoke: SmokeRun) -> None:
        for row in smoke.rows:
            if str(row["figure"]).startswith("append"):
                low, high = row["spread_low"], row["spread_high"]
                assert isinstance(low, float) and isinstance(high, float) and 0 < low <= high, row

    def test_the_brief_targets_are_the_ones_checked(self, smoke: SmokeRun) -> None:
        targets = {str(row["figure"]): str(row["target"]) for row in smoke.rows}
        # Issue 19's targets: the compiled append against a plain os.write loop.
        assert targets["append 170 B (1 record) batches, no fsync"] == "ratio ≥ 1"
        assert targets["append 170 B idempotent batches (1 producer), no fsync"] == "ratio ≥ 0.8"
        assert targets["append_batches of 10 x 170 B vs 10 single appends"] == "ratio ≤ 1"
        assert targets["append 16 KiB batches, no fsync"] == "ratio ≥ 1 and ≥ 1.5 GB/s"
        assert targets["build a batch of 100 x 100 B records"] == "ratio ≥ 2"
        assert targets["decode the records of that batch"] == "ratio ≥ 2"
        # Issue 30's.
        assert targets["unclean recovery, 100 vs 10 sealed segments"] == "ratio ≤ 1.1"
        assert targets["tail scan on recovery, 16 KiB batches"] == "ratio ≥ 0.8"
        assert targets["durable appends, 16 threads (group commit)"] == "ratio ≥ 8"
        assert targets["durable appends, 1 thread, vs raw os.write+fsync loop"] == "ratio ≥ 0.9"
        (expire,) = [target for figure, target in targets.items() if figure.startswith("expire 1% of")]
        assert expire == "≤ 1 ms"

    def test_the_table_shows_every_row_with_its_verdict(self, smoke: SmokeRun) -> None:
        lines = smoke.out.splitlines()
        header = next(line for line in lines if line.startswith("figure"))
        assert header.split() == ["figure", "oncelog", "reference", "ratio", "spread", "target", "result"]
        assert "quick" in smoke.out and "noisier" in smoke.out
        assert "load average" in lines[1] and "load average" in lines[-1]  # at the start and the end
        for row in smoke.rows:
            (line,) = [line for line in lines if line.startswith(str(row["figure"]) + "  ")]
            if row["target"] == REPORT:
                verdict = "—"
            else:
                verdict = "unclear (spread)" if row["unclear"] else ("met" if row["met"] else "MISSED")
            assert line.endswith(verdict), line

    def test_progress_goes_to_stderr(self, smoke: SmokeRun) -> None:
        assert "[1/7] append, no fsync" in smoke.err
        assert "[6/7] durable appends" in smoke.err
        assert "[7/7] opening " in smoke.err
        assert "bench:" not in smoke.out

    def test_the_plot_is_a_non_empty_png(self, smoke: SmokeRun) -> None:
        data = smoke.plot.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


class TestCommandLine:
    def test_help_explains_every_option_and_the_ratio(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(["bench", "--help"]) == 0
        text = capsys.readouterr().out
        for option in OPTIONS:
            assert option in text
        assert "Ratio = oncelog / reference" in text
        for reference in ("os.write", "DefaultRecordBatchBuilder", "DefaultRecordBatch", "full numpy scan"):
            assert reference in text

    def test_bench_is_listed_in_the_top_level_help(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert cli.main(["--help"]) == 0
        assert "bench" in capsys.readouterr().out

    def test_a_missing_dir_is_bad_input(self, tmp_path: Path) -> None:
        err = io.StringIO()
        assert cli.main(["bench", "--dir", str(tmp_path / "absent")], out=io.StringIO(), err=err) == 2
        assert "not a directory" in err.getvalue()

    def test_a_bad_scale_is_bad_input(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(bench_cli.SCALE_ENV, "lots")
        err = io.StringIO()
        assert cli.main(["bench"], out=io.StringIO(), err=err) == 2
        assert bench_cli.SCALE_ENV in err.getvalue()


class TestPieces:
    def test_target_text_and_met(self) -> None:
        target = Target(min_ratio=0.5, min_value=200_000)
        assert target.text("appends/s") == "ratio ≥ 0.5 and ≥ 200,000 appends/s"
        assert make_row("f", 300_000, "appends/s", 500_000, target).met
        assert not make_row("f", 150_000, "appends/s", 200_000, target).met  # ratio met, rate not
        assert not make_row("f", 300_000, "appends/s", 700_000, target).met  # rate met, ratio not
        row = make_row("f", 1.0, "ms", 2.0, Target())
        assert (row.target, row.met, row.ratio) == (REPORT, True, 0.5)

    def test_a_median_that_meets_its_target_with_a_spread_that_does_not_is_unclear(self) -> None:
        target = Target(min_ratio=1.0)
        clear = make_row("f", 120, "appends/s", 100, target, [1.1, 1.15, 1.2, 1.25, 1.3])
        assert clear.met and not clear.unclear and (clear.spread_low, clear.spread_high) == (1.15, 1.25)
        noisy = make_row("f", 120, "appends/s", 100, target, [0.7, 0.9, 1.2, 1.3, 1.6])
        assert not noisy.met and noisy.unclear  # the interquartile range reaches 0.9
        missed = make_row("f", 80, "appends/s", 100, target, [0.7, 0.8, 0.8, 0.9])
        assert not missed.met and not missed.unclear
        # One stalled round of many does not decide: the spread is the interquartile range.
        stalled = make_row("f", 120, "appends/s", 100, target, [1.2] * 8 + [0.1])
        assert stalled.met and stalled.spread_low == 1.2

    def test_a_target_of_either_bound_is_met_by_one_of_them(self) -> None:
        target = Target(max_ratio=3, max_value=50, either=True)
        assert target.text("ms") == "ratio ≤ 3 or ≤ 50 ms"
        assert make_row("f", 90, "ms", 40, target).met  # the ratio holds, the value does not
        assert make_row("f", 40, "ms", 5, target).met  # the value holds, the ratio does not
        assert not make_row("f", 90, "ms", 10, target).met

    def test_missing_kafka_python_skips_the_codec_rows_with_a_note(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "kafka.record.default_records", None)  # import raises ImportError
        settings = replace(settings_for(True, 0.01), codec_batches=2)
        results = BenchResults(settings)
        codec_figures(settings, "unused", results, lambda message: None)
        assert results.rows == []
        assert any("kafka-python" in note for note in results.notes)

    def test_durable_append_uses_the_durable_parameter_where_the_log_has_it(self, tmp_path: Path) -> None:
        batch = encode_batch([(b"k", b"v")], timestamp_ms=1_800_000_000_000)
        with Log.open(tmp_path / "t-0") as log:
            append, note = durable_append(log)
            for n in range(3):
                append(batch)
                assert log.log_end_offset == n + 1
        has_parameter = "durable" in inspect.signature(Log.append).parameters
        assert (note is None) is has_parameter


def test_every_missing_extra_is_named_in_one_line_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As installed from a wheel with no extras: none of the three optional modules is found.
    import importlib.util

    real_find_spec = importlib.util.find_spec
    absent = {"confluent_kafka", "pyspark", "matplotlib"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in absent else real_find_spec(name, *a)
    )
    out, err = io.StringIO(), io.StringIO()
    plot = str(tmp_path / "p.png")
    argv = ["bench", "--quick", "--wire", "--spark", "--plot", plot, "--dir", str(tmp_path)]
    assert cli.main(argv, out=out, err=err) == 2
    assert err.getvalue() == (
        "oncelog bench: --wire needs confluent-kafka; --spark needs pyspark and pyarrow; "
        "--plot needs matplotlib: pip install 'oncelog[kafka,spark,plot]'\n"
    )
    assert out.getvalue() == "" and list(tmp_path.iterdir()) == []
