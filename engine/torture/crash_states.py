"""The state model behind `FaultFileSystem`, and the crash states it may legally leave.

A file (an `Inode`) has *durable* content (as of its last successful fsync) and
*volatile* content (what reads see now, i.e. the page cache), plus the list of
operations since the last fsync that turn one into the other. A directory keeps
a durable and a volatile namespace (name -> inode) and the entry operations
between them. `crash_model` turns a `Model` into the on-disk state after a crash
of one fault class, choosing with a seeded `random.Random`, without mutating it.

Modelling decisions (each one says why):
- Data operations are positional writes and truncates, replayed in order onto the
  durable bytes. An fsync replays the pending list rather than copying the volatile
  bytes, so data whose fsync failed (and was dropped, "fsyncgate") stays lost.
- Unsynced data writes may reach the disk in any subset (the worst case;
  Linux writeback gives no order between dirty pages), so "drop" picks a prefix,
  a prefix with one operation omitted (ALICE) or an arbitrary subset.
- Directory operations are kept as a per-directory list of atomic steps and a
  crash keeps a *prefix* of each list: journaling filesystems commit metadata in
  order and rename is atomic, so a crash never shows half a rename.
- Torn writes fill only the bytes of the torn write itself (the powersafe-overwrite
  assumption SQLite makes by default): a torn write never damages bytes that were
  already durable in a shared sector.
- A misdirected write is a power-loss state: every other pending write reached the
  disk, the misdirected one landed elsewhere in the same file (bytes at its intended
  place keep their old content).
- A lost file is an operator's mistake or a bad restore, not the disk's: after a kill
  (the page cache survives), one file that was fsynced whole (its durable bytes are
  all it holds) is deleted or emptied. `target` picks which files may be lost.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

CrashMode = Literal["kill", "drop", "torn", "dirent", "bitflip", "misdirect", "lost"]
CRASH_MODES: tuple[CrashMode, ...] = ("kill", "drop", "torn", "dirent", "bitflip", "misdirect", "lost")
SECTOR_SIZES = (512, 4096)


@dataclass(frozen=True)
class Op:
    """One data operation: write `data` at `offset`, or (data None) truncate to `offset` bytes."""

    offset: int
    data: bytes | None = None

    @property
    def is_write(self) -> bool:
        return self.data is not None


def apply_op(content: bytearray, op: Op) -> None:
    if op.data is None:
        if op.offset < len(content):
            del content[op.offset :]
        else:
            content.extend(bytes(op.offset - len(content)))
        return
    end = op.offset + len(op.data)
    if op.offset > len(content):
        content.extend(bytes(op.offset - len(content)))  # a hole reads as zeros
    content[op.offset : end] = op.data


class Inode:
    """A file's bytes, independent of the names it has (handles keep writing after a rename)."""

    __slots__ = ("durable", "ino", "pending", "volatile")

    def __init__(self, ino: int, content: bytes = b""):
        self.ino = ino
        self.durable = bytearray(content)
        self.volatile = bytearray(content)
        self.pending: list[Op] = []

    def record(self, op: Op) -> None:
        apply_op(self.volatile, op)
        self.pending.append(op)

    def sync(self) -> None:
        self.durable = _replay(self.durable, self.pending)
        self.pending.clear()


# One atomic directory step: the names it binds (an inode) or removes (None).
DirOp = tuple[tuple[str, Inode | None], ...]


class Directory:
    __slots__ = ("durable", "pending", "volatile")

    def __init__(self) -> None:
        self.durable: dict[str, Inode] = {}
        self.volatile: dict[str, Inode] = {}
        self.pending: list[DirOp] = []

    def record(self, step: DirOp) -> None:
        _apply_dir_op(self.volatile, step)
        self.pending.append(step)

    def sync(self) -> None:
        self.durable = dict(self.volatile)
        self.pending.clear()


def _apply_dir_op(names: dict[str, Inode], step: DirOp) -> None:
    for name, inode in step:
        if inode is None:
            names.pop(name, None)
        else:
            names[name] = inode


@dataclass
class Model:
    """Everything persistent: directories (durable as soon as made) and metadata stores."""

    dirs: dict[str, Directory] = field(default_factory=lambda: {"/": Directory(), ".": Directory()})
    stores: dict[str, dict[str, bytes]] = field(default_factory=dict)
    next_ino: int = 1

    def new_inode(self, content: bytes = b"") -> Inode:
        inode = Inode(self.next_ino, content)
        self.next_ino += 1
        return inode


@dataclass(frozen=True)
class AppliedFault:
    """One fault a crash applied, precise enough to find the bytes it touched."""

    kind: str
    path: str
    offset: int = -1
    length: int = 0
    detail: str = ""
    # Where fsynced bytes were changed (a bit flip, a misdirected write's landing); -1: none.
    damaged_at: int = -1

    def __str__(self) -> str:
        where = f"{self.path}@{self.offset}+{self.length}" if self.offset >= 0 else self.path
        return f"{self.kind} {where} {self.detail}".rstrip()


