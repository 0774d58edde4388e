"""FaultFileSystem: the fault-injecting, in-memory twin of the filesystem seam.

It implements `FileSystem`, `FileHandle`, `MappedRegion`, `MetadataStore` and `DirLock`
with no disk I/O, on the model of `crash_states`: durable and volatile bytes per file,
durable and volatile entries per directory, fsync barriers between them. From any
moment it can produce the state a crash leaves (`crash`), kill the "process" at the
n-th I/O call (`kill_at`), and make writes or fsyncs fail (`fail_next`, error rates).
Everything random comes from the seed, and every message carries it.

I/O calls (counted in `io_calls`, where a kill or an injected error can land): every
creating open (lock and a read-write open_store included), a mkdir that creates,
pwritev, truncate, fsync, fdatasync, region.flush, fsync_dir, rename, unlink and
store.put. Reads, close, exists, listdir and a read-only open_store change nothing
persistent and are not counted. Paths are compared as strings after os.path.normpath
(no cwd): "a/b" and "/cwd/a/b" are different files.

Modelling decisions not covered in `crash_states`:
- mkdir is durable at once (what the engine needs of directories is made by hand
  and never removed, so their own durability is not what a torture test is after).
- `MetadataStore.put` is one atomic, durable commit (LMDB with sync=True), but it is
  an I/O call, so a kill can land on it. A store's bytes are not modelled, so it is
  never damaged; a file where its directory belongs raises CorruptMetadataError, as
  LmdbStore does.
- A mapping has its own buffer, kept coherent with the page cache: the page cache
  takes in what was written through the mapping before every operation on the
  file (as dirty 4 KiB pages, i.e. pending writes), and writes and truncates are
  copied back into the mapping. The buffer never has to resize, so numpy views on
  it stay valid whatever happens to the file.
- Once killed, the twin is dead: every later I/O call raises `SimulatedCrash` and
  writes through mappings are no longer taken in (the page cache was frozen at death).
- `region.flush()` (msync) is modelled as fdatasync of the whole file: a slight
  over-approximation of durability that the engine never relies on.
- Disk blocks are tracked per file (`Reservations`): bytes written with pwritev and
  ranges reserved with allocate have them; a truncate that grows a file gives none
  (sparse), one that cuts frees what lies past the cut. On a real disk a mapped write
  to a page without a block is SIGBUS once the disk is full, so every writable
  mapping of bytes without blocks, every mapped write to them, and every mapping
  left reaching past a truncated end is recorded in `sigbus_risks` (a test or the
  torture checker asserts it stays empty). A crash forgets every reservation (the
  new twin knows of none): the strictest reading, since what survives of an
  unsynced fallocate is the filesystem's choice.

Long on purpose: the twin implements the whole seam (files, mappings, directories,
locks, stores) against one in-memory model of durable and volatile state, and every
part must keep that model's barriers exactly as the others do.
"""

from __future__ import annotations

import errno as errnos
import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from oncelog.errors import CorruptMetadataError, read_only_error
from oncelog.segments.format import Buffer
from oncelog.storage.fs import (
    DirListing,
    DirLock,
    FileHandle,
    FinishedSync,
    LockTable,
    MappedRegion,
    MetadataStore,
    PendingSync,
)
from oncelog.storage.lmdb_store import LmdbStore
from oncelog.torture.crash_states import (
    AppliedFault,
    CrashMode,
    Directory,
    Inode,
    Model,
    Op,
    crash_model,
)

PAGE = 4096
# Operations `fail_next` can target; "fsync" covers fsync, fdatasync and region.flush.
FAILABLE_OPS = (
    "open",
    "write",
    "allocate",
    "truncate",
    "fsync",
    "fsync_dir",
    "rename",
    "unlink",
    "put",
    "mkdir",
)


# The calls `write_error_rate` fails: everything that needs free disk space.
_WRITE_OPS = ("write", "allocate", "put")


class SimulatedCrash(Exception):
    """The simulated process died. Deliberately not an OSError: no engine handler may swallow it."""


@dataclass
class _Failure:
    op: str
    errno: int
    target: Callable[[str], bool] | None


