"""The `oncelog` command line: parse the arguments and dispatch to a subcommand.

Each subcommand is one module of this package (`dump`, `verify`, `stat`, `recover`,
`torture`, `bench`, `demo`, `serve`, `topics`, `groups`, `users`, `acls`) with a `run`;
its arguments and help text are in `oncelog.cli.parsers`, which loads nothing but
argparse, so `--help` answers at once. The subcommand's module is imported only when
it runs. Here: the shared handling of errors, broken pipes, Ctrl-C and exit statuses
(0 ok, 2 bad input or damage, 130 interrupted). A command never prints a traceback for
an error oncelog raises on purpose, nor for Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.cli.interrupts import EXIT_INTERRUPTED, first_sigint_raises, interrupts_win
from oncelog.cli.parsers import SUBCOMMANDS

DESCRIPTION = """\
oncelog: a durable on-disk log engine storing Apache Kafka v2 record batches.

Look at, check and recover oncelog (and Kafka) data directories, serve them to Kafka
clients, and run the demo, the crash-torture harness and the benchmarks."""

EPILOG = """\
examples:
  oncelog dump data/orders-0/00000000000000000000.log
  oncelog dump --records /var/lib/kafka/orders-0 | head -50
  oncelog dump data/orders-0/00000000000000000000.txnindex
  oncelog demo --data-dir ./data/demo
  oncelog serve ./data --listen 127.0.0.1:9092
  oncelog topics --bootstrap 127.0.0.1:9092 list
  oncelog groups reset-offsets billing --topic orders --to-earliest
  printf '%s\\n' "$PASSWORD" | oncelog users ./data add alice --password-stdin
  oncelog acls ./data add --allow-principal User:alice --operation Write --topic orders

Run `oncelog <command> --help` for the options of a command. Ctrl-C stops any command:
it cleans up (scratch directories removed, child processes ended, open logs closed, or
left to recover as after a kill where a write was cut short), prints one line,
"oncelog <command>: interrupted", and exits 130."""


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter
    )
    parser.add_argument("--version", action=_Version, help="print oncelog's version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(commands, formatter)
    return parser


class _Version(argparse.Action):
    """--version: the installed distribution's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("oncelog")
        except PackageNotFoundError:  # (run from a source tree that was never installed)
            found = "unknown (not installed)"
        print(f"{PROG} {found}", file=sys.stdout)  # (stdout, as argparse's own version action)
        parser.exit(0)


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input or corruption, 130 Ctrl-C)."""
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    _log_warnings_to(stderr)
    try:
        args = build_parser().parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, or a usage error (argparse prints it)
        return _exit_code(exc)
    except KeyboardInterrupt:  # (Python's own handler, still: nothing has started)
        print(f"{PROG}: interrupted", file=stderr)
        return EXIT_INTERRUPTED
    for stream in (stdout, stderr):
        if isinstance(stream, io.TextIOWrapper):
            # Paths that are not UTF-8 reach Python as surrogate escapes: print their bytes back.
            stream.reconfigure(errors="surrogateescape")
    with first_sigint_raises(PROG):
        try:
            return _run(args, stdout, stderr)
        except KeyboardInterrupt:
            # Every `finally` on the way here has run: scratch removed, children ended, logs closed.
            print(f"{PROG} {args.command}: interrupted", file=stderr)
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """The subcommand's module (args.handler) is imported here, when it runs."""
    from oncelog.errors import OncelogError  # (loads the codec: not for --help)

    try:
        with interrupts_win():  # (a log a Ctrl-C failed raises LogFailedError from its close)
            status: int = importlib.import_module(args.handler).run(args, stdout, stderr)
    except BrokenPipeError:
        # The reader went away (`oncelog dump ... | head`): not an error.
        _silence_stdout(stdout)
        return EXIT_OK
    except OncelogError as exc:
        # Bad input or damaged files a command did not report itself: one line naming
        # the file (the library's errors do), never a traceback.
        print(f"{PROG} {args.command}: {type(exc).__name__}: {exc}", file=stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"{PROG} {args.command}: {where}{exc.strerror or exc}", file=stderr)
        return EXIT_BAD_INPUT
    return status


def _log_warnings_to(stderr: TextIO) -> None:
    """oncelog's warnings (a torn tail cut on open, say) reach the operator as one line each.

    Other libraries' records (kafka-python's connection retries, py4j's) are not shown: the
    command says in its own line what failed. A program or test that configured logging
    itself (the root logger has handlers) keeps its configuration.
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(logging.Formatter("oncelog: %(levelname)s: %(message)s"))
    logging.getLogger("oncelog").addHandler(handler)
    root.addHandler(logging.NullHandler())  # (else Python's last-resort handler prints theirs)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    if isinstance(exc.code, int):
        return exc.code
    return EXIT_BAD_INPUT


def _silence_stdout(stream: TextIO) -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush does not fail again."""
    if stream is not sys.stdout and stream is not sys.__stdout__:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
