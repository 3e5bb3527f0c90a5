"""Conveyor's logging: the run's decisions go through the standard ``logging`` module.

Everything Conveyor says is a record of the ``conveyor`` logger (or a child of it):
:func:`say` logs at INFO what the user reads on stderr (where the run goes, resume, the report),
:func:`warn` at WARNING, and :func:`note` at INFO what the run decided for its log file only (plan,
path and writer, each partition's outcome with where it ran and what it retried, a failed task's
traceback). One handler on the ``conveyor`` logger prints on stderr (``warning: ...`` for
warnings, the message alone otherwise; notes only with ``--verbose``); Hydra's logging config
(``configs/hydra/job_logging/conveyor.yaml``) sends every record, with its time and level, to the
run directory's ``conveyor.log``. Used as a library, only warnings print (the logger's level is then the root's);
the CLI sets INFO, or DEBUG with ``--verbose``.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("conveyor")


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (the CLI swaps it around Hydra)."""

    verbose = False

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "console", True) and not self.verbose:
            return
        try:
            text = record.getMessage()
            if record.levelno >= logging.WARNING:
                text = f"warning: {text}"
            elif record.levelno < logging.INFO:
                text = f"debug: {text}"
            print(text, file=sys.stderr, flush=True)
        except Exception:  # logging must never break a run
            self.handleError(record)


def _install() -> logging.Handler:
    for handler in logger.handlers:
        if isinstance(handler, _StderrHandler):
            return handler
    handler = _StderrHandler()
    logger.addHandler(handler)
    return handler


_CONSOLE = _install()


def set_level(verbose: bool) -> None:
    """What the command line shows: decisions (INFO), or every detail with ``--verbose`` (DEBUG)."""
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    _StderrHandler.verbose = verbose


def warn(message: str) -> None:
    """One ``warning:`` line on stderr, and in the run's log."""
    logger.warning("%s", message)


def say(message: str) -> None:
    """One line on stderr saying what the run decided, and in the run's log."""
    logger.info("%s", message)


def note(message: str) -> None:
    """A decision or detail for the run's log file (stderr too with ``--verbose``)."""
    logger.info("%s", message, extra={"console": False})
