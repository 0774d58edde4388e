"""The arguments and help text of every subcommand, one module each.

Building the parser imports only these modules, argparse and `oncelog.cli.exits`:
`oncelog --help` and each subcommand's `--help` load no engine, server, numpy or
client library (tests/cli/test_cli_help.py holds the import list). Each parser names
the module that runs it (`handler`), which main imports only then. Where help shows a
value the code defines (a default, a limit, a count), the value is repeated here and
a test checks it against the code.
"""

from __future__ import annotations

from oncelog.cli.parsers import (
    acls,
    bench,
    demo,
    dump,
    groups,
    recover,
    serve,
    stat,
    topics,
    torture,
    users,
    verify,
)

# In the order `oncelog --help` lists them.
SUBCOMMANDS = (dump, demo, torture, bench, verify, stat, recover, serve, topics, users, acls, groups)
