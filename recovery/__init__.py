"""oncelog.recovery: what makes a log survive a crash.

`fs` is the filesystem seam every persistent byte goes through; `snapshot` writes
and reads producer-state snapshots; `checkpoint` holds what a log records about
itself durably (recovery point, log start); `plan` decides, for each kind of damage,
what recovery does; `loader` carries it out when a log opens. `torture` holds the
fault-injecting twin of the seam and the crash torture harness.
"""

from oncelog.recovery.fs import (
    DEFAULT_FS,
    DirLock,
    FileHandle,
    FileSystem,
    MappedRegion,
    MetadataStore,
    OsFileSystem,
)

__all__ = [
    "DEFAULT_FS",
    "DirLock",
    "FileHandle",
    "FileSystem",
    "MappedRegion",
    "MetadataStore",
    "OsFileSystem",
]