def _join(directory: str, name: str) -> str:
    return name if directory == "." else directory.rstrip("/") + "/" + name


def crash_model(
    model: Model, mode: CrashMode, rng: random.Random, target: Callable[[str], bool] | None = None
) -> tuple[Model, list[AppliedFault]]:
    """The on-disk state after a crash of class `mode`; `target` limits which files get data faults."""
    if mode not in CRASH_MODES:
        raise ValueError(f"crash mode is one of {CRASH_MODES}, got {mode!r}")
    faults: list[AppliedFault] = []
    eligible = target or (lambda path: True)

    # 1. Namespaces: which creates, renames and unlinks survived.
    namespaces = _crash_namespaces(model, mode, rng, faults)

    # 2. The inodes still reachable, each under its first name (sorted: deterministic).
    reachable: dict[int, tuple[str, Inode]] = {}
    for path, names in namespaces.items():
        for name in sorted(names):
            reachable.setdefault(names[name].ino, (_join(path, name), names[name]))
    inodes = [reachable[ino] for ino in sorted(reachable)]

    # 3. Contents. Kill-like modes keep the page cache; power-loss modes replay a subset.
    contents: dict[int, bytearray] = {}
    special: tuple[str, Inode, int] | None = None  # (path, inode, index of the torn/misdirected write)
    if mode in ("torn", "misdirect"):
        candidates = [
            (path, inode, n)
            for path, inode in inodes
            if eligible(path)
            for n, op in enumerate(inode.pending)
            if op.is_write
        ]
        if candidates:
            special = rng.choice(candidates)
        else:
            faults.append(AppliedFault(mode, "-", detail="no pending write to damage"))
    for path, inode in inodes:
        if mode in ("kill", "dirent", "bitflip", "lost"):
            contents[inode.ino] = bytearray(inode.volatile)
        elif mode == "misdirect" and special is not None and special[1] is inode:
            contents[inode.ino] = _misdirect(path, inode, special[2], rng, faults)
        elif mode in ("drop", "torn") and eligible(path) and inode.pending:
            forced = special[2] if special is not None and special[1] is inode else None
            contents[inode.ino] = _power_loss(path, inode, rng, faults, forced)
        else:
            # Power loss with every pending write on disk. Not simply the page cache:
            # after a failed fsync (fsyncgate) the disk lacks what the cache shows.
            contents[inode.ino] = _replay(inode.durable, inode.pending)
    if mode == "bitflip":
        _bitflip([(p, i) for p, i in inodes if eligible(p)], contents, rng, faults)
    if mode == "lost":
        _lose_a_file([(p, i) for p, i in inodes if eligible(p)], namespaces, contents, rng, faults)

    # 4. The new model: every survivor is durable as it now stands on disk.
    return _durable_model(model, namespaces, contents), faults


def _crash_namespaces(
    model: Model, mode: CrashMode, rng: random.Random, faults: list[AppliedFault]
) -> dict[str, dict[str, Inode]]:
    """Each directory's names after the crash.

    Power-loss modes keep a prefix of each directory's pending steps; "dirent"
    always loses at least the last one; the others see the volatile view.
    """
    namespaces: dict[str, dict[str, Inode]] = {}
    for path in sorted(model.dirs):
        directory = model.dirs[path]
        steps = len(directory.pending)
        if mode in ("drop", "torn") and steps:
            keep = rng.randint(0, steps)
        elif mode == "dirent" and steps:
            keep = rng.randint(0, steps - 1)
        else:
            keep = steps
        names = dict(directory.durable)
        for step in directory.pending[:keep]:
            _apply_dir_op(names, step)
        if keep < steps:
            lost = sorted({name for step in directory.pending[keep:] for name, _ in step})
            faults.append(AppliedFault("dirent", path, detail=f"kept {keep}/{steps} steps; reverted {lost}"))
        namespaces[path] = names
    return namespaces


def _durable_model(
    model: Model, namespaces: dict[str, dict[str, Inode]], contents: dict[int, bytearray]
) -> Model:
    """A model in which every surviving name and byte is durable."""
    out = Model(stores={path: dict(values) for path, values in model.stores.items()})
    fresh: dict[int, Inode] = {}
    for path, names in namespaces.items():
        directory = out.dirs.setdefault(path, Directory())
        for name in sorted(names):
            old = names[name]
            if old.ino not in fresh:
                fresh[old.ino] = out.new_inode(bytes(contents[old.ino]))
            directory.durable[name] = directory.volatile[name] = fresh[old.ino]
    return out


def _replay(durable: bytes | bytearray, ops: list[Op]) -> bytearray:
    content = bytearray(durable)
    for op in ops:
        apply_op(content, op)
    return content


