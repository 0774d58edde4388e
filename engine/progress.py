"""A progress bar over partitions (rich, on a chosen stream), for long operator work.

rich is imported here, on first use, and nowhere else: a broker that embeds the
engine and never shows a bar never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress


def partition_bar(verb: str, scanned: str, *, stream: TextIO, transient: bool) -> Progress:
    """A bar reading "<verb> [bar] done/total partitions, <scanned>: N MiB ...".

    The caller adds one task with a `mib` field and advances it once per partition.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(verb),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(f"partitions, {{task.fields[mib]:.1f}} MiB {scanned}"),
        TimeElapsedColumn(),
        console=Console(file=stream),
        transient=transient,
    )
