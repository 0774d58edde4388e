"""Ctrl-C anywhere in the command line (issue 34).

SIGINT sent to a long-running subcommand's process alone (not to its process group:
its children get nothing, so it must end them itself) ends it with exit status 130,
the one line "oncelog <command>: interrupted" on stderr and no traceback. Its child
processes are gone, its scratch directories removed (TMPDIR points into the test's
directory, which must be empty afterwards), and a root it had open reopens clean or
recovers as after a kill, and `oncelog recover` says which.

Each scenario starts the command, waits until it is provably in its long-running phase
(a progress line, a child process, a segment file it holds open) and interrupts it at
once, so each takes about a second (the wire benchmark a few, to reach its server).
Nothing here measures time: HANG_GUARD_S only bounds a hang, and CI shares its machine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from oncelog.segments.batch import encode_batch

HANG_GUARD_S = 120.0
# The command as a terminal starts it: the test run may have been started with SIGINT
# ignored (a background job), which its children inherit and the command line respects.
LAUNCH = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from oncelog.cli.main import main; sys.exit(main(sys.argv[1:]))"
)
VERIFY_PARTITIONS, VERIFY_BATCHES = 3, 300_000  # ~80 MB: seconds of checking, an instant to write
CRASHED_PARTITIONS = 200  # a second or more of recovery
SUMMARY = re.compile(r"recovered (\d+) partitions .*: (\d+) clean, (\d+) unclean")


# -- processes ---------------------------------------------------------------------------
def start_time(pid: int) -> str | None:
    """The start time of live process `pid` (None if gone or a zombie): with the pid, it
    names the process, not a later one given the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def descendants(pid: int) -> dict[int, str]:
    """Every live process below `pid`, with its start time (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found: dict[int, str] = {}
    below = list(parents.get(pid, []))
    while below:
        child = below.pop()
        started = start_time(child)
        if started is not None:
            found[child] = started
            below.extend(parents.get(child, []))
    return found


def holds_segment_open(pid: int, root: Path) -> bool:
    """Whether process `pid` has a segment file under `root` open (it is reading the logs)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith(f"{root}{os.sep}") and target.endswith(".log"):
            return True
    return False


@dataclass
class Command:
    """`oncelog ARGS` running, its output read as it comes."""

    args: list[str]
    env: dict[str, str]
    stdout: bool = True  # False: to /dev/null (dump's millions of lines)
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, *self.args],
            stdout=subprocess.PIPE if self.stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        self._pumps = [
            threading.Thread(target=self._pump, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
            if stream is not None
        ]
        for pump in self._pumps:
            pump.start()

    @staticmethod
    def _pump(stream: Iterator[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def said(self, pattern: str, lines: list[str] | None = None) -> bool:
        return any(re.search(pattern, line) for line in list(self.err if lines is None else lines))

    def output(self) -> str:
        return "\n".join(["stdout:", *self.out[-30:], "stderr:", *self.err[-30:]])

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while not ready():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.args[0]} exited {self.proc.returncode} before {what}\n{self.output()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"{self.args[0]}: no sign of {what}\n{self.output()}")
            time.sleep(0.005)

    def interrupt(self) -> Interrupted:
        """SIGINT to this process alone; what it said on stderr from then on, and its children."""
        children = descendants(self.proc.pid)
        mark = len(self.err)
        os.kill(self.proc.pid, signal.SIGINT)
        try:
            status = self.proc.wait(HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"{self.args[0]} did not exit on SIGINT\n{self.output()}")
        for pump in self._pumps:
            pump.join(HANG_GUARD_S)  # (a child still holding stderr open: checked below)
        return Interrupted(status, self.err[mark:], children)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Interrupted:
    status: int
    err_after: list[str]
    children: dict[int, str]


def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, timeout=HANG_GUARD_S
    )


# -- roots -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def batches_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Partition directories of many one-record batches (as a Kafka log.dir holds them):
    written at once, seconds to check record by record."""
    root = tmp_path_factory.mktemp("batches")
    one = bytearray(encode_batch([(b"k", b"v" * 20)], timestamp_ms=1_700_000_000_000))
    segment = bytearray(one * VERIFY_BATCHES)
    for n in range(VERIFY_BATCHES):
        struct.pack_into(">q", segment, n * len(one), n)  # the base offset: outside the CRC
    for partition in range(VERIFY_PARTITIONS):
        (root / f"t-{partition}").mkdir()
        (root / f"t-{partition}" / "00000000000000000000.log").write_bytes(segment)
    return root


@pytest.fixture(scope="module")
def crashed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LogManager root of CRASHED_PARTITIONS partitions as a kill -9 leaves it: every
    partition recovers when it opens. One is written by a process that exits without
    closing anything; the others are copies of it."""
    root = tmp_path_factory.mktemp("crashed") / "root"
    write_and_die = (
        "import os, sys; from oncelog.log_manager import LogManager; "
        "from oncelog.segments.batch import encode_batch; "
        "manager = LogManager.open(sys.argv[1], progress=False); "
        "manager.log('t', 0).append_batches([encode_batch([(b'k', b'v')])] * 20); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", write_and_die, str(root)], check=True, timeout=HANG_GUARD_S)
    for partition in range(1, CRASHED_PARTITIONS):
        shutil.copytree(root / "t-0", root / f"t-{partition}")
    return root


