"""Ctrl-C in the processes `oncelog bench`, `demo` and `torture` run: no child left
behind, no interrupt mistaken for an error.

Children (`oncelog serve` for the wire figures and the demo, the wire benchmark's
fetcher, the torture test's and the demo's appenders): the parent ends each on its way
out (a `finally`, a `with`). But a KeyboardInterrupt raised inside `subprocess.Popen`,
after the fork and before Popen returns, loses the child: Popen closes its pipes and
re-raises, and nobody holds the process to end it (it runs on, writing into a scratch
directory the parent is removing). Inside `sigint_deferred` a SIGINT is only noted, and
raised at the end of the block, once the caller holds the child.

Errors: a KeyboardInterrupt can come back as another exception, raised because of it: a
log it failed refuses a clean close (LogFailedError), CPython wraps it (SystemError,
"returned a result with an exception set") when it lands in Python code that C code
called, and confluent-kafka's C code replaces it outright (a TypeError about its
configuration, with no trace of the interrupt). So the command line notes every SIGINT
it takes (`note_sigint`), and `interrupted` counts any error after one as the interrupt:
for the handlers that turn errors into findings or failed steps and go on.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_sigint_noted = False


def note_sigint(noted: bool = True) -> None:
    """A SIGINT was taken (the command line's handler says so); False: forget it."""
    global _sigint_noted
    _sigint_noted = noted


def sigint_noted() -> bool:
    return _sigint_noted


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """A SIGINT inside the block goes to the process's handler at the block's end.

    For a spawn: `with sigint_deferred(): self.proc = subprocess.Popen(...)`, the block
    inside the `try` whose way out ends the child. Outside the main thread (where signal
    handlers run) it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        # (None: a handler not set from Python, which cannot be put back: the default then)
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        if caught and previous != signal.SIG_IGN:
            signal.raise_signal(signal.SIGINT)  # the handler runs here: a KeyboardInterrupt, say


def interrupted(exc: BaseException) -> bool:
    """Whether a Ctrl-C is behind `exc`: a KeyboardInterrupt, an exception raised while one
    was handled or from one (its `__context__` or `__cause__` chain holds it), or any
    exception once the command line took a SIGINT (`note_sigint`)."""
    if _sigint_noted:
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def raise_if_interrupted(exc: BaseException) -> None:
    """For a handler that turns any error into a finding and goes on: a Ctrl-C's goes on up."""
    if interrupted(exc):
        raise exc
