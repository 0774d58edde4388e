"""The `oncelog` command line: parse the arguments and dispatch to a subcommand.

Each subcommand is one module of this package (`dump`, `verify`, `stat`, `recover`,
`torture`, `bench`, `demo`, `serve`, `topics`, `groups`, `users`, `acls`) with an `add_parser` and a `run`.
Here: the shared
handling of errors, broken pipes and exit statuses (0 ok, 2 bad input or damage).
A command never prints a traceback for an error oncelog raises on purpose.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from oncelog.cli import acls, demo, dump, groups, topics, users
from oncelog.cli import bench as bench_cli
from oncelog.cli import recover as cli_recover
from oncelog.cli import serve as cli_serve
from oncelog.cli import stat as cli_stat
from oncelog.cli import torture as torture_cli
from oncelog.cli import verify as cli_verify
from oncelog.cli.exits import EXIT_BAD_INPUT, EXIT_OK, PROG
from oncelog.errors import OncelogError

DESCRIPTION = """\
oncelog: a durable on-disk log engine storing Apache Kafka v2 record batches.

Tools for looking at oncelog (and Kafka) data directories."""

EPILOG = """\
examples:
  oncelog dump data/orders-0/00000000000000000000.log
  oncelog dump --records /var/lib/kafka/orders-0 | head -50
  oncelog dump data/orders-0/00000000000000000000.txnindex
  oncelog demo --data-dir ./data/demo
  oncelog serve ./data --listen 127.0.0.1:9092
  oncelog topics --bootstrap 127.0.0.1:9092 list
  oncelog groups reset-offsets billing --topic orders --to-earliest
  printf '%s\n' "$PASSWORD" | oncelog users ./data add alice --password-stdin
  oncelog acls ./data add --allow-principal User:alice --operation Write --topic orders

Run `oncelog <command> --help` for the options of a command."""


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    dump.add_parser(commands, formatter)
    demo.add_parser(commands, formatter)
    torture_cli.add_parser(commands, formatter)
    bench_cli.add_parser(commands, formatter)
    cli_verify.add_parser(commands, formatter)
    cli_stat.add_parser(commands, formatter)
    cli_recover.add_parser(commands, formatter)
    cli_serve.add_parser(commands, formatter)
    topics.add_parser(commands, formatter)
    users.add_parser(commands, formatter)
    acls.add_parser(commands, formatter)
    groups.add_parser(commands, formatter)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input or corruption)."""
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    # Library warnings (a torn tail cut on open, say) reach the operator as one line each.
    logging.basicConfig(level=logging.WARNING, format="oncelog: %(levelname)s: %(message)s", stream=stderr)
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, or a usage error (argparse prints it)
        return _exit_code(exc)
    for stream in (stdout, stderr):
        if isinstance(stream, io.TextIOWrapper):
            # Paths that are not UTF-8 reach Python as surrogate escapes: print their bytes back.
            stream.reconfigure(errors="surrogateescape")
    try:
        status: int = args.handler(args, stdout, stderr)
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
