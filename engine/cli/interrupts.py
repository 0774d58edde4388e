"""Ctrl-C in any subcommand: one line, exit status 130, and the cleanup still runs.

The first SIGINT raises KeyboardInterrupt in the main thread, so every `finally` and
`with` on the way out runs: scratch directories are removed, child processes ended,
logs closed. `main` then prints one line and returns 130 (128 + SIGINT, the shell's
convention). A second SIGINT while that cleanup runs ends the process at once, for a
cleanup that hangs; it says so in one more line. A SIGINT the parent ignores (a
background job, `nohup`) stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130


@contextlib.contextmanager
def first_sigint_raises(prog: str) -> Iterator[None]:
    """Inside: the first SIGINT raises KeyboardInterrupt, a second exits 130 at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signal handlers belong to the main thread: a test calling main elsewhere)
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        yield
        return
    # (Here, not at the top: `--help` loads the standard library only.)
    from oncelog.bench.sigint import note_sigint

    again = exits_at_once(prog)

    def first(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, again)
        note_sigint()  # (for an error that hides the interrupt: see interrupts_win)
        raise KeyboardInterrupt

    note_sigint(False)
    signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        # (None: a handler not set from Python, which cannot be put back: the default then)
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        note_sigint(False)


def exits_at_once(prog: str) -> Callable[[int, FrameType | None], None]:
    """The SIGINT handler once a first one was taken (by `first_sigint_raises`, or by
    `oncelog serve`'s event loop, which drains on it): one line, exit 130 at once."""

    def again(signum: int, frame: FrameType | None) -> None:
        # os.write, not print: the interrupted code may be inside a print to stderr.
        os.write(2, f"{prog}: interrupted again: exiting without cleaning up\n".encode())
        os._exit(EXIT_INTERRUPTED)

    return again


@contextlib.contextmanager
def interrupts_win() -> Iterator[None]:
    """Around a subcommand: after a Ctrl-C, what leaves is a KeyboardInterrupt, so that `main`
    prints its one line. An error raised because of it (see `oncelog.bench.sigint.interrupted`:
    a log the interrupt failed refuses a clean close, a library replaced it with an error of
    its own) is not printed; a subcommand that returns although a SIGINT came (a library
    swallowed it) still ends as interrupted."""
    from oncelog.bench.sigint import interrupted, sigint_noted

    try:
        yield
    except Exception as exc:
        if interrupted(exc):
            raise KeyboardInterrupt from exc
        raise
    if sigint_noted():
        raise KeyboardInterrupt
