"""`python -m ctxapp.cli …`, the same as the `ctxapp` command."""

import sys

from ctxapp.cli import main

sys.exit(main())