def _norm(path: str) -> str:
    return os.path.normpath(os.fspath(path))


def _split(path: str) -> tuple[str, str]:
    head, name = os.path.split(_norm(path))
    return head or ".", name


class Reservations:
    """The byte ranges of each file (by inode number) that have disk blocks."""

    def __init__(self) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}

    def add(self, ino: int, start: int, end: int) -> None:
        if start >= end:
            return
        merged: list[tuple[int, int]] = []
        for lo, hi in self._ranges.get(ino, []):
            if hi < start or lo > end:
                merged.append((lo, hi))
            else:  # overlapping or touching: one range
                start, end = min(lo, start), max(hi, end)
        merged.append((start, end))
        self._ranges[ino] = sorted(merged)

    def cut(self, ino: int, size: int) -> None:
        """A truncate to `size`: blocks past it are freed."""
        self._ranges[ino] = [(lo, min(hi, size)) for lo, hi in self._ranges.get(ino, []) if lo < size]

    def first_gap(self, ino: int, start: int, end: int) -> tuple[int, int] | None:
        """The first sub-range of [start, end) without blocks; None if it has them all."""
        at = start
        for lo, hi in self._ranges.get(ino, []):  # sorted and disjoint
            if hi <= at:
                continue
            if lo > at:
                return (at, min(lo, end)) if at < end else None
            at = hi
        return (at, end) if at < end else None


class FaultRegion:
    """A shared mapping of the first `size` bytes of a file."""

    def __init__(self, fs: FaultFileSystem, path: str, inode: Inode, size: int, writable: bool):
        self._fs = fs
        self.path = path
        self.inode = inode
        self.size = size
        self.data = bytearray(inode.volatile[:size])
        self._view = memoryview(self.data) if writable else memoryview(self.data).toreadonly()

    @property
    def buffer(self) -> memoryview:
        return self._view

    def flush(self) -> None:
        self._fs._io("fsync", self.path, self.inode)
        self._fs._fsync(self.inode)

    def close(self) -> None:
        self._fs._pull(self.inode)
        # Like OsMappedRegion: views still exported (numpy arrays) make this raise.
        self._view.release()
        regions = self._fs._regions.get(self.inode.ino, [])
        if self in regions:
            regions.remove(self)


class FaultFile:
    def __init__(self, fs: FaultFileSystem, path: str, inode: Inode, writable: bool):
        self._fs = fs
        self._path = path
        self._inode = inode
        self._writable = writable
        self._closed = False

    @property
    def path(self) -> str:
        return self._path

    def _check(self, write: bool = False) -> None:
        if self._closed:
            raise OSError(errnos.EBADF, "file is closed", self._path)
        if write and not self._writable:
            raise OSError(errnos.EBADF, "file is open read-only", self._path)

    def size(self) -> int:
        self._check()
        return len(self._inode.volatile)

    def pread(self, size: int, offset: int) -> bytes:
        self._check()
        self._fs._pull(self._inode)
        return bytes(self._inode.volatile[offset : offset + size])

    def pread_into(self, buffer: memoryview, offset: int) -> int:
        data = self.pread(len(buffer.cast("B")), offset)
        buffer.cast("B")[: len(data)] = data
        return len(data)

    def data_end(self, start: int) -> int:
        return self.size()  # the twin keeps no holes: every byte is read and checked

    def direct_write_fd(self) -> int:
        return -1  # the twin keeps unsynced data in memory: every write comes through it

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        self._check(write=True)
        self._fs._io("write", self._path)
        data = b"".join(bytes(b) for b in buffers)
        self._fs._change(self._inode, Op(offset, data))
        self._fs.reservations.add(self._inode.ino, offset, offset + len(data))
        return len(data)

    def truncate(self, size: int) -> None:
        self._check(write=True)
        self._fs._io("truncate", self._path)
        self._fs._change(self._inode, Op(size))
        self._fs.reservations.cut(self._inode.ino, size)
        for region in self._fs._regions.get(self._inode.ino, []):
            if region.size > size:  # touching the mapping past the new end is SIGBUS
                self._fs._sigbus_risk(
                    f"a {region.size}-byte mapping of {self._path} outlives its cut to {size}"
                )

    def allocate(self, size: int, *, start: int = 0) -> None:
        self._check(write=True)
        self._fs._io("allocate", self._path)
        if size > len(self._inode.volatile):
            # Reserved blocks read as zeros, like a file extended by truncate.
            self._fs._change(self._inode, Op(size))
        self._fs.reservations.add(self._inode.ino, start, size)

    def fsync(self) -> None:
        self._check()
        self._fs._io("fsync", self._path, self._inode)
        self._fs._fsync(self._inode)

    def fdatasync(self) -> None:
        self.fsync()  # the size is data too; nothing else here has metadata to skip

    def mmap(self, size: int, *, writable: bool) -> MappedRegion:
        self._check(write=writable)
        if not 0 < size <= len(self._inode.volatile):
            raise ValueError(f"mmap of {size} bytes of {self._path} ({len(self._inode.volatile)} bytes)")
        self._fs._pull(self._inode)
        gap = self._fs.reservations.first_gap(self._inode.ino, 0, size) if writable else None
        if gap is not None:
            self._fs._sigbus_risk(f"a writable {size}-byte mapping of {self._path} has no blocks at {gap}")
        region = FaultRegion(self._fs, self._path, self._inode, size, writable)
        self._fs._regions.setdefault(self._inode.ino, []).append(region)
        return region

    def close(self) -> None:
        self._closed = True  # a mapping outlives its descriptor, as on Linux


