"""The processes of a private Ray instance end with the driver that started them, however it ends.

``ray.init()`` without an address starts a Ray instance owned by this process. Ray ties its direct
children (GCS, raylet, dashboard) to the driver with ``PR_SET_PDEATHSIG``, but the raylet's own
children (the dashboard and runtime-env agents, task workers) are not: when the driver is killed
(SIGKILL, the OOM killer) during start-up they were left behind for minutes. So, for a private
instance, the driver starts this small watcher first, in a session of its own, reading a pipe from
the driver, and tells it what makes up the instance: a token in the environment the processes
inherit, the pids of the driver's descendants (polled every 0.1 s) and the instance's session
folder (whose files every Ray process holds open). At end of file without the word ``done`` (the
driver is gone) the watcher terminates every process matching any of these (SIGTERM, then SIGKILL
a second later). Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

ENV = "CONVEYOR_RAY_INSTANCE"
GRACE_SECONDS = 1.0
POLL_SECONDS = 0.1
_SESSION = re.compile(r"(/\S*?/session_[0-9_-]+)")


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[1]), fields[19]


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]


def descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every process below ``root``."""
    table = {pid: st for pid in _pids() if (st := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _uses(pid: int, token: str, session: str) -> bool:
    """The process carries the token in its environment or holds a file of the session open."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"{ENV}={token}".encode() in f.read().split(b"\0"):
                return True
        if session:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session + "/"):
                        return True
    except OSError:  # gone, or another user's
        return False
    return False


class Reaper:
    """The driver's side: mark the environment, start the watcher, report what makes up the
    instance; ``stop`` on a clean end."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self._proc: subprocess.Popen | None = None
        self._seen: set[tuple[int, str]] = set()
        self._session = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Reaper:
        if not sys.platform.startswith("linux"):
            return self
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.runtime.reaper", self.token], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        os.environ[ENV] = self.token  # after the watcher started: it does not carry the mark itself
        self._thread = threading.Thread(target=self._watch, name="conveyor-reaper", daemon=True)
        self._thread.start()
        return self

    def _report(self) -> None:
        lines = []
        watcher = self._proc.pid if self._proc else -1
        for pid, started in descendants(os.getpid()).items():
            if pid == watcher or (pid, started) in self._seen:
                continue
            self._seen.add((pid, started))
            lines.append(f"pid {pid} {started}\n")
            if not self._session and (m := _SESSION.search(_cmdline(pid))):
                self._session = m.group(1)
                lines.append(f"session {self._session}\n")
        with self._lock:
            if lines and self._proc is not None and self._proc.stdin is not None:
                self._proc.stdin.write("".join(lines).encode())
                self._proc.stdin.flush()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            with contextlib.suppress(Exception):
                self._report()

    def stop(self, reap: bool = False) -> None:
        """A clean end (after ``ray.shutdown()``): the watcher leaves; with ``reap`` (a start-up
        that failed half way) it terminates what was started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if os.environ.get(ENV) == self.token:
            del os.environ[ENV]
        if self._proc is None or self._proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if reap:
                self._report()  # the watcher thread has ended: the last word is this one
            else:
                self._proc.stdin.write(b"done\n")
            self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(GRACE_SECONDS + 5)
        self._proc = None


def reap(token: str, watched: dict[int, str], session: str) -> None:
    def targets() -> set[int]:
        found = {pid for pid, started in watched.items() if (st := _stat(pid)) is not None and st[1] == started}
        return found | {pid for pid in _pids() if _uses(pid, token, session)}

    alive = targets()
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = targets()
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the driver's to handle
    token, watched, session = sys.argv[1], {}, ""
    for raw in sys.stdin.buffer:
        word, _, rest = raw.decode(errors="replace").strip().partition(" ")
        if word == "done":
            return
        if word == "pid":
            pid, _, started = rest.partition(" ")
            if pid.isdigit():
                watched[int(pid)] = started
        elif word == "session":
            session = rest
    reap(token, watched, session)  # end of file without 'done': the driver is gone


if __name__ == "__main__":
    main()
