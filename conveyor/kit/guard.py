"""The driver's hold on a run at its target server, shared by the SQL sinks that keep one.

The driver holds a lock named after its run id on a connection of its own for the whole run. A
task checks, just before it commits, that the lock is still held (a task whose driver died rolls
back instead of committing behind a driver that can no longer account for it) and that the run is
not stopping (after Ctrl-C, no partition commits, wherever it runs). A daemon thread pings the
connection every second, takes the lock again if the connection was lost (a target server
restarted mid-run), and marks the run stopping as soon as Ctrl-C or SIGTERM is seen.

A connector subclasses :class:`RunGuard` with its SQL: how the lock is taken, how the run is
marked stopping, and a ping.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from conveyor.core import wait_for_cancel

_GUARDS: dict[str, RunGuard] = {}
_GUARDS_LOCK = threading.Lock()


class RunGuard:
    """The run's lock on a connection of its own (see the module's docstring)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.stopping = False
        self.con = self._lock()
        self.stop = threading.Event()
        #: held by whoever uses ``con``: the watch thread's ping, its marking and reconnecting, and
        #: :meth:`close`. Closing a psycopg connection while another thread runs a statement on it
        #: frees what that statement is using: the driver segfaulted at the end of a run (make bench,
        #: parquet_to_postgres on a running Ray instance: close() met the second's ping)
        self.using = threading.Lock()
        threading.Thread(target=self._watch, name="conveyor-guard", daemon=True).start()

    def _lock(self) -> Any:
        """A new connection holding the run's lock (and marking it stopping if ``self.stopping``)."""
        raise NotImplementedError

    def _mark_stopping(self) -> None:
        """From now on no partition of the run commits: returns once none is committing."""
        raise NotImplementedError

    def _ping(self) -> None:
        self.con.execute("SELECT 1")

    def _released(self) -> None:
        """What the run leaves behind on a clean release (run on the guard's connection, best effort)."""

    def _watch(self) -> None:
        while not self.stop.is_set():
            if not self.stopping and wait_for_cancel(1.0):
                self.stopping = True
                with self.using:
                    if self.stop.is_set():
                        return
                    with contextlib.suppress(Exception):
                        self._mark_stopping()
            elif self.stopping and self.stop.wait(1.0):
                return
            with self.using:
                if self.stop.is_set():  # closed while this thread waited
                    return
                try:
                    self._ping()
                except Exception:  # lost: take the lock again as soon as the server answers
                    with contextlib.suppress(Exception):
                        self.con.close()
                    with contextlib.suppress(Exception):
                        self.con = self._lock()

    def close(self) -> None:
        self.stop.set()
        with self.using:  # after a ping in flight, before any other
            with contextlib.suppress(Exception):
                self._released()
            with contextlib.suppress(Exception):
                self.con.close()


def hold(run_id: str, make: Callable[[], RunGuard]) -> None:
    """Hold the run's guard (made by ``make`` the first time) until :func:`release`."""
    with _GUARDS_LOCK:
        if run_id not in _GUARDS:
            _GUARDS[run_id] = make()


def release(run_id: str) -> None:
    with _GUARDS_LOCK:
        guard = _GUARDS.pop(run_id, None)
    if guard is not None:
        guard.close()
