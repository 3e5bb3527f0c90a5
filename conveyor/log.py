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

``--log-format json`` (or ``CONVEYOR_LOG_FORMAT=json``) makes every line the CLI writes on stderr one
JSON object, for log shippers: ``{"time", "level", "message"}`` and, for events that carry numbers
(progress, the run's outcome, an error), ``"event"`` and their fields (:func:`event`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

logger = logging.getLogger("conveyor")


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (the CLI swaps it around Hydra)."""

    verbose = False
    #: one JSON object per line (--log-format json)
    json = os.environ.get("CONVEYOR_LOG_FORMAT", "").lower() == "json"

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "console", True) and not self.verbose:
            return
        try:
            text = record.getMessage()
            if self.json:
                line(record.levelname.lower(), text, **getattr(record, "fields", {}))
                return
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


def json_lines() -> bool:
    """Whether the CLI writes JSON lines on stderr (--log-format json)."""
    return _StderrHandler.json


def set_format(fmt: str) -> None:
    """``text`` (the default) or ``json``: one JSON object per line on stderr."""
    _StderrHandler.json = fmt == "json"


def line(level: str, message: str, **fields: Any) -> None:
    """One JSON line on stderr: time (UTC, ISO 8601), level, message, and ``fields``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
    print(json.dumps({"time": stamp, "level": level, "message": message, **fields}, default=str), file=sys.stderr, flush=True)


def event(name: str, message: str, **fields: Any) -> None:
    """An event with numbers (progress, a run's outcome): a JSON line of its own under --log-format json,
    the message as a plain line otherwise."""
    if _StderrHandler.json:
        line("info", message, event=name, **fields)
    else:
        print(message, file=sys.stderr, flush=True)


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