def _power_loss(
    path: str, inode: Inode, rng: random.Random, faults: list[AppliedFault], torn: int | None
) -> bytearray:
    """Durable bytes plus a legal subset of the pending operations (one of them torn if `torn`)."""
    ops = inode.pending
    strategy = rng.choice(("prefix", "prefix-but-one", "subset"))
    if strategy == "subset":
        kept = {n for n in range(len(ops)) if rng.random() < 0.5}
    else:
        kept = set(range(rng.randint(0, len(ops))))
        if strategy == "prefix-but-one" and kept:
            kept.discard(rng.choice(sorted(kept)))
    if torn is not None:
        kept.add(torn)
    content = bytearray(inode.durable)
    for n, op in enumerate(ops):
        if n == torn:
            _tear(path, op, content, rng, faults)
        elif n in kept:
            apply_op(content, op)
    if len(kept) < len(ops):
        faults.append(AppliedFault("drop", path, detail=f"{strategy}: kept ops {sorted(kept)} of {len(ops)}"))
    return content


def _tear(path: str, op: Op, content: bytearray, rng: random.Random, faults: list[AppliedFault]) -> None:
    """Apply a write sector by sector; at least one of its sectors gets zeros or garbage instead."""
    assert op.data is not None
    sector = rng.choice(SECTOR_SIZES)
    garbage = rng.random() < 0.5
    # Pieces of the write split at absolute sector boundaries.
    end = op.offset + len(op.data)
    starts = [op.offset, *range((op.offset // sector + 1) * sector, end, sector)]
    pieces = [(start, min((start // sector + 1) * sector, end)) for start in starts]
    lost = {n for n in range(len(pieces)) if rng.random() < 0.5} or {rng.randrange(len(pieces))}
    data = bytearray(op.data)
    for n in sorted(lost):
        start, stop = pieces[n]
        fill = rng.randbytes(stop - start) if garbage else bytes(stop - start)
        data[start - op.offset : stop - op.offset] = fill
    apply_op(content, Op(op.offset, bytes(data)))
    detail = f"{sector}-byte pieces {sorted(lost)} of {len(pieces)} -> {'garbage' if garbage else 'zeros'}"
    faults.append(AppliedFault("torn", path, op.offset, len(op.data), detail))


def _misdirect(path: str, inode: Inode, n: int, rng: random.Random, faults: list[AppliedFault]) -> bytearray:
    """Every pending operation reaches the disk, but write `n` lands a few sectors off."""
    op = inode.pending[n]
    assert op.data is not None
    # Either where another pending write (or the file's start) was meant to go, as a stale
    # block mapping would do, or off by whole sectors, as a block layer moving blocks would.
    others = sorted({0, *(o.offset for o in inode.pending if o.is_write)} - {op.offset})
    if others and rng.random() < 0.5:
        wrong = rng.choice(others)
    else:
        shift = rng.choice((-1, 1)) * rng.choice(SECTOR_SIZES) * rng.randint(1, 4)
        wrong = op.offset + shift if op.offset + shift >= 0 else op.offset - shift
    ops = [Op(wrong, op.data) if m == n else other for m, other in enumerate(inode.pending)]
    content = _replay(inode.durable, ops)
    # Durable bytes changed only where it landed inside what was fsynced.
    damaged_at = wrong if wrong < len(inode.durable) else -1
    faults.append(AppliedFault("misdirect", path, op.offset, len(op.data), f"landed at {wrong}", damaged_at))
    return content


def _lose_a_file(
    inodes: list[tuple[str, Inode]],
    namespaces: dict[str, dict[str, Inode]],
    contents: dict[int, bytearray],
    rng: random.Random,
    faults: list[AppliedFault],
) -> None:
    """Delete or empty one file whose bytes were all fsynced (and hold something)."""
    candidates = [(path, inode) for path, inode in inodes if inode.durable and not inode.pending]
    if not candidates:
        faults.append(AppliedFault("lost", "-", detail="no fsynced file to lose"))
        return
    path, inode = rng.choice(candidates)
    if rng.random() < 0.5:
        directory, _, name = path.rpartition("/")
        del namespaces[directory or ("/" if path.startswith("/") else ".")][name]
        faults.append(AppliedFault("lost", path, detail=f"deleted ({len(inode.durable)} bytes)"))
    else:
        contents[inode.ino] = bytearray()
        faults.append(AppliedFault("lost", path, detail=f"emptied ({len(inode.durable)} bytes)"))


def _bitflip(
    inodes: list[tuple[str, Inode]],
    contents: dict[int, bytearray],
    rng: random.Random,
    faults: list[AppliedFault],
) -> None:
    """Flip one bit in bytes that were durable (fsynced) and are still in the file."""
    candidates = [
        (path, inode) for path, inode in inodes if min(len(inode.durable), len(contents[inode.ino])) > 0
    ]
    if not candidates:
        faults.append(AppliedFault("bitflip", "-", detail="no durable bytes to flip"))
        return
    path, inode = rng.choice(candidates)
    content = contents[inode.ino]
    offset = rng.randrange(min(len(inode.durable), len(content)))
    bit = rng.randrange(8)
    content[offset] ^= 1 << bit
    faults.append(AppliedFault("bitflip", path, offset, 1, f"bit {bit}", offset))
