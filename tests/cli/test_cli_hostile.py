"""Every `oncelog` command against hostile input: no traceback, one line naming the file, exit 2.

The rule for the whole command line (issue 15): bad input or damaged files never
print a traceback. The command says what is wrong in a line naming the file and
exits 2; `verify` exits 1 for the damage it is there to find, and `recover` exits 1
for a partition that failed to recover (each is its documented way of reporting
corruption). A few pairs are legitimately fine (exit 0), each with its reason below.

Every command takes a path: dump (PATH, --snapshot FILE), verify, stat, recover
(ROOT), demo (--data-dir), torture (--data-dir, process mode), bench (--dir) and serve
(ROOT, which must be missing, empty or a root: a partition directory is refused).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from oncelog import LogManager, encode_batch
from oncelog.cli.main import build_parser, main
from oncelog.log import METADATA_DIR, Log

T0 = 1_700_000_000_000
SEGMENT = "00000000000000000000.log"
INDEX = "00000000000000000000.index"
SNAPSHOT = "00000000000000000003.snapshot"


class Hostile(NamedTuple):
    path: Path  # the directory (or file) a command is given
    culprit: Path  # what the error must name
    file: Path | None = None  # what `dump` is given, where that is a file inside `path`


def _garbage(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _partition(path: Path) -> Path:
    """A partition directory with three batches, closed cleanly (a snapshot at its end)."""
    with Log.open(path, clock=lambda: T0) as log:
        for n in range(3):
            log.append(encode_batch([(b"k", b"v%d" % n)], timestamp_ms=T0))
    return path


def missing(base: Path) -> Hostile:
    return Hostile(base / "missing", base / "missing")


def file_for_directory(base: Path) -> Hostile:
    (base / "notes.txt").write_text("not a log directory\n")
    return Hostile(base / "notes.txt", base / "notes.txt")


def empty_file(base: Path) -> Hostile:
    (base / "empty").touch()
    return Hostile(base / "empty", base / "empty")


def directory_for_file(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    (partition / INDEX).unlink()
    (partition / INDEX).mkdir()
    return Hostile(partition, partition / INDEX, partition / INDEX)


def garbage_segment(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    segment = partition / SEGMENT
    segment.write_bytes(_garbage(segment.stat().st_size, 1))
    return Hostile(partition, segment, segment)


def garbage_index(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    (partition / INDEX).write_bytes(struct.pack(">iiii", 9, 900, 1, 100))  # entries out of order
    return Hostile(partition, partition / INDEX, partition / INDEX)


def garbage_snapshot(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    (partition / SNAPSHOT).write_bytes(_garbage(300, 2))
    return Hostile(partition, partition / SNAPSHOT, partition / SNAPSHOT)


def garbage_meta(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    (partition / METADATA_DIR / "data.mdb").write_bytes(_garbage(8192, 3))
    return Hostile(partition, partition / METADATA_DIR, partition / METADATA_DIR)


def meta_that_is_a_file(base: Path) -> Hostile:
    partition = _partition(base / "orders-0")
    shutil.rmtree(partition / METADATA_DIR)
    (partition / METADATA_DIR).write_bytes(b"x")
    return Hostile(partition, partition / METADATA_DIR, partition / METADATA_DIR)


def directory_named_like_a_segment(base: Path) -> Hostile:
    partition = base / "orders-0"
    (partition / SEGMENT).mkdir(parents=True)
    return Hostile(partition, partition / SEGMENT, partition / SEGMENT)


def unreadable_segment(base: Path) -> Hostile:
    # chmod 000 does not stop root (the tests run as root): a link to itself cannot be
    # opened by anyone, yet is listed like any segment.
    partition = base / "orders-0"
    partition.mkdir()
    os.symlink(SEGMENT, partition / SEGMENT)
    return Hostile(partition, partition / SEGMENT, partition / SEGMENT)


def fifo_named_like_a_segment(base: Path) -> Hostile:
    # Opening a FIFO blocks until a writer comes: a tool that opened it would hang.
    partition = base / "orders-0"
    partition.mkdir()
    os.mkfifo(partition / SEGMENT)
    return Hostile(partition, partition / SEGMENT, partition / SEGMENT)


def non_utf8_name(base: Path) -> Hostile:
    # A name that is not UTF-8 reaches Python as surrogate escapes; printed, it must not crash.
    partition = _partition(base / "made-0")
    named = base / os.fsdecode(b"bad\xff-0")
    partition.rename(named)
    segment = named / SEGMENT
    segment.write_bytes(_garbage(segment.stat().st_size, 4))
    return Hostile(named, segment, segment)


HOSTILE: dict[str, Callable[[Path], Hostile]] = {
    f.__name__: f
    for f in (
        missing,
        file_for_directory,
        empty_file,
        directory_for_file,
        garbage_segment,
        garbage_index,
        garbage_snapshot,
        garbage_meta,
        meta_that_is_a_file,
        directory_named_like_a_segment,
        unreadable_segment,
        fifo_named_like_a_segment,
        non_utf8_name,
    )
}
DIRECTORIES = [name for name in HOSTILE if name not in ("missing", "file_for_directory", "empty_file")]


def _dump(h: Hostile) -> list[str]:
    return ["dump", str(h.file or h.path)]


def _dump_snapshot(h: Hostile) -> list[str]:
    return ["dump", "--snapshot", str(h.file or h.path)]


def _dump_everything(h: Hostile) -> list[str]:
    return ["dump", "--records", "--producers", "--indexes", str(h.path)]


COMMANDS: dict[str, Callable[[Hostile], list[str]]] = {
    "dump": _dump,
    "dump --snapshot": _dump_snapshot,
    "dump --producers --indexes": _dump_everything,
    "verify": lambda h: ["verify", "--no-progress", str(h.path)],
    "stat": lambda h: ["stat", str(h.path)],
    "recover": lambda h: ["recover", "--no-progress", str(h.path)],
    "demo": lambda h: ["demo", "--data-dir", str(h.path)],
    "torture": lambda h: ["torture", "--mode", "process", "--crashes", "1", "--data-dir", str(h.path)],
    "bench": lambda h: ["bench", "--quick", "--dir", str(h.path)],
    "serve": lambda h: ["serve", "--no-progress", "--listen", "127.0.0.1:0", str(h.path)],
    "users": lambda h: ["users", str(h.path), "list"],
    "acls": lambda h: ["acls", str(h.path), "list"],
}

# (command, input) pairs that are not bad input for that command, and why.
CREATES = "a missing --data-dir is where it creates its data (it would run for real)"
SCRATCH = "bench measures in a temporary subdirectory of any directory; it reads nothing there"
LEGITIMATE: dict[tuple[str, str], str] = {
    ("demo", "missing"): CREATES,
    ("torture", "missing"): CREATES,
    ("serve", "missing"): "a missing ROOT is created and served (it would serve until SIGTERM)",
    **{("bench", name): SCRATCH for name in DIRECTORIES},
}
# Exit codes other than 2 that a command gives by design, and why.
EXPECTED: dict[tuple[str, str], set[int]] = {
    # verify reports the damage it finds, one line each naming the file, and exits 1.
    **{("verify", name): {1} for name in DIRECTORIES},
    # recover repairs these by design (an index is rebuilt, a corrupt snapshot set aside).
    ("recover", "garbage_index"): {0},
    ("recover", "garbage_snapshot"): {0},
    # Corruption below the recovery point fails that partition: exit 1, naming file and position.
    ("recover", "garbage_segment"): {1},
    ("recover", "non_utf8_name"): {1},
    # stat prints what it can read and notes damage inside files (verify judges it); it exits 2
    # only for files it cannot read at all. It does not read indexes.
    ("stat", "garbage_segment"): {0},
    ("stat", "non_utf8_name"): {0},
    ("stat", "garbage_snapshot"): {0},
    ("stat", "garbage_index"): {0},
    ("stat", "directory_for_file"): {0},
    # dump of a whole directory dumps segments (and with --indexes and --producers, those):
    # it never reads the metadata store.
    ("dump --producers --indexes", "garbage_meta"): {0},
    ("dump --producers --indexes", "meta_that_is_a_file"): {0},
}


def _run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


# Commands that take no path but a server's address: their hostile input is the server
# (unreachable, or refusing), in test_cli_topics_and_groups.
SERVER_COMMANDS = {"topics", "groups"}


def test_the_hostile_inputs_cover_every_subcommand() -> None:
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subparsers.choices) == {command.split()[0] for command in COMMANDS} | SERVER_COMMANDS


def test_the_exceptions_name_real_commands_and_inputs() -> None:
    for command, hostile in [*LEGITIMATE, *EXPECTED]:
        assert command in COMMANDS and hostile in HOSTILE, (command, hostile)


# Every command with every input, except the pairs in LEGITIMATE (not bad input there).
PAIRS = [(c, h) for c in COMMANDS for h in HOSTILE if (c, h) not in LEGITIMATE]


@pytest.mark.parametrize(("command", "hostile"), PAIRS, ids=[f"{c}-{h}" for c, h in PAIRS])
def test_no_command_prints_a_traceback_for_hostile_input(tmp_path: Path, command: str, hostile: str) -> None:
    h = HOSTILE[hostile](tmp_path)
    argv = COMMANDS[command](h)
    status, out, err = _run_in_process(argv)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert status in EXPECTED.get((command, hostile), {2}), (status, err)
    if status != 0:
        # One line that names the file (the culprit, or the path given, which it is in).
        named = [line for line in err.splitlines() if str(h.culprit) in line or str(h.path) in line]
        assert named or str(h.culprit) in out, err
    if status == 2 and command not in ("verify", "recover"):
        assert err.strip(), "an exit 2 says why on stderr"


def test_stat_of_a_directory_named_like_a_segment_names_it_instead_of_a_traceback(tmp_path: Path) -> None:
    h = directory_named_like_a_segment(tmp_path)
    status, _, err = _run_in_process(["stat", str(h.path)])
    assert status == 2
    assert f"cannot read {h.culprit}: Is a directory" in err


def test_recover_refuses_a_directory_that_is_neither_a_root_nor_a_partition(tmp_path: Path) -> None:
    (tmp_path / "typo").mkdir()
    (tmp_path / "typo" / "README").write_text("hello")
    status, _, err = _run_in_process(["recover", "--no-progress", str(tmp_path / "typo")])
    assert status == 2
    assert err.count("\n") == 1 and str(tmp_path / "typo") in err and "--create" in err
    assert sorted(os.listdir(tmp_path / "typo")) == ["README"]  # nothing was made a root
    status, out, err = _run_in_process(["recover", "--no-progress", "--create", str(tmp_path / "typo")])
    assert status == 0, err
    assert "recovered 0 partitions" in out
    assert "meta.lmdb" in os.listdir(tmp_path / "typo")  # a root now


def test_recover_help_documents_create_and_recreate_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recover", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--create" in text and "--recreate-metadata" in text


def test_recover_of_a_root_that_lost_its_store_refuses_then_recreates_when_told(tmp_path: Path) -> None:
    with LogManager.open(tmp_path, progress=False) as manager:
        manager.log("orders", 0).append(encode_batch([(b"k", b"v")]))
    shutil.rmtree(tmp_path / "meta.lmdb")
    status, _, err = _run_in_process(["recover", "--no-progress", str(tmp_path)])
    assert status == 2
    assert str(tmp_path / "meta.lmdb") in err and "--recreate-metadata" in err
    status, out, err = _run_in_process(["recover", "--no-progress", "--recreate-metadata", str(tmp_path)])
    assert status == 0, err
    assert "recovered 1 partitions" in out


def test_recover_summary_shows_a_partition_that_lost_its_store(tmp_path: Path) -> None:
    _partition(tmp_path / "orders-0")
    shutil.rmtree(tmp_path / "orders-0" / METADATA_DIR)
    status, out, err = _run_in_process(["recover", "--no-progress", str(tmp_path / "orders-0")])
    assert status == 0, err
    assert "1 partitions had segments but no metadata store" in out
    assert "orders-0: no metadata store" in out
    status, out, _ = _run_in_process(["recover", "--no-progress", "--json", str(tmp_path / "orders-0")])
    assert '"metadata_missing": false' in out  # recovered once, the store is back


def test_demo_refuses_to_delete_a_directory_it_did_not_make(tmp_path: Path) -> None:
    partition = _partition(tmp_path / "precious-0")
    status, _, err = _run_in_process(["demo", "--data-dir", str(tmp_path)])
    assert status == 2 and str(tmp_path) in err and "precious-0" in err
    assert (partition / SEGMENT).exists()


def test_bench_refuses_an_output_it_cannot_write_before_measuring(tmp_path: Path) -> None:
    for option, target in (("--json", tmp_path), ("--plot", tmp_path / "no" / "such" / "bench.png")):
        status, _, err = _run_in_process(["bench", "--quick", option, str(target)])
        assert status == 2 and str(target) in err and "bench: " in err


# -- a real process: the console script, with real stdout and stderr -------------------------


def _oncelog(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "oncelog"
    env = {**os.environ, "PYTHONIOENCODING": ""}  # the default encoding: utf-8, strict on stdout
    return subprocess.run([str(script), *argv], capture_output=True, timeout=120, env=env, check=False)


@pytest.mark.parametrize(
    ("command", "hostile"),
    [
        ("stat", directory_named_like_a_segment),
        ("recover", garbage_meta),
        ("recover", meta_that_is_a_file),
        ("dump", non_utf8_name),
        ("verify", non_utf8_name),
    ],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_the_console_script_prints_one_line_and_no_traceback(
    tmp_path: Path, command: str, hostile: Callable[[Path], Hostile]
) -> None:
    h = hostile(tmp_path)
    argv = COMMANDS[command](h)
    done = _oncelog(*(os.fsencode(arg) for arg in argv))
    assert b"Traceback" not in done.stderr and b"Traceback" not in done.stdout, done.stderr
    assert done.returncode == (1 if command == "verify" else 2), done.stderr
    # The file is named with its own bytes, whatever they are.
    assert os.fsencode(h.culprit) in done.stderr + done.stdout or os.fsencode(h.path) in done.stderr
