"""`--help` loads nothing heavy, and every number, example and hint in it is the code's.

The import list is held, not a time: `python -X importtime` names every module a
`--help` loads, and only argparse's stdlib, the parsers and the bench's sizes may be
among them. Values the help quotes from code it does not import (a default, a limit,
the planted-bug count) are repeated in oncelog.cli.parsers; each is checked here
against the code. Every example line of every help text is parsed by the real parser.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.cli.main import build_parser
from oncelog.cli.parsers import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
SUBCOMMAND_NAMES = [module.__name__.rsplit(".", 1)[1] for module in SUBCOMMANDS]
# What a --help may load of oncelog: the command line's skeleton, the parsers, and the
# bench's sizes (its help quotes them).
ALLOWED_ONCELOG = {
    "oncelog",
    "oncelog.cli",
    "oncelog.cli.main",
    "oncelog.cli.exits",
    "oncelog.cli.interrupts",
    "oncelog.cli.parsers",
    "oncelog.bench",
    "oncelog.bench.settings",
}
HEAVY = {"numpy", "lmdb", "kio", "kafka", "rich", "confluent_kafka", "pyspark", "crc32c", "msgpack", "scramp"}


def _importtime(*argv: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and not line.rstrip().endswith("| package")
    }
    return modules, done.stdout


def _imported_by_help(argv: list[str]) -> tuple[set[str], str]:
    """What `oncelog ARGV --help` imports beyond the interpreter's own start-up (site, .pth hooks)."""
    start_up, _ = _importtime("-c", "pass")
    modules, text = _importtime("-m", "oncelog.cli", *argv, "--help")
    return modules - start_up, text


@pytest.mark.parametrize(
    "argv", [[], *[[name] for name in SUBCOMMAND_NAMES]], ids=["oncelog", *SUBCOMMAND_NAMES]
)
def test_help_imports_only_the_parsers_and_the_standard_library(argv: list[str]) -> None:
    modules, text = _imported_by_help(argv)
    assert text.startswith("usage: oncelog")
    ours = {name for name in modules if name == "oncelog" or name.startswith("oncelog.")}
    assert ours - ALLOWED_ONCELOG == {name for name in ours if name.startswith("oncelog.cli.parsers.")}
    # (importtime lists failed probes too: the standard library's copy module tries Jython's `org`.)
    others = {name.split(".")[0] for name in modules} - {"oncelog"}
    others = {name for name in others if importlib.util.find_spec(name) is not None}
    assert not others & HEAVY
    assert others <= set(sys.stdlib_module_names), sorted(others - set(sys.stdlib_module_names))


# -- values repeated in the parsers, against the code ---------------------------------------


def _twins() -> Iterator[tuple[str, object, object]]:
    from oncelog import log_manager
    from oncelog.cli import acls
    from oncelog.cli.parsers import acls as acls_args
    from oncelog.cli.parsers import recover as recover_args
    from oncelog.cli.parsers import serve as serve_args
    from oncelog.cli.parsers import torture as torture_args
    from oncelog.cli.parsers import users as users_args
    from oncelog.server import credentials
    from oncelog.server.acls import CLUSTER_NAME
    from oncelog.server.broker import MAX_PARTITIONS_PER_TOPIC, ServeConfig
    from oncelog.server.group_state import GroupLimits
    from oncelog.torture.model import FAULTS
    from oncelog.torture.selftest import PLANTED

    yield "acls operations", acls_args.OPERATION_NAMES, tuple(sorted(acls.OPERATIONS))
    yield "acls patterns", acls_args.PATTERN_NAMES, tuple(sorted(acls.PATTERNS))
    yield "acls filter patterns", acls_args.FILTER_PATTERN_NAMES, tuple(sorted(acls.FILTER_PATTERNS))
    yield "acls cluster name", acls_args.CLUSTER_NAME, CLUSTER_NAME
    yield "recover threads", recover_args.MAX_RECOVERY_THREADS, log_manager.MAX_RECOVERY_THREADS
    yield "recover lock timeout", recover_args.PARTITION_LOCK_TIMEOUT_S, log_manager.PARTITION_LOCK_TIMEOUT_S
    yield "serve partitions", serve_args.MAX_PARTITIONS_PER_TOPIC, MAX_PARTITIONS_PER_TOPIC
    yield "serve mechanisms", serve_args.SASL_MECHANISMS, tuple(credentials.SASL_MECHANISMS)
    yield "serve SCRAM mechanisms", serve_args.SCRAM_MECHANISMS, tuple(credentials.SCRAM_MECHANISMS)
    serve_defaults = ServeConfig()
    for name, value in serve_args.SERVE_DEFAULTS.items():
        yield f"serve {name}", value, getattr(serve_defaults, name)
    group_defaults = GroupLimits()
    for name, value in serve_args.GROUP_DEFAULTS.items():
        yield f"serve group {name}", value, getattr(group_defaults, name)
    yield "torture fault classes", torture_args.FAULT_CLASSES, tuple(FAULTS)
    yield "torture planted bugs", torture_args.PLANTED_BUGS, len(PLANTED)
    yield "users mechanisms", users_args.SCRAM_MECHANISMS, tuple(credentials.SCRAM_MECHANISMS)
    yield "users default iterations", users_args.DEFAULT_ITERATIONS, credentials.DEFAULT_ITERATIONS
    yield "users min iterations", users_args.MIN_ITERATIONS, credentials.MIN_ITERATIONS
    yield "users max iterations", users_args.MAX_ITERATIONS, credentials.MAX_ITERATIONS


