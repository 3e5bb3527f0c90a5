"""A throwaway server to try Conveyor with, from the command line: ``python -m conveyor.testing.pgserver`` (PostgreSQL,
logical decoding on for sync jobs), ``python -m conveyor.testing.mysqlserver`` (MariaDB, its binary log on in ROW
format) and ``python -m conveyor.testing.chserver`` (ClickHouse). Each listens on loopback only, keeps its data in a
temp folder, prints the ``export`` line to paste into another shell, and stops and removes everything on Ctrl-C."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def serve(prog: str, what: str, argv: list[str] | None, make: Callable[[argparse.Namespace, str], Any],
          export: Callable[[Any, bool], str], install: str, options: Callable[[argparse.ArgumentParser], None] | None = None,
          password_env: str = "") -> int:
    """Parse ``argv`` (``--help`` prints the usage and starts nothing), start ``make(args, password)``, print
    ``export(server, password_given)`` and wait for Ctrl-C or SIGTERM, then stop it. The password is ``$password_env``
    when set (then never printed), else a new one, printed once in the line."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Start a throwaway {what} on 127.0.0.1 to try Conveyor with: it prints "
                                     "the export line to paste into another shell; Ctrl-C stops it and removes its data.",
                                     epilog=f"The password is ${password_env} when it is set (not printed), else a new one, printed "
                                            f"once. The server's binaries: {install}.")
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    given = os.environ.get(password_env) if password_env else None
    server = make(args, given or secrets.token_urlsafe(12))
    try:
        server.start()
    except Exception as exc:
        print(f"error: {what} did not start: {exc}", file=sys.stderr)
        print(f"hint: {install}", file=sys.stderr)
        return 1
    stop = {"asked": False}

    def asked(*_: object) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGINT, asked)  # before the line: a Ctrl-C right after it still stops the server
    signal.signal(signal.SIGTERM, asked)
    print(f"{export(server, bool(given))}   # a throwaway {what}; Ctrl-C stops and removes it", flush=True)
    try:
        while not stop["asked"]:
            time.sleep(0.2)
    finally:
        server.stop()
    return 0


__all__ = ["serve"]
