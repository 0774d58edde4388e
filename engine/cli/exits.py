"""The command's name and exit statuses, shared by every subcommand."""

PROG = "oncelog"
EXIT_OK = 0
EXIT_BAD_INPUT = 2  # bad input, or damage found in the files
