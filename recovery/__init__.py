"""oncelog.recovery: the filesystem seam, the loader and (later) snapshots and torture tests."""

from oncelog.recovery.fs import DEFAULT_FS, FileHandle, FileSystem, MappedRegion, OsFileSystem

__all__ = ["DEFAULT_FS", "FileHandle", "FileSystem", "MappedRegion", "OsFileSystem"]
