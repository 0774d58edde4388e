"""The arguments and help text of `oncelog users`; the command itself is `oncelog.cli.users`."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli.exits import PROG

# The code's values, repeated here so that --help imports nothing heavy;
# tests/cli/test_cli_help.py checks each against the code.
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 8192
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


DESCRIPTION = """\
Add, delete and list the SASL users of ROOT, which `oncelog serve` logs clients in as
(SCRAM-SHA-256, SCRAM-SHA-512, and PLAIN checked against the same credentials).

  add NAME       store NAME's credentials for each --mechanism (default: both SCRAM ones);
                 the password comes from stdin (--password-stdin) or a prompt, never an
                 argument; a user that exists gets the new password
  delete NAME    remove NAME (or only its --mechanism credentials)
  list           every user and the mechanisms and iterations it has

Credentials are kept as SCRAM keeps them (a salt, an iteration count and two derived
keys), never the password, in ROOT/security.lmdb, readable by this user alone. A
running server sees a change at the next login."""


EPILOG = f"""\
examples:
  printf '%s\\n' "$ALICE_PASSWORD" | {PROG} users /var/lib/oncelog add alice --password-stdin
  {PROG} users data add svc-billing --mechanism SCRAM-SHA-512 --iterations 16384
  {PROG} users data list
  {PROG} users data delete alice

Exit status: 0; 2 for bad input (no such root, an empty password, a user to delete that
does not exist, a credential store others can read)."""


def add_parser(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    parser = commands.add_parser(
        "users",
        help="add, delete and list the SASL users `oncelog serve` logs clients in as",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("root", metavar="ROOT", help="the LogManager root whose users these are")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="store a user's credentials (a new password for one that exists)")
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="the SCRAM mechanism to store credentials for (repeatable; default: both)",
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations ({MIN_ITERATIONS}..{MAX_ITERATIONS}; default: %(default)s)",
    )
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin's first line"
    )
    delete = actions.add_parser("delete", help="remove a user, or one mechanism's credentials")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--mechanism", choices=SCRAM_MECHANISMS, help="remove only these credentials")
    actions.add_parser("list", help="every user, its mechanisms and iterations")
    parser.set_defaults(handler="oncelog.cli.users")
