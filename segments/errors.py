"""The errors the codec and segment files raise: bytes that are bad, or a batch that breaks a rule.

They are the root of oncelog's exception hierarchy, declared at the lowest layer so
segments import nothing else of oncelog; `oncelog.errors` re-exports them with the rest.
"""

from __future__ import annotations

import errno


class OncelogError(Exception):
    """Base class of every error oncelog raises on purpose."""


class CorruptRecordError(OncelogError):
    """Bytes that fail a checksum or cannot be parsed as a record batch.

    `path` and `position` name where the bytes came from when they were read from
    a file; both are None for a buffer handed in by a caller.
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if position is not None:
                where += f" at position {position}"
            where += ": "
        elif position is not None:
            where = f"at position {position}: "
        super().__init__(where + message)
        self.reason = message  # the message without the file and position
        self.path = path
        self.position = position


class InvalidRecordError(OncelogError):
    """A well-formed batch that breaks an append rule (e.g. a control batch from a client)."""


class CorruptLogError(OncelogError):
    """Bad bytes below the recovery point: not a torn tail, real corruption.

    Data below the recovery point was fsynced, so a checksum failure there means
    the disk or something else changed it. oncelog refuses to serve it; opening
    with `LogConfig(on_corruption="truncate")` cuts the log there instead.
    """

    def __init__(self, message: str, *, path: str, position: int):
        super().__init__(f"{path} at position {position}: {message}")
        self.path = path
        self.position = position


class TooManyOpenFilesError(OncelogError, OSError):
    """A sealed segment's file could not be reopened for a read: the process is at its
    open-files limit (EMFILE) or the system at its own (ENFILE). The read changed nothing
    and may succeed once descriptors are closed. An OSError too, with the errno and the path."""


def out_of_descriptors(exc: OSError, what: str, path: str) -> OSError:
    """TooManyOpenFilesError for `exc` if it is EMFILE or ENFILE (`what` failed at `path`);
    else `exc` itself."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE) or isinstance(exc, TooManyOpenFilesError):
        return exc
    return TooManyOpenFilesError(exc.errno, f"{what}: {exc.strerror or exc}", path)