def test_every_value_the_parsers_repeat_is_the_codes() -> None:
    wrong = [(what, shown, real) for what, shown, real in _twins() if shown != real]
    assert wrong == []


def test_serve_defaults_parsed_from_no_options_are_the_servers_defaults(tmp_path: Path) -> None:
    from oncelog.cli.serve import serve_config
    from oncelog.server.broker import ServeConfig

    config = serve_config(build_parser().parse_args(["serve", str(tmp_path)]))
    defaults = ServeConfig()
    for field in ("retention_check_ms", "cleaner_threads", "cleaner_backoff_ms", "max_connections"):
        assert getattr(config, field) == getattr(defaults, field), field


# -- the texts themselves --------------------------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, prog: str = "oncelog"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{prog} {name}")


HELP_TEXTS = {prog: parser.format_help() for prog, parser in _parsers(build_parser())}


def _example_commands(text: str) -> Iterator[str]:
    """The `oncelog ...` command of each example line, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        at = line.find("oncelog ")
        if at < 0 or (line[:at].strip(" |$(") != "" and "|" not in line[:at]):
            continue
        command = line[at:]
        command = re.split(r"\s(?:\|\|?|#|;|&&|>|2>)\s", command)[0]
        if command.startswith("oncelog ") and command.split()[1] in SUBCOMMAND_NAMES:
            yield command


def test_every_example_in_every_help_parses() -> None:
    examples = {command for text in HELP_TEXTS.values() for command in _example_commands(text)}
    assert len(examples) >= 40  # (the texts hold this many: a parse that finds none proves nothing)
    parser = build_parser()
    refused = []
    for command in sorted(examples):
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit:
            refused.append(command)
    assert refused == []


@pytest.mark.parametrize("prog", sorted(HELP_TEXTS))
def test_help_names_no_source_tree_path_issue_number_or_make_target(prog: str) -> None:
    text = HELP_TEXTS[prog]
    assert not re.search(r"\bissue \d", text)
    assert not re.search(r"`make |\bmake (demo|test|bench|torture|compat)\b", text)  # a wheel has no Makefile
    assert "pip install -e" not in text and "dev extra" not in text
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.startswith("  ") and line.split()[0] in ("oncelog", "printf"):
            # Quotes balance: no example is broken across lines by an escape (`\n` in the source).
            shlex.split(line.split(" # ")[0])
    for command in _example_commands(text):
        for word in shlex.split(command):
            assert not word.startswith(("bench/", "engine/", "tests/", "segments/", "recovery/")), command


def test_every_install_hint_names_an_extra_the_package_has() -> None:
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    hints = {
        hint for text in HELP_TEXTS.values() for hint in re.findall(r"pip install 'oncelog\[(\w+)\]'", text)
    }
    assert hints, "the bench's help names the extras --wire, --spark and --plot need"
    assert hints <= extras


def test_the_bench_help_quotes_the_sizes_of_the_full_and_the_quick_run() -> None:
    from oncelog.bench.harness import FULL, MIB, QUICK

    text = " ".join(HELP_TEXTS["oncelog bench"].split())
    assert f"{FULL.append_rounds} rounds each side ({QUICK.append_rounds} with --quick)" in text
    assert (
        f"{FULL.tail_scan_bytes // MIB} MiB active segment ({QUICK.tail_scan_bytes // MIB} MiB with --quick)"
        in text
    )
    assert f"{QUICK.repeats} repeats instead of {FULL.repeats}" in text
    assert f"{FULL.wire_repeats} repeats ({QUICK.wire_repeats} with --quick)" in text
    assert f"{FULL.cleaner_rounds} rounds ({QUICK.cleaner_rounds} with --quick)" in text


def test_the_bench_help_gives_each_duration_once() -> None:
    """Durations come from one table (TYPICAL_RUN_S), in one paragraph, not per option."""
    text = HELP_TEXTS["oncelog bench"]
    assert len(re.findall(r"How long it takes", text)) == 1
    assert "adds about" not in text and "under 2 minutes" not in text


def test_the_torture_help_example_is_what_the_self_test_prints() -> None:
    from oncelog.torture.selftest import PLANTED

    text = HELP_TEXTS["oncelog torture"]
    assert f"plant {len(PLANTED)} known bugs" in " ".join(text.split())
    (example,) = re.findall(r"--self-test --json\s+# (\{.*\})", text)
    assert json.loads(example) == {"planted": len(PLANTED), "caught": len(PLANTED), "missed": []}


def test_the_torture_help_describes_every_fault_class() -> None:
    from oncelog.torture.model import FAULTS

    text = " ".join(HELP_TEXTS["oncelog torture"].split())
    described = text.split("Fault classes:", 1)[1]
    assert [fault for fault in FAULTS if not re.search(rf"\b{fault}\b( / \w+)? \(", described)] == []


def test_python_dash_m_oncelog_prints_the_installed_version() -> None:
    from importlib.metadata import version

    argv = [sys.executable, "-m", "oncelog", "--version"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"oncelog {version('oncelog')}\n", "")
