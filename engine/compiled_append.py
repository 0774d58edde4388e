"""Which append path a log takes: the compiled one (oncelog._append) or the Python one.

The compiled module does a client append in one C call (see engine/_append.c);
the Python path is the reference and the fallback, and takes every case the
compiled one leaves to it. `ONCELOG_PURE=1` forces the Python path; a build with
no C compiler has only the Python path, and says so once, at import, as a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast

from oncelog import compiled_module
from oncelog.compiled_module import PURE_ENV
from oncelog.segments.format import Buffer

__all__ = ["PURE_ENV", "Appender", "append_method", "client_batch_passes", "enabled", "forced_pure"]


class Appender(Protocol):
    """One log's compiled append: each call returns None when the Python path must take it."""

    def append(self, batch: Any, /) -> Any: ...

    def append_batches(self, batches: Any, /) -> Any: ...

    def close(self) -> None: ...


compiled: ModuleType | None = compiled_module.compiled
# Logs opened inside the block take the Python path (when `pure`; else as outside it); so
# do the pid map's bulk load and expiry (oncelog.pid_map) while it lasts.
forced_pure = compiled_module.forced_pure


_Method = TypeVar("_Method", bound=Callable[..., Any])


def append_method(python: _Method, attribute: str) -> _Method:
    """`python` (a Log's append) as a method whose common call, one bytes batch and no
    keywords, goes straight to the Appender the log keeps in `attribute` (None: the
    Python method); the rest, and whatever the Appender leaves to Python, call `python`.

    Without the compiled module, `python` itself."""
    if compiled is None:
        return python
    return cast(_Method, compiled.AppendMethod(python, attribute))


def tail_scanner(on: bool) -> Callable[..., tuple[int, int, int]] | None:
    """Recovery's compiled tail scan (oncelog._append.scan_tail) for a log whose compiled
    path is `on` (decided once, when it opened: a reload keeps to it)."""
    return compiled.scan_tail if compiled is not None and on else None


def enabled() -> bool:
    """Whether a log opened now takes the compiled path."""
    return compiled_module.active() is not None


def client_batch_passes(buffer: Buffer, max_batch_bytes: int) -> bool:
    """Whether the compiled append's checks pass `buffer` as a client batch: every check
    validation.validate_batch makes (False: not built, forced pure, or left to those)."""
    module = compiled_module.active()
    return module is not None and bool(module.check_client_batch(buffer, max_batch_bytes))
