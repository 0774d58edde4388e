"""The package a newcomer installs (issue 34): the wheel `python -m build` makes, installed into a
fresh virtual environment and run from outside the source tree.

One wheel is built for the module, by this interpreter's `build` (the dev extra brings it), and
installed into one new venv: first without extras (the demo skips its Kafka steps, names the
extra once and exits 0), then with the kafka extra (every step runs; a confluent-kafka record
goes through `oncelog serve` and verifies). pip fetches the dependencies from the package index,
so this module needs the network (pip's cache makes a rerun fast); without it, or without
`build`, it fails saying so: it never skips.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
KAFKA_HINT = "pip install 'oncelog[kafka]'"
SKIP_LINE = (
    "Skipped (not failed) steps 6 and 7, real Kafka clients through `oncelog serve`: "
    f"they need confluent-kafka: {KAFKA_HINT}"
)
BUILD_TIMEOUT_S = 600
PIP_TIMEOUT_S = 900
DEMO_TIMEOUT_S = 600
# What the build may add to `git status --porcelain --ignored`: build/ is ignored, and a fresh
# clone has none until the first build (the egg-info goes there: pyproject.toml, tool.distutils).
BUILD_OUTPUT = {"!! build/"}


def _run(command: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Its output (stdout and stderr); a test failure quoting the end of it if it exits non-zero."""
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not finish in {timeout:g} s:\n{exc.output or ''}")
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-60:])
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{tail}")
    return done.stdout


def _source_tree_state() -> tuple[set[str], dict[str, int]]:
    """`git status --porcelain --ignored`, and the files of any egg-info at the top of the tree."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    egg_info = {str(path): path.stat().st_mtime_ns for path in ROOT.glob("*.egg-info/*")}
    return set(status.splitlines()), egg_info


@dataclass(frozen=True)
class Built:
    wheel: Path
    before: tuple[set[str], dict[str, int]]
    after: tuple[set[str], dict[str, int]]


@dataclass(frozen=True)
class Venv:
    """A virtual environment of its own, used the way a newcomer would: from a folder that is
    not the source tree, with nothing of the environment pointing at it."""

    root: Path
    workdir: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return {**env, "PATH": f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"}

    def run(self, *command: str, timeout: float = DEMO_TIMEOUT_S) -> str:
        return _run(list(command), cwd=self.workdir, timeout=timeout, env=self.env)

    def pip_install(self, requirement: str) -> None:
        try:
            pip = [self.bin("python"), "-m", "pip", "install", "--no-compile"]
            self.run(*pip, requirement, timeout=PIP_TIMEOUT_S)
        except pytest.fail.Exception as exc:
            pytest.fail(f"pip could not install {requirement} (is the package index reachable?): {exc}")


@dataclass(frozen=True)
class PlainDemo:
    confluent_kafka: str  # what the venv without extras says of `import confluent_kafka`
    output: str


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel, built once from the source tree with `python -m build --wheel`."""
    if importlib.util.find_spec("build") is None:
        pytest.fail(f"`build` is not installed in {sys.prefix}: the dev extra brings it (`make` installs it)")
    outdir = tmp_path_factory.mktemp("dist")
    before = _source_tree_state()
    try:
        output = _run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(ROOT)],
            cwd=outdir,
            timeout=BUILD_TIMEOUT_S,
        )
    except pytest.fail.Exception as exc:
        pytest.fail(f"the wheel did not build (it fetches setuptools: can pip reach the index?): {exc}")
    after = _source_tree_state()
    wheels = sorted(outdir.glob("oncelog-*.whl"))
    assert len(wheels) == 1, output
    return Built(wheels[0], before, after)


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv holding the wheel without extras."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(root)], cwd=root, timeout=120)
    fresh = Venv(root, tmp_path_factory.mktemp("workdir"))
    fresh.pip_install(str(built.wheel))
    return fresh


@pytest.fixture(scope="module")
def plain_demo(venv: Venv) -> PlainDemo:
    """`oncelog demo` in the venv without extras (before the kafka extra joins it)."""
    probe = "import importlib.util as u; print(u.find_spec('confluent_kafka') is not None)"
    present = venv.run(venv.bin("python"), "-c", probe).strip()
    output = venv.run(venv.bin("oncelog"), "demo", "--data-dir", str(venv.workdir / "plain-demo"))
    return PlainDemo(present, output)