class FaultStore:
    """A metadata store of the model; a `readonly` one refuses put and delete."""

    def __init__(self, fs: FaultFileSystem, path: str, *, readonly: bool = False):
        self._fs = fs
        self._path = path
        self._readonly = readonly

    @property
    def path(self) -> str:
        return self._path

    def get(self, key: str) -> bytes | None:
        return self._fs._model.stores[self._path].get(key)

    def put(self, values: Mapping[str, bytes]) -> None:
        if self._readonly:
            raise read_only_error("put into the metadata store", self._path)
        self._fs._io("put", self._path)
        self._fs._model.stores[self._path].update({key: bytes(value) for key, value in values.items()})

    def delete(self, keys: Sequence[str]) -> None:
        if self._readonly:
            raise read_only_error("delete from the metadata store", self._path)
        self._fs._io("put", self._path)
        store = self._fs._model.stores[self._path]
        for key in keys:
            store.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self._fs._model.stores[self._path] if key.startswith(prefix))

    def generation(self) -> int:
        # Of the content: any commit that changes a value changes it.
        return hash(frozenset(self._fs._model.stores[self._path].items()))

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        return sorted(
            (key, value)
            for key, value in self._fs._model.stores[self._path].items()
            if key.startswith(prefix)
        )

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
        if self._readonly:
            raise read_only_error("update the metadata store", self._path)
        self._fs._io("put", self._path)
        store = self._fs._model.stores[self._path]
        new = change(store.get(key))
        if new is None:
            store.pop(key, None)
        else:
            store[key] = bytes(new)
        return new

    def close(self) -> None:
        pass


class FaultLock:
    def __init__(self, fs: FaultFileSystem, path: str):
        self._fs = fs
        self._path: str | None = path

    def release(self) -> None:
        path, self._path = self._path, None
        if path is not None:  # twice releases once: the key may be another holder's by then
            self._fs._locks.discard(path)


class FaultLockTable:
    """Directory locks as the OS table keeps them: one per directory, any two holders conflict."""

    def __init__(self, fs: FaultFileSystem, path: str):
        self._fs = fs
        self._path = path
        self._held: list[FaultLock] | None = []

    def lock(self, directory: str) -> DirLock:
        if self._held is None:
            raise ValueError(f"the lock table {self._path} is closed")
        key = _norm(directory)
        if key not in self._fs._model.dirs:
            raise FileNotFoundError(errnos.ENOENT, "no such directory", directory)
        held = self._fs._take_lock(f"directory:{key}", directory)
        self._held.append(held)
        return held

    def close(self) -> None:
        held, self._held = self._held or [], None
        for lock in held:
            lock.release()