def copy_root(crashed: Path, to: Path, partitions: int = CRASHED_PARTITIONS) -> Path:
    """A copy of the crashed root with its first `partitions` partitions (commands write to it)."""
    kept = {f"t-{partition}" for partition in range(partitions)}
    shutil.copytree(
        crashed, to, ignore=lambda _, names: [n for n in names if n.startswith("t-") and n not in kept]
    )
    return to


def reopen_says(root: Path, partitions: int) -> tuple[int, int]:
    """(clean, unclean) partitions by `oncelog recover`'s summary, which says which."""
    result = oncelog("recover", "--no-progress", str(root))
    assert result.returncode == 0, result.stderr
    summary = SUMMARY.search(result.stdout)
    assert summary is not None, result.stdout
    total, clean, unclean = (int(n) for n in summary.groups())
    assert total == clean + unclean == partitions, result.stdout
    return clean, unclean


# -- the scenarios -----------------------------------------------------------------------
@dataclass
class Case:
    """One scenario's command, where its long-running phase shows, and what it left."""

    name: str
    args: list[str]
    ready: Callable[[Command], bool] = lambda command: True
    progress: str | None = None  # stderr lines it prints while running (before the signal lands)
    env: dict[str, str] = field(default_factory=dict)
    stdout: bool = True
    after: Callable[[Command], None] = lambda command: None


def with_child(command: Command) -> bool:
    return bool(descendants(command.proc.pid))


def scenario(name: str, tmp_path: Path, batches: Path, crashed: Path) -> Case:
    """The Case `name`, with its roots in `tmp_path`."""
    if name == "bench":
        return Case(
            name,
            ["bench", "--quick"],
            ready=lambda c: c.said(r"\[1/\d+\]"),
            progress=r"^bench: ",
            env={"ONCELOG_BENCH_SCALE": "0.001"},
        )
    if name == "bench-wire":
        return Case(
            name,
            ["bench", "--quick", "--wire"],
            ready=lambda c: c.said(r"oncelog serve \(pid \d+\)") and with_child(c),
            progress=r"^bench: ",
            env={"ONCELOG_BENCH_SCALE": "0.001"},
        )
    if name in ("verify", "stat", "dump"):
        target = batches / "t-0" if name == "dump" else batches
        return Case(
            name,
            [name, str(target)] + (["--no-progress"] if name == "verify" else []),
            ready=lambda c: holds_segment_open(c.proc.pid, batches),
            stdout=name != "dump",
        )
    if name in ("recover", "serve-recovering"):
        root = copy_root(crashed, tmp_path / "root")
        if name == "serve-recovering":  # (a SIGINT before its event loop runs)
            args = ["serve", str(root), "--listen", "127.0.0.1:0", "--no-progress"]
            return Case(name, args, ready=lambda c: holds_segment_open(c.proc.pid, root))

        def says_which(command: Command) -> None:
            # The partitions loaded when the signal came were closed cleanly; the rest recover.
            reopen_says(root, CRASHED_PARTITIONS)

        args = ["recover", "--no-progress", str(root)]
        return Case(name, args, ready=lambda c: holds_segment_open(c.proc.pid, root), after=says_which)
    if name == "serve":
        root = copy_root(crashed, tmp_path / "root", partitions=3)

        def drained(command: Command) -> None:
            assert command.said("every log closed cleanly", command.out), command.output()
            assert reopen_says(root, 3) == (3, 0)

        return Case(
            name,
            ["serve", str(root), "--listen", "127.0.0.1:0", "--no-progress"],
            ready=lambda c: c.said("listening on", c.out),
            after=drained,
        )
    if name == "torture":
        return Case(
            name,
            ["torture", "--crashes", "300"],
            ready=lambda c: c.said(r"^torture: \d+/"),
            progress="^torture: ",
        )
    if name == "torture-process":
        return Case(
            name, ["torture", "--mode", "process", "--crashes", "30"], ready=with_child, progress="^torture: "
        )
    assert name == "demo"
    return Case(
        name,
        ["demo", "--data-dir", str(tmp_path / "demo")],
        ready=lambda c: c.said(r"^2\. A child process", c.out) and with_child(c),
    )