@pytest.fixture(scope="module")
def kafka_venv(venv: Venv, plain_demo: PlainDemo, built: Built) -> Venv:
    """The same venv once `pip install 'oncelog[kafka]'` (from the wheel) has run in it."""
    venv.pip_install(f"{built.wheel}[kafka]")
    return venv


def test_building_the_wheel_leaves_the_source_tree_as_it_was(built: Built) -> None:
    (status_before, egg_before), (status_after, egg_after) = built.before, built.after
    assert sorted(status_after - status_before - BUILD_OUTPUT) == []
    assert sorted(status_before - status_after) == []
    assert egg_after == egg_before, "the build wrote an egg-info at the top of the source tree"


def test_the_installed_package_is_the_wheels_not_the_source_tree(venv: Venv) -> None:
    shown = venv.run(
        venv.bin("python"),
        "-c",
        "import importlib.metadata as m, oncelog; "
        "print(oncelog.__file__); print(m.metadata('oncelog')['License-Expression'])",
    ).splitlines()
    where, license_expression = Path(shown[0]).resolve(), shown[1]
    assert where.is_relative_to(venv.root.resolve()), where
    assert not where.is_relative_to(ROOT), where
    assert license_expression == "Apache-2.0"


def test_without_extras_the_demo_runs_to_the_end_names_the_kafka_extra_once_and_exits_0(
    plain_demo: PlainDemo,
) -> None:
    assert plain_demo.confluent_kafka == "False", "oncelog without extras brought confluent-kafka"
    text = plain_demo.output
    assert "every acknowledged batch is at its offset: True" in text and "FAILED" not in text
    assert [line for line in text.splitlines() if "oncelog[" in line] == [SKIP_LINE]
    assert text.count("Skipped") == 1 and text.rstrip("\n").endswith(SKIP_LINE)


def test_with_the_kafka_extra_the_demo_runs_every_step(kafka_venv: Venv) -> None:
    text = kafka_venv.run(kafka_venv.bin("oncelog"), "demo", "--data-dir", str(kafka_venv.workdir / "demo"))
    assert "Skipped" not in text and "oncelog[" not in text and "FAILED" not in text
    assert "consumer (assign, from offset 0): 20000 records; duplicates 0, lost 0" in text
    assert "7. The three fences, with real clients" in text


PRODUCE = """\
import sys
from confluent_kafka import Producer

reports = []
producer = Producer({"bootstrap.servers": sys.argv[1], "enable.idempotence": True, "acks": "all"})
producer.produce("newcomer", key=b"key", value=b"hello from the wheel",
                 on_delivery=lambda err, msg: reports.append((err, msg.offset())))
left = producer.flush(60)
print(left, reports)
sys.exit(0 if left == 0 and reports == [(None, 0)] else 1)
"""


def test_a_record_a_kafka_client_sends_to_the_installed_server_verifies_after_sigterm(
    kafka_venv: Venv, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    server = subprocess.Popen(
        [kafka_venv.bin("oncelog"), "serve", str(root), "--listen", "127.0.0.1:0", "--no-progress"],
        cwd=kafka_venv.workdir,
        env={**kafka_venv.env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        bootstrap, output = _listening_address(server)
        script = tmp_path / "produce.py"
        script.write_text(PRODUCE)
        kafka_venv.run(kafka_venv.bin("python"), str(script), bootstrap, timeout=120)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, "\n".join(output)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert "no problems" in kafka_venv.run(kafka_venv.bin("oncelog"), "verify", str(root))
    dump = kafka_venv.run(kafka_venv.bin("oncelog"), "dump", "--records", str(root / "newcomer-0"))
    assert re.search(r"\| offset: 0 .* key: key payload: hello from the wheel$", dump, re.M), dump


def _listening_address(server: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """HOST:PORT from the server's 'listening on' line; the lines it printed, still growing."""
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        found = re.search(r"listening on PLAINTEXT://(127\.0\.0\.1:\d+)", line)
        if found:
            return found.group(1), output
    pytest.fail("oncelog serve did not say where it listens:\n" + "\n".join(output))
