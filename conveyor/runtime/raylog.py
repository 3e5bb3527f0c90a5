"""Ray's log lines that say nothing to a Conveyor user, dropped (each by how its message starts)
while the call that makes them runs; every other line passes."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from conveyor.compat import RAY_TOKEN_LOGGER, RAY_WORKER_LOGGER


class _Dropped(logging.Filter):
    """Drops one of Ray's log lines, by how its message starts; every other line passes."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def dropped(logger: str, prefix: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    drop = _Dropped(prefix)
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def quiet_token_note(address: str) -> contextlib.AbstractContextManager[None]:
    """Ray's WARNING that token authentication is on: on Conveyor's own instance (``address=local``)
    and on the one `ray start` runs here, joined by discovery (``auto``), that is Ray's default and
    the one we want (the instance listens on this machine's address), and the line only said, on
    every run, that nothing was wrong. Joining a named cluster, it passes untouched;
    RAY_AUTH_MODE=disabled still opts out, as Ray documents."""
    if address not in ("local", "auto"):
        return contextlib.nullcontext()
    return dropped(RAY_TOKEN_LOGGER, "Token authentication is enabled for this Ray cluster")


def quiet_thread_note() -> contextlib.AbstractContextManager[None]:
    """Ray's WARNING that ``ray.init`` outside the main thread sets no SIGTERM handler: the instance
    start_early starts in a thread, and SIGTERM is Conveyor's to handle (it cancels the run)."""
    return dropped(RAY_WORKER_LOGGER, "SIGTERM handler is not set")
