"""Warnings a user should see: one line on stderr, ``warning: ...`` (and in the run's log)."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("conveyor")


def warn(message: str) -> None:
    """One ``warning:`` line on stderr; also logged, for the run directory's log file."""
    print(f"warning: {message}", file=sys.stderr, flush=True)
    logger.debug("warning: %s", message)


def say(message: str) -> None:
    """One informational line on stderr (what the run decided), also logged."""
    print(message, file=sys.stderr, flush=True)
    logger.debug("%s", message)
