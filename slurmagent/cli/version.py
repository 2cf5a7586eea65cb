"""`slurmagent version`."""

from __future__ import annotations

import argparse

from slurmagent.cli.exits import EXIT_OK


def version(args: argparse.Namespace) -> int:
    from slurmagent import __version__

    print(__version__)
    return EXIT_OK
