"""`oncelog verify ROOT`: the command line of the read-only check of every partition under ROOT.

Argument parsing, the progress bar and printing only: partitions are found by
`partition_dirs` and checked by `verify_partition.PartitionVerifier`, which reports
each problem as one line naming the file and the byte position in it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from oncelog.progress import partition_bar
from oncelog.storage.fs import DEFAULT_FS, ReadOnlyFileSystem
from oncelog.tools.partition_dirs import BadInputError, find_partitions, root_store_error
from oncelog.tools.verify_partition import CORRUPT, PartitionVerifier, Problem

if TYPE_CHECKING:
    from rich.progress import Progress

EXIT_OK, EXIT_CORRUPT, EXIT_BAD_INPUT = 0, 1, 2
_REDRAW_BYTES = 1 << 20  # the progress bar is redrawn once this many more bytes are checked


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs = ReadOnlyFileSystem(DEFAULT_FS)
    try:
        partitions = find_partitions(args.root, fs)
    except BadInputError as exc:
        print(f"oncelog verify: {exc}", file=err)
        return EXIT_BAD_INPUT
    with _ProgressBar(out, err, len(partitions), show=args.progress and err.isatty()) as bar:

        def report(problem: Problem) -> None:
            if problem.severity == CORRUPT or not args.quiet:
                bar.print(str(problem))

        verifier = PartitionVerifier(fs, report, bar.advance)
        root_error = root_store_error(fs, args.root)
        if root_error is not None:
            verifier.problem(CORRUPT, args.root, None, root_error)
        for partition in partitions:
            verifier.verify(partition)
            bar.partition_done()
    if not args.quiet:
        print(verifier.totals, file=out)
    return EXIT_CORRUPT if verifier.totals.corrupt else EXIT_OK


class _ProgressBar:
    """rich's bar on stderr: partitions done, bytes checked. Nothing unless `show`."""

    def __init__(self, out: TextIO, err: TextIO, partitions: int, *, show: bool):
        self._out = out
        self._progress: Progress | None = None
        self._checked = self._shown = 0
        if not show:
            return
        self._progress = partition_bar("verify", "checked", stream=err, transient=True)
        self._task = self._progress.add_task("verify", total=partitions, mib=0.0)

    def __enter__(self) -> _ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, count: int) -> None:
        # Redrawn once a MiB, not once a batch: a segment of small batches has millions.
        self._checked += count
        if self._progress is not None and self._checked - self._shown >= _REDRAW_BYTES:
            self._shown = self._checked
            self._progress.update(self._task, mib=self._checked / 2**20)

    def partition_done(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, mib=self._checked / 2**20)

    def print(self, line: str) -> None:
        if self._progress is not None and self._out.isatty():
            # The same terminal: print above the bar rather than through it.
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self._out)
