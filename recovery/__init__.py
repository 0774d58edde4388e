"""oncelog.recovery: the filesystem seam, the loader and (later) snapshots and torture tests."""

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
