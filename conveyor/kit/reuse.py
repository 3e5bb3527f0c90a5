"""Connections a job's driver reuses while it runs: a job over 200 tables describes, plans, prepares,
counts and finalizes each table, and a new connection for each of those steps (a TCP handshake, a
server process started, SCRAM's key derivation on both ends: about 10 ms here, more over a network)
was most of such a job's time.

While :func:`reusing` is entered (the job's run), a connector's short-lived connections go back to
an idle list when closed instead of being closed, and the next connection to the same server with
the same settings takes one from there. A connector decides what may be reused and how a connection
is made clean again (PostgreSQL: autocommit connections outside a transaction, reset by
``DISCARD ALL``); a connection it cannot make clean is closed as before. Outside :func:`reusing`
(a task on a Ray worker, the Python API's helpers) nothing changes. The idle connections are closed
when the outermost :func:`reusing` exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

#: idle connections per key; at most this many are kept per key (more are closed)
MAX_IDLE = 4

_LOCK = threading.Lock()
_IDLE: dict[Hashable, list[Any]] = {}
_DEPTH = 0


@contextlib.contextmanager
def reusing() -> Iterator[None]:
    """Reuse connections until this (the outermost) exits; then close the idle ones."""
    global _DEPTH
    with _LOCK:
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            idle = [con for cons in _IDLE.values() for con in cons] if _DEPTH == 0 else []
            if _DEPTH == 0:
                _IDLE.clear()
        for con in idle:
            with contextlib.suppress(Exception):
                con.really_close()


def active() -> bool:
    return _DEPTH > 0


def take(key: Hashable) -> Any | None:
    """An idle connection kept under ``key``, or None (then the caller makes one)."""
    with _LOCK:
        cons = _IDLE.get(key)
        return cons.pop() if cons else None


def give_back(key: Hashable, con: Any, clean: Callable[[Any], bool]) -> bool:
    """Keep ``con`` for reuse if a reuse is active and ``clean(con)`` made it clean; False: the caller closes it."""
    if not active():
        return False
    try:
        if not clean(con):
            return False
    except Exception:
        return False
    with _LOCK:
        if _DEPTH == 0:
            return False
        cons = _IDLE.setdefault(key, [])
        if len(cons) >= MAX_IDLE:
            return False
        cons.append(con)
        return True
