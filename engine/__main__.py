"""`python -m oncelog`: the same as the `oncelog` command."""

import sys

from oncelog.cli.main import main

sys.exit(main())
