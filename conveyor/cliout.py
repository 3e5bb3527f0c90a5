"""What the ``conveyor`` command prints: an error as one line and a hint with its exit code (the
traceback only with ``--verbose``), and the console it prints tables on."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

EXIT_INTERNAL = 1
EXIT_CONFIG = 2


def stderr_line(msg: str) -> None:
    from conveyor.log import json_lines, line

    if json_lines():
        level, _, text = msg.partition(": ")
        if level in ("error", "hint"):
            line(level if level == "error" else "info", text, **({"hint": True} if level == "hint" else {}))
        else:
            line("info", msg)
        return
    print(msg, file=sys.stderr, flush=True)


def report_error(exc: BaseException, verbose: bool) -> int:
    """Print an error as one line plus its hint; return the exit code."""
    from conveyor.errors import ConveyorError, JobFailed, missing_extra

    if isinstance(exc, JobFailed):  # a failed run: say what stopped it
        exc = exc.cause
    if isinstance(exc, BrokenPipeError):  # the reader went away (conveyor plugins | head): nothing more to say
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process ended by SIGPIPE
    exc = missing_extra(exc) or exc
    from conveyor.log import json_lines, line

    if json_lines():  # one JSON line: the message, its hint and the exit code (the traceback with --verbose)
        ours = isinstance(exc, ConveyorError)
        code = exc.exit_code if isinstance(exc, ConveyorError) else EXIT_INTERNAL
        message = exc.message if isinstance(exc, ConveyorError) else f"internal error: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        line("error", message, event="error", exit_code=code, hint=exc.hint if ours else "run again with --verbose for the traceback",
             **({"traceback": "".join(traceback.format_exception(exc))} if verbose else {}))
        return code
    if isinstance(exc, ConveyorError):
        if verbose:
            stderr_line("".join(traceback.format_exception(exc)).rstrip())
            if exc.task_traceback:
                stderr_line("in the task:\n" + exc.task_traceback.rstrip())
        stderr_line(f"error: {exc.message}")
        if exc.hint:
            stderr_line(f"hint: {exc.hint}")
        return exc.exit_code
    if verbose:
        stderr_line("".join(traceback.format_exception(exc)).rstrip())
    first = (str(exc).splitlines() or [""])[0]
    stderr_line(f"error: internal error: {type(exc).__name__}: {first}")
    stderr_line("hint: run again with --verbose for the traceback, and please report it")
    return EXIT_INTERNAL


#: the width of output that is not a terminal (a log, a pipe, a CI job): what nothing is cut or wrapped at
OFF_TERMINAL_WIDTH = 100_000


def console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else OFF_TERMINAL_WIDTH)


def print_table(console: Any, table: Any) -> None:
    """A table as the terminal shows it; off a terminal, its title and caption as lines of their own (not wrapped to the
    table's width nor padded to it) and the table as wide as its cells: a log keeps every path and name whole, and no
    line ends in spaces."""
    if console.is_terminal:
        console.print(table)
        return
    title, caption = table.title, table.caption
    table.title = table.caption = None
    try:
        for line in str(title or "").splitlines():
            console.print(line, markup=False, highlight=False)
        console.print(table)
        for line in str(caption or "").splitlines():
            console.print(line, markup=False, highlight=False)
    finally:
        table.title, table.caption = title, caption


def quiet_libraries() -> None:
    """Drivers' INFO chatter (e.g. botocore's "Found credentials") is not the user's business."""
    import logging

    for name in ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
