"""The compiled module (oncelog._append), loaded once for every layer that has a C path.

The client append and recovery's tail scan reach it through oncelog.compiled_append;
producer state's bulk map load (oncelog.pid_map) sits below that layer and reaches it
here. None when it is not built: a build with no C compiler warns once, at import.
`ONCELOG_PURE=1` silences the warning, and every C path is then left unused; so is it
inside `forced_pure()` (the tests' and the torture self-test's switch), which every
layer reads through `active()` when it chooses a path.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Iterator
from types import ModuleType

PURE_ENV = "ONCELOG_PURE"

pure_at_start: bool = os.environ.get(PURE_ENV) == "1"


def _load() -> ModuleType | None:
    try:
        module = importlib.import_module("oncelog._append")
    except ImportError as exc:
        if not pure_at_start:
            warnings.warn(
                f"oncelog's compiled append (oncelog._append) is not built ({exc}); appends take the "
                "Python path, several times slower. Install with a C compiler to build it, or set "
                f"{PURE_ENV}=1 to choose the Python path and silence this.",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    return module


compiled: ModuleType | None = _load()
_forced_pure = False  # inside forced_pure()


def active() -> ModuleType | None:
    """The compiled module if a C path may be taken now: built, and neither ONCELOG_PURE=1
    nor inside forced_pure()."""
    return None if pure_at_start or _forced_pure else compiled


def forcing_pure() -> bool:
    """Whether forced_pure() is on: a C path a module bound at import is left unused meanwhile."""
    return _forced_pure


@contextlib.contextmanager
def forced_pure(pure: bool = True) -> Iterator[None]:
    """Inside the block no C path is chosen (when `pure`; else as outside it)."""
    global _forced_pure
    previous, _forced_pure = _forced_pure, _forced_pure or pure
    try:
        yield
    finally:
        _forced_pure = previous
