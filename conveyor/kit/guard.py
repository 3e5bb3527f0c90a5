"""The driver's hold on a run at its target server, shared by the SQL sinks that keep one.

The driver holds a lock named after its run id on a connection of its own for the whole run. A
task checks, just before it commits, that the lock is still held (a task whose driver died rolls
back instead of committing behind a driver that can no longer account for it) and that the run is
not stopping (after Ctrl-C, no partition commits, wherever it runs). A daemon thread pings the
connection every second, takes the locks again if the connection was lost (a target server
restarted mid-run), and marks the runs stopping as soon as Ctrl-C or SIGTERM is seen.

The runs of one process at one server share that connection and thread (``hold``'s ``share``): a
job over several tables holds a run id per table, and 200 tables must not hold 200 connections
(a server's ``max_connections`` is 100 by default) nor ping 200 times a second.

A connector subclasses :class:`RunGuard` with its SQL: how a connection is made, how one run's
lock is taken and given up, how a run is marked stopping, and a ping.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable
from typing import Any

from conveyor.core import wait_for_cancel
from conveyor.errors import ConveyorError

_GUARDS: dict[str, RunGuard] = {}
_SHARED: dict[Hashable, RunGuard] = {}
_GUARDS_LOCK = threading.Lock()


class RunGuard:
    """The runs' locks on a connection of its own (see the module's docstring)."""

    def __init__(self, run_id: str, about: Any = None) -> None:
        self.run_ids = [run_id]
        #: what the connector keeps of each run beside its id (ClickHouse: its load id)
        self.about: dict[str, Any] = {run_id: about}
        #: the key runs share it by (hold's ``share``; None: this run's alone)
        self.share: Hashable | None = None
        self.stopping = False
        self.con = self._lock()
        self.stop = threading.Event()
        #: held by whoever uses ``con``: the watch thread's ping, its marking and reconnecting, and
        #: :meth:`close`. Closing a psycopg connection while another thread runs a statement on it
        #: frees what that statement is using: the driver segfaulted at the end of a run (make bench,
        #: parquet_to_postgres on a running Ray instance: close() met the second's ping)
        self.using = threading.Lock()
        threading.Thread(target=self._watch, name="conveyor-guard", daemon=True).start()

    # --- what a connector says ----------------------------------------------------------------

    def _connect(self) -> Any:
        """A new connection for the locks."""
        raise NotImplementedError

    def _take(self, con: Any, run_id: str) -> None:
        """Take one run's lock on ``con`` (and mark it stopping if ``self.stopping``)."""
        raise NotImplementedError

    def _mark_stopping(self, con: Any, run_id: str) -> None:
        """From now on no partition of the run commits: returns once none is committing."""
        raise NotImplementedError

    def _give_up(self, con: Any, run_id: str) -> None:
        """A run released cleanly: what it leaves behind, and its lock let go (best effort)."""

    def _ping(self, con: Any, run_ids: list[str]) -> None:
        con.execute("SELECT 1")

    # --- the hold ---------------------------------------------------------------------------------

    def _lock(self) -> Any:
        """A new connection holding every run's lock."""
        con = self._connect()
        try:
            for run_id in self.run_ids:
                self._take(con, run_id)
        except BaseException:
            with contextlib.suppress(Exception):
                con.close()
            raise
        return con

    def add(self, run_id: str, about: Any = None) -> None:
        with self.using:
            self.about[run_id] = about
            self.run_ids.append(run_id)
            try:
                try:
                    self._take(self.con, run_id)
                except ConveyorError:  # refused (another session holds it): said as is
                    raise
                except Exception:  # the connection was lost since the last ping: a new one takes every run's lock
                    with contextlib.suppress(Exception):
                        self.con.close()
                    self.con = self._lock()
            except BaseException:
                self.run_ids.remove(run_id)
                raise

    def remove(self, run_id: str) -> bool:
        """Let one run go; True when none is left (then the guard is closed)."""
        with self.using:
            if run_id in self.run_ids:
                self.run_ids.remove(run_id)
            if self.run_ids:
                with contextlib.suppress(Exception):
                    self._give_up(self.con, run_id)
                return False
        self.close(run_id)
        return True

    def _watch(self) -> None:
        while not self.stop.is_set():
            if not self.stopping and wait_for_cancel(1.0):
                self.stopping = True
                with self.using:
                    if self.stop.is_set():
                        return
                    for run_id in list(self.run_ids):
                        with contextlib.suppress(Exception):
                            self._mark_stopping(self.con, run_id)
            elif self.stopping and self.stop.wait(1.0):
                return
            with self.using:
                if self.stop.is_set():  # closed while this thread waited
                    return
                try:
                    self._ping(self.con, list(self.run_ids))
                except Exception:  # lost: take the locks again as soon as the server answers
                    with contextlib.suppress(Exception):
                        self.con.close()
                    with contextlib.suppress(Exception):
                        self.con = self._lock()

    def close(self, *released: str) -> None:
        self.stop.set()
        with self.using:  # after a ping in flight, before any other
            for run_id in released:
                with contextlib.suppress(Exception):
                    self._give_up(self.con, run_id)
            with contextlib.suppress(Exception):
                self.con.close()


def hold(run_id: str, make: Callable[[], RunGuard], share: Hashable | None = None, about: Any = None) -> None:
    """Hold the run's guard (made by ``make`` the first time) until :func:`release`; with ``share`` (the
    server and what the guard keeps there), a guard of the same key already held takes the run too."""
    with _GUARDS_LOCK:
        if run_id in _GUARDS:
            return
        shared = _SHARED.get(share) if share is not None else None
        if shared is not None:
            shared.add(run_id, about)
            _GUARDS[run_id] = shared
            return
        made = make()
        _GUARDS[run_id] = made
        if share is not None:
            made.share = share
            _SHARED[share] = made


def release(run_id: str) -> None:
    with _GUARDS_LOCK:
        guard = _GUARDS.pop(run_id, None)
        if guard is None:
            return
        if guard.remove(run_id) and guard.share is not None:
            _SHARED.pop(guard.share, None)
