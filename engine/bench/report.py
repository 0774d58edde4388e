"""The output of `oncelog bench`: the table, the JSON rows and the plot.

The JSON is a list with one object per table row, exactly the fields of BenchRow:
{"figure": str, "value": float, "unit": str, "reference": float, "ratio": float,
"target": str, "met": bool, "spread_low": float | null, "spread_high": float | null,
"unclear": bool}. The spread is that of the per-round ratios (see make_row); a row
whose median meets its target while its spread does not is `unclear`, not met.

The plot is one PNG with two panels: unclean recovery time against log size (10,
30 and 100 sealed segments, same tail: it should be flat), and append throughput
against batch size, oncelog beside the plain os.write loop. matplotlib (the `plot`
extra) is imported only when a plot is asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from typing import TextIO

from oncelog.bench.harness import REPORT, BenchResults, BenchRow
from oncelog.bench.recovery import RECOVERY_MAX_RATIO

RATIO_CONVENTION = (
    "ratio = oncelog / reference in the row's unit: for rates higher is better, for times lower is better"
)
COLUMNS = ("figure", "oncelog", "reference", "ratio", "spread", "target", "result")
MB = 1e6


def format_number(value: float) -> str:
    """Three significant digits, with k/M for large numbers: 51573 -> 51.6k, 0.4224 -> 0.422."""
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= divisor:
            return f"{value / divisor:.3g}{suffix}"
    return f"{value:.3g}"


def verdict(row: BenchRow) -> str:
    if row.target == REPORT:
        return "—"
    if row.unclear:
        return "unclear (spread)"
    return "met" if row.met else "MISSED"


def spread_text(row: BenchRow) -> str:
    if row.spread_low is None or row.spread_high is None:
        return ""
    return f"{format_number(row.spread_low)}-{format_number(row.spread_high)}"


def table_lines(rows: list[BenchRow]) -> list[str]:
    cells = [COLUMNS] + [
        (
            row.figure,
            f"{format_number(row.value)} {row.unit}",
            f"{format_number(row.reference)} {row.unit}",
            format_number(row.ratio),
            spread_text(row),
            row.target,
            verdict(row),
        )
        for row in rows
    ]
    widths = [max(len(line[n]) for line in cells) for n in range(len(COLUMNS))]
    # Text columns left-aligned, numbers right-aligned.
    aligned = [str.ljust, str.rjust, str.rjust, str.rjust, str.rjust, str.ljust, str.ljust]
    lines = [
        "  ".join(
            align(cell, width) for align, cell, width in zip(aligned, line, widths, strict=True)
        ).rstrip()
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def print_report(results: BenchResults, header: list[str], out: TextIO) -> None:
    for line in header:
        print(line, file=out)
    print(file=out)
    for line in table_lines(results.rows):
        print(line, file=out)
    print(file=out)
    bounded = [row for row in results.rows if row.target != REPORT]
    met = sum(row.met for row in bounded)
    unclear = sum(row.unclear for row in bounded)
    within = f" ({unclear} unclear: met at the median, not across the spread)" if unclear else ""
    print(f"{met} of {len(bounded)} targets met{within}. {RATIO_CONVENTION}.", file=out)
    print(
        "spread: the interquartile range of the per-round ratios (engine and reference "
        "timed in turn), min-max under 4 rounds",
        file=out,
    )
    for note in results.notes:
        print(f"note: {note}", file=out)
    print(f"measured in {results.elapsed_s:.1f} s; {load_average_text()} at the end", file=out)


def load_average_text() -> str:
    """The machine's 1/5/15-minute load averages: what else ran beside the bench."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def rows_as_json(rows: list[BenchRow]) -> list[dict[str, object]]:
    return [dataclasses.asdict(row) for row in rows]


def write_json(rows: list[BenchRow], path: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        # allow_nan=False: a NaN or infinity would not be JSON; better to fail loudly.
        json.dump(rows_as_json(rows), file, indent=2, ensure_ascii=False, allow_nan=False)
        file.write("\n")


def write_plot(results: BenchResults, path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    recovery_axes, throughput_axes = figure.subplots(1, 2)

    points = results.recovery
    sizes_mb = [point.log_bytes / MB for point in points]
    medians_ms = [statistics.median(point.times_s) * 1000 for point in points]
    lows = [m - min(point.times_s) * 1000 for m, point in zip(medians_ms, points, strict=True)]
    highs = [max(point.times_s) * 1000 - m for m, point in zip(medians_ms, points, strict=True)]
    recovery_axes.errorbar(
        sizes_mb, medians_ms, yerr=[lows, highs], marker="o", capsize=4, label="unclean open"
    )
    for size_mb, median_ms, point in zip(sizes_mb, medians_ms, points, strict=True):
        recovery_axes.annotate(
            f"{point.sealed_segments} segments",
            (size_mb, median_ms),
            textcoords="offset points",
            xytext=(0, -18),
            ha="center",
        )
    top_ms = max((m + h for m, h in zip(medians_ms, highs, strict=True)), default=1.0)
    recovery_axes.set_ylim(0, top_ms * 1.4)
    if medians_ms:
        recovery_axes.axhline(
            medians_ms[0] * RECOVERY_MAX_RATIO,
            linestyle="--",
            color="gray",
            label=f"target: {RECOVERY_MAX_RATIO:g} x the smallest log's time",
        )
        recovery_axes.legend(loc="lower right")
    tail_mb = points[0].bytes_scanned / MB if points else 0.0
    recovery_axes.set_xlim(0, max(sizes_mb, default=1.0) * 1.12)
    recovery_axes.set_title(f"Unclean recovery, same {tail_mb:.3g} MB tail (median, min-max)")
    recovery_axes.set_xlabel("log size (MB)")
    recovery_axes.set_ylabel("time to open (ms)")
    recovery_axes.grid(alpha=0.3)

    labels = [_size_label(point.batch_bytes) for point in results.throughput]
    positions = range(len(labels))
    width = 0.38
    oncelog_mb_s = [point.oncelog_bytes_per_s / MB for point in results.throughput]
    reference_mb_s = [point.reference_bytes_per_s / MB for point in results.throughput]
    bars = throughput_axes.bar(
        [p - width / 2 for p in positions], oncelog_mb_s, width, label="oncelog Log.append"
    )
    throughput_axes.bar_label(bars, fmt="%.0f", fontsize=8)
    bars = throughput_axes.bar(
        [p + width / 2 for p in positions], reference_mb_s, width, label="os.write loop (reference)"
    )
    throughput_axes.bar_label(bars, fmt="%.0f", fontsize=8)
    throughput_axes.set_xticks(list(positions), labels)
    throughput_axes.set_yscale("log")
    throughput_axes.set_title("Append throughput, no fsync (median)")
    throughput_axes.set_xlabel("batch size")
    throughput_axes.set_ylabel("MB/s (10^6 bytes/s)")
    throughput_axes.legend(loc="upper left")
    throughput_axes.grid(alpha=0.3, axis="y")
    figure.suptitle(f"oncelog bench, {results.settings.mode} run")
    figure.savefig(path, dpi=100)


def _size_label(size_bytes: int) -> str:
    for unit_bytes, unit in ((1024 * 1024, "MiB"), (1024, "KiB")):
        if size_bytes >= unit_bytes and size_bytes % unit_bytes == 0:
            return f"{size_bytes // unit_bytes} {unit}"
    return f"{size_bytes} B"