class FaultFileSystem:
    """The seam, in memory, with crash states and injected errors; see the module docstring."""

    def __init__(
        self,
        seed: int = 0,
        *,
        write_error_rate: float = 0.0,
        fsync_error_rate: float = 0.0,
        _model: Model | None = None,
        _lineage: str | None = None,
    ):
        self.seed = seed
        # Probability that any write (pwritev, the allocate before mapped writes, a
        # metadata store commit) fails with ENOSPC or EIO, and that any fsync fails
        # with EIO (and drops the file's unsynced data: fsyncgate).
        self.write_error_rate = write_error_rate
        self.fsync_error_rate = fsync_error_rate
        self.io_calls = 0
        self.faults: list[AppliedFault] = []  # what the crash that made this twin did
        self.injected: list[str] = []  # errors raised by this twin
        # Disk blocks per file, and what would be SIGBUS on a full disk (module docstring).
        self.reservations = Reservations()
        self.sigbus_risks: list[str] = []
        self.lineage = _lineage or f"seed={seed}"
        self._model = _model or Model()
        self._errors = random.Random(f"{seed}/errors")
        self._kill_at: int | None = None
        self._dead = False
        self._crashes = 0
        self._failures: list[_Failure] = []
        self._regions: dict[int, list[FaultRegion]] = {}
        self._locks: set[str] = set()
        # Called before every I/O call: the torture harness's scheduler switches threads there.
        self.on_io: Callable[[], None] | None = None
        # When a list: every I/O call is appended as (its number, op, path), the one a kill
        # lands on included (the cleaning class finds its crash points in a rehearsal's trace).
        self.trace: list[tuple[int, str, str]] | None = None

    # -- fault injection -----------------------------------------------------------
    def kill_at(self, n: int | None) -> None:
        """Make the n-th I/O call (counting from 1, over the twin's life) raise SimulatedCrash."""
        self._kill_at = n

    @property
    def dead(self) -> bool:
        return self._dead

    def fail_next(self, op: str, errno: int, target: Callable[[str], bool] | None = None) -> None:
        """Make the next `op` call (on a path `target` accepts) raise OSError(errno)."""
        if op not in FAILABLE_OPS:
            raise ValueError(f"op is one of {FAILABLE_OPS}, got {op!r}")
        self._failures.append(_Failure(op, errno, target))

    def crash(self, mode: CrashMode, *, target: Callable[[str], bool] | None = None) -> FaultFileSystem:
        """A new twin holding what a crash of class `mode` leaves on disk now; this one is unchanged.

        `target` limits the data faults (dropped, torn, misdirected writes, the bit
        flip) to the files whose path it accepts; on the others every write landed.
        """
        self._pull_all()
        self._crashes += 1
        rng = random.Random(f"{self.lineage}/crash{self._crashes}/{mode}")
        model, faults = crash_model(self._model, mode, rng, target)
        child_seed = rng.getrandbits(63)
        lineage = f"{self.lineage} crash#{self._crashes}({mode})"
        child = FaultFileSystem(
            child_seed,
            write_error_rate=self.write_error_rate,
            fsync_error_rate=self.fsync_error_rate,
            _model=model,
            _lineage=lineage,
        )
        child.faults = faults
        return child

    def describe(self) -> str:
        """The seed, crashes and faults that led here: enough to reproduce the state."""
        parts = [self.lineage, f"io_calls={self.io_calls}"]
        if self._kill_at is not None:
            parts.append(f"kill_at={self._kill_at}{' (dead)' if self._dead else ''}")
        parts += [str(fault) for fault in self.faults]
        parts += self.injected
        return "; ".join(parts)

    def _io(self, op: str, path: str, inode: Inode | None = None) -> None:
        """Every call that changes persistent state passes here first: count, kill, fail."""
        if self.on_io is not None:
            self.on_io()
        if self._dead:
            raise SimulatedCrash(f"I/O after the simulated crash ({op} {path}; {self.lineage})")
        self.io_calls += 1
        if self.trace is not None:
            self.trace.append((self.io_calls, op, path))
        if self._kill_at is not None and self.io_calls == self._kill_at:
            self._pull_all()  # the page cache as it stood at the moment of death
            self._dead = True
            raise SimulatedCrash(f"killed at I/O call {self.io_calls} ({op} {path}; {self.lineage})")
        code: int | None = None
        for failure in self._failures:
            if failure.op == op and (failure.target is None or failure.target(path)):
                self._failures.remove(failure)
                code = failure.errno
                break
        if code is None and op in _WRITE_OPS and self._errors.random() < self.write_error_rate:
            code = self._errors.choice((errnos.ENOSPC, errnos.EIO))
        if code is None and op == "fsync" and self._errors.random() < self.fsync_error_rate:
            code = errnos.EIO
        if code is not None:
            message = f"{os.strerror(code)} (injected at I/O call {self.io_calls}, {self.lineage})"
            self.injected.append(f"{op} {path}: {errnos.errorcode.get(code, code)} at call {self.io_calls}")
            if op == "fsync" and inode is not None:
                # fsyncgate: the kernel marks the pages clean without writing them, so
                # a later fsync "succeeds" and these bytes never reach the disk.
                self._pull(inode)
                inode.pending.clear()
            raise OSError(code, message, path)

    def unreserved(self, path: str, start: int, end: int) -> tuple[int, int] | None:
        """The first range of bytes [start, end) of the file at `path` that has no disk blocks."""
        inode = self._inode_of(path)
        if inode is None:
            raise FileNotFoundError(errnos.ENOENT, "no such file", path)
        return self.reservations.first_gap(inode.ino, start, end)

    # -- page cache and mappings -------------------------------------------------------
    def _sigbus_risk(self, what: str) -> None:
        if not self._dead:
            self.sigbus_risks.append(f"{what} ({self.lineage}, I/O call {self.io_calls})")

    def _pull(self, inode: Inode) -> None:
        """Take writes made through mappings into the page cache, as dirty 4 KiB pages.

        Each dirty page becomes one write of the bytes that changed in it: writeback
        rewrites the rest of the page with the same content, and a sector rewritten
        with what it held reads the same whether or not the write reached it, so a
        torn writeback cannot damage bytes that were already durable.
        """
        if self._dead:
            return
        for region in self._regions.get(inode.ino, []):
            end = min(region.size, len(inode.volatile))
            if region.data[:end] == inode.volatile[:end]:
                continue
            for page in range(0, end, PAGE):
                stop = min(page + PAGE, end)
                new, old = region.data[page:stop], inode.volatile[page:stop]
                if new != old:
                    changed = np.flatnonzero(np.frombuffer(new, np.uint8) != np.frombuffer(old, np.uint8))
                    first, last = page + int(changed[0]), page + int(changed[-1]) + 1
                    inode.record(Op(first, bytes(region.data[first:last])))
                    gap = self.reservations.first_gap(inode.ino, first, last)
                    if gap is not None:
                        self._sigbus_risk(f"a mapped write to {region.path} at {gap} has no blocks")

    def _pull_all(self) -> None:
        for regions in list(self._regions.values()):
            if regions:
                self._pull(regions[0].inode)

    def _change(self, inode: Inode, op: Op) -> None:
        self._pull(inode)
        inode.record(op)
        for region in self._regions.get(inode.ino, []):
            # Copy the page cache back into the mapping; past the end reads as zeros.
            end = min(region.size, len(inode.volatile))
            region.data[:end] = inode.volatile[:end]
            region.data[end:] = bytes(region.size - end)

    def _fsync(self, inode: Inode) -> None:
        self._pull(inode)
        inode.sync()

    def _inode_of(self, path: str) -> Inode | None:
        head, name = _split(path)
        directory = self._model.dirs.get(head)
        return None if directory is None else directory.volatile.get(name)

    # -- the FileSystem protocol ---------------------------------------------------------
    def _dir(self, path: str) -> Directory:
        directory = self._model.dirs.get(_norm(path))
        if directory is None:
            raise FileNotFoundError(errnos.ENOENT, "no such directory", path)
        return directory

    def open(self, path: str, *, create: bool = False, writable: bool = True) -> FileHandle:
        head, name = _split(path)
        if _norm(path) in self._model.dirs:
            raise IsADirectoryError(errnos.EISDIR, "is a directory", path)
        if create:
            self._io("open", path)
        directory = self._dir(head)
        inode = directory.volatile.get(name)
        if inode is None:
            if not create:
                raise FileNotFoundError(errnos.ENOENT, "no such file", path)
            inode = self._model.new_inode()
            directory.record(((name, inode),))
        return FaultFile(self, path, inode, writable)

    def store_version(self, path: str) -> bytes | None:
        if self._inode_of(path) is not None:
            raise CorruptMetadataError("a file where the metadata store's directory should be", path=path)
        store = self._model.stores.get(_norm(path))
        if store is None:
            return None
        self._io("open", path)
        # Of the content itself: any commit that changes a value changes it.
        digest = hashlib.blake2b(digest_size=16)
        for key, value in sorted(store.items()):
            digest.update(len(key).to_bytes(4, "big") + key.encode() + len(value).to_bytes(4, "big") + value)
        return digest.digest()

    def open_store(self, path: str, *, readonly: bool = False) -> MetadataStore:
        if self._inode_of(path) is not None:
            # As LmdbStore: a file where the store's directory belongs is a damaged store.
            raise CorruptMetadataError("a file where the metadata store's directory should be", path=path)
        if readonly:  # creates nothing: no I/O call, and only an existing store opens
            if _norm(path) not in self._model.stores:
                raise FileNotFoundError(errnos.ENOENT, "no metadata store", path)
            return FaultStore(self, _norm(path), readonly=True)
        self._io("open", path)
        self._makedirs(path)
        self._model.stores.setdefault(_norm(path), {})
        return FaultStore(self, _norm(path))

    def lock(self, path: str) -> DirLock:
        self.open(path, create=True).close()  # the lock file exists, as with flock
        return self._take_lock(_norm(path), path)

    def lock_table(self, path: str, *, every_shard: bool = False) -> LockTable:
        self.mkdir(path)  # the table's directory exists, as on the OS
        return FaultLockTable(self, path)

    def _take_lock(self, key: str, path: str) -> FaultLock:
        if key in self._locks:
            raise BlockingIOError(errnos.EWOULDBLOCK, "already locked", path)
        self._locks.add(key)
        return FaultLock(self, key)

    def exists(self, path: str) -> bool:
        return _norm(path) in self._model.dirs or self._inode_of(path) is not None

    def is_dir(self, path: str) -> bool:
        return _norm(path) in self._model.dirs

    def filesystem_of(self, path: str) -> int:
        if not self.exists(path):
            raise FileNotFoundError(errnos.ENOENT, "no such file or directory", path)
        return 0  # one modelled filesystem

    def file_size(self, path: str) -> int:
        inode = self._inode_of(path)
        if inode is None:
            raise FileNotFoundError(errnos.ENOENT, "no such file", path)
        return len(inode.volatile)

    def modified_ms(self, path: str) -> int:
        self.file_size(path)  # (FileNotFoundError as the OS)
        return -1  # the twin keeps no times

    def listdir(self, path: str) -> list[str]:
        key = _norm(path)
        names = set(self._dir(key).volatile)
        # Subdirectories too (the metadata store's), as os.listdir shows them.
        names.update(_split(d)[1] for d in self._model.dirs if d != key and _split(d)[0] == key)
        return sorted(names)

    def list_entries(self, path: str) -> DirListing:
        key = _norm(path)
        subdirectories = frozenset(_split(d)[1] for d in self._model.dirs if d != key and _split(d)[0] == key)
        return DirListing(self.listdir(path), subdirectories)  # the twin models no links

    def mkdir(self, path: str) -> None:
        if not self.exists(path):
            self._io("mkdir", path)
        self._makedirs(path)

    def _makedirs(self, path: str) -> None:
        missing: list[str] = []
        key = _norm(path)
        while key not in self._model.dirs:
            if self._inode_of(key) is not None:
                raise FileExistsError(errnos.EEXIST, "a file is in the way", key)
            missing.append(key)
            key = _split(key)[0]
        for key in reversed(missing):
            self._model.dirs[key] = Directory()  # durable at once (module docstring)

    def rename(self, src: str, dst: str) -> None:
        self._io("rename", src)
        src_head, src_name = _split(src)
        dst_head, dst_name = _split(dst)
        inode = self._dir(src_head).volatile.get(src_name)
        if inode is None:
            raise FileNotFoundError(errnos.ENOENT, "no such file", src)
        if src_head == dst_head:
            if src_name != dst_name:
                self._dir(src_head).record(((dst_name, inode), (src_name, None)))
        else:
            # Across directories the two halves are durable separately (each dir's own fsync).
            self._dir(dst_head).record(((dst_name, inode),))
            self._dir(src_head).record(((src_name, None),))

    def unlink(self, path: str) -> None:
        self._io("unlink", path)
        head, name = _split(path)
        if name not in self._dir(head).volatile:
            raise FileNotFoundError(errnos.ENOENT, "no such file", path)
        self._dir(head).record(((name, None),))

    def remove_dir(self, path: str) -> None:
        key = _norm(path)
        if self._dir(key).volatile or any(_split(d)[0] == key for d in self._model.dirs if d != key):
            raise OSError(errnos.ENOTEMPTY, "directory not empty", path)
        self._io("rmdir", path)
        # Directories are durable as soon as made (module docstring), and so is their removal.
        del self._model.dirs[key]
        self._model.stores.pop(key, None)

    def start_sync_filesystem(self, path: str) -> PendingSync:
        # Inline: a thread would make the order of I/O calls, and so every kill point,
        # differ from run to run (and the model is not made for concurrent calls).
        self.sync_filesystem(path)
        return FinishedSync()

    def sync_filesystem(self, path: str) -> None:
        self._io("syncfs", path)
        # Every file and every directory entry of the (one) modelled filesystem.
        for directory in self._model.dirs.values():
            for inode in directory.volatile.values():
                self._fsync(inode)
            directory.sync()

    def fsync_dir(self, path: str) -> None:
        self._io("fsync_dir", path)
        self._dir(path).sync()

    # -- real directories ------------------------------------------------------------------
    @classmethod
    def from_directory(cls, path: str, seed: int = 0, *, into: str | None = None) -> FaultFileSystem:
        """A twin holding the real directory `path` (at `into`, default the same path), all durable.

        A directory holding `data.mdb` is read as a metadata store (LMDB).
        """
        import lmdb

        fs = cls(seed)
        root, dest = _norm(path), _norm(into or path)
        for current, subdirs, files in os.walk(root):
            twin_dir = _norm(os.path.join(dest, os.path.relpath(current, root)))
            fs._makedirs(twin_dir)
            if "data.mdb" in files:
                # Read a copy: LMDB refuses a second handle on an environment this process has open.
                with tempfile.TemporaryDirectory() as scratch:
                    shutil.copyfile(os.path.join(current, "data.mdb"), os.path.join(scratch, "data.mdb"))
                    env = lmdb.open(scratch, readonly=True, lock=False, subdir=True)
                    with env.begin() as txn:
                        fs._model.stores[twin_dir] = {bytes(k).decode(): bytes(v) for k, v in txn.cursor()}
                    env.close()
                subdirs.clear()
                continue
            directory = fs._model.dirs[twin_dir]
            for name in files:
                with open(os.path.join(current, name), "rb") as file:
                    inode = fs._model.new_inode(file.read())
                directory.durable[name] = directory.volatile[name] = inode
        return fs

    def materialize(self, path: str, *, source: str | None = None) -> None:
        """Write the twin's directory `source` (default `path`) as it reads now to the real `path`."""
        src, dest = _norm(source or path), _norm(path)
        self._pull_all()

        def inside(twin_path: str) -> bool:
            if src == ".":
                return not os.path.isabs(twin_path)
            return twin_path == src or twin_path.startswith(src.rstrip("/") + "/")

        for twin_dir in sorted(self._model.dirs):
            if not inside(twin_dir):
                continue
            real = os.path.join(dest, os.path.relpath(twin_dir, src))
            os.makedirs(real, exist_ok=True)
            if twin_dir in self._model.stores:
                store = LmdbStore(real)
                store.put(self._model.stores[twin_dir])
                store.close()
            for name, inode in self._model.dirs[twin_dir].volatile.items():
                with open(os.path.join(real, name), "wb") as file:
                    file.write(inode.volatile)