needs_kafka = pytest.mark.skipif(
    importlib.util.find_spec("confluent_kafka") is None, reason="bench --wire needs confluent-kafka"
)
SCENARIOS = [
    "bench",
    pytest.param("bench-wire", marks=needs_kafka),
    "verify",
    "dump",
    "stat",
    "recover",
    "serve-recovering",
    "serve",
    "torture",
    "torture-process",
    "demo",
]


@pytest.mark.parametrize("name", SCENARIOS)
def test_sigint_ends_the_command_with_130_one_line_and_nothing_left_behind(
    name: str, tmp_path: Path, batches_root: Path, crashed_root: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    case = scenario(name, tmp_path, batches_root, crashed_root)
    command = Command(case.args, {"TMPDIR": str(scratch), **case.env}, stdout=case.stdout)
    try:
        command.wait_for(lambda: case.ready(command), "its long-running phase")
        interrupted = command.interrupt()
    finally:
        command.kill()
    assert interrupted.status == 130, command.output()
    assert not command.said("Traceback"), command.output()
    said = [
        line for line in interrupted.err_after if case.progress is None or not re.search(case.progress, line)
    ]
    assert said == [f"oncelog {case.args[0]}: interrupted"], command.output()
    deadline = time.monotonic() + HANG_GUARD_S
    left = interrupted.children
    while left and time.monotonic() < deadline:  # (an orphan's end may still be on its way)
        left = {pid: start for pid, start in left.items() if start_time(pid) == start}
        time.sleep(0.01)
    assert not left, f"child processes left running: {sorted(left)}"
    assert not any(scratch.iterdir()), sorted(scratch.iterdir())
    case.after(command)


def test_a_second_sigint_during_a_cleanup_that_hangs_exits_130_at_once(tmp_path: Path) -> None:
    """The first SIGINT starts the cleanup (every `finally`); the second, while that hangs,
    ends the process with one more line: the cleanup here waits forever, so exiting at all
    is the proof."""
    hangs = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from oncelog.cli.interrupts import first_sigint_raises\n"
        "with first_sigint_raises('oncelog'):\n"
        "    try:\n"
        "        print('working', flush=True)\n"
        "        signal.pause()\n"
        "    finally:\n"
        "        print('cleaning up', flush=True)\n"
        "        while True:\n"
        "            signal.pause()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", hangs], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "working\n"
        os.kill(proc.pid, signal.SIGINT)
        assert proc.stdout.readline() == "cleaning up\n"
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert err == "oncelog: interrupted again: exiting without cleaning up\n"


def test_serve_started_with_sigint_ignored_ignores_it(tmp_path: Path, crashed_root: Path) -> None:
    """A background job inherits SIGINT ignored: serve then stops on SIGTERM alone. The
    SIGINT goes first; had serve taken it, it would have exited 130, not 0."""
    root = copy_root(crashed_root, tmp_path / "root", partitions=1)
    ignoring = LAUNCH.replace("signal.default_int_handler", "signal.SIG_IGN")
    proc = subprocess.Popen(
        [sys.executable, "-c", ignoring, "serve", str(root), "--listen", "127.0.0.1:0", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        assert any("listening on" in line for line in iter(proc.stdout.readline, ""))
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "every log closed cleanly" in out
    assert err == ""
