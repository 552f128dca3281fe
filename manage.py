#!/usr/bin/env python
"""Django's command-line utility. `ctxapp manage …` is the same, and starts the embedded database."""

import sys

if __name__ == "__main__":
    from ctxapp.cli import main

    sys.exit(main(["manage", *sys.argv[1:]]))
