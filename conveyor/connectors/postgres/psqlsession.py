"""The pass-through's psql kept for the next partition while a job's driver runs its tasks.

A psql per partition costs a process, a connection and SCRAM's key derivation on both ends: ~15 ms and
~12 ms of the client's CPU here, which is most of a small table's partition (a job over 200 tables of
1,000-100,000 rows). While connections are reused (:func:`conveyor.kit.reuse.reusing`: a job's driver and
the local runtime's tasks), a partition's psql stays when its script ended well and the next partition
to the same server as the same user sends its script to it.

A kept psql cannot be handed a new pipe, so each partition's stream goes through a FIFO of its own in a
private folder: ``\\g FIFO`` opens it for writing and closes it at the end of the COPY, which is the
stream's end (poll says so: POLLHUP). The script ends with ``\\echo`` of a marker of its own; its lines
before the marker hold the COPY's count. A psql that stopped (``ON_ERROR_STOP``: an error ends it) is
never kept, nor one whose stream was not read to its marker; each script begins with ``DISCARD ALL``,
so nothing of a partition's session reaches the next.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator

from conveyor.kit import reuse

#: what a folder's path may hold to stand unquoted after ``\\g`` (anything else: a psql per partition)
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./-]+")
#: how long a wait for the stream lasts before psql is asked whether it still runs
_POLL_MS = 500


class Session:
    """A psql reading scripts from its stdin, its messages in a file, its FIFOs in a folder of its own."""

    def __init__(self, program: str, env: dict[str, str]) -> None:
        self.folder = tempfile.mkdtemp(prefix="conveyor-psql-")
        self.messages = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([program, "-X", "-v", "ON_ERROR_STOP=1", "-f", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.messages, env=env)
        self.uses = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def really_close(self, kill: bool = False) -> None:
        """End psql (its stdin closed: it leaves as a script ends; killed if it does not within 5 s, or at once with
        ``kill``: a stream left unread) and remove its folder."""
        if kill and self.alive():
            self.proc.kill()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.messages):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Stream:
    """One partition's stream out of a kept psql: its FIFO read to the end (``read``), then psql's lines up to the
    script's marker (``lines``); ``ended`` once both came whole, which is when psql may be kept."""

    def __init__(self, session: Session, fifo: str, marker: bytes) -> None:
        self.session, self.fifo, self.marker = session, fifo, marker
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader first: psql's open for writing then does not wait
        _widen(self.fd)
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self.ended = False

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the stream, b"" at its end; raises ``BrokenPipeError`` where psql stopped first."""
        while True:
            if not self.poller.poll(_POLL_MS):
                if not self.session.alive():  # stopped before it opened the FIFO (an error in BEGIN, the snapshot)
                    raise BrokenPipeError("psql stopped")
                continue
            try:
                return os.read(self.fd, size)  # b"": the writer closed it (poll said POLLHUP), the COPY's end
            except BlockingIOError:
                continue

    def lines(self) -> bytes:
        """psql's output of the script up to its marker; raises ``BrokenPipeError`` where psql stopped before it."""
        out = []
        stdout = self.session.proc.stdout
        assert stdout is not None
        while True:
            line = stdout.readline()
            if not line:
                raise BrokenPipeError("psql stopped")
            if line.rstrip(b"\n") == self.marker:
                self.ended = True
                return b"".join(out)
            out.append(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.fifo)


def usable(program_env: dict[str, str]) -> bool:
    """Whether a kept psql may carry this process's partitions: connections are being reused (kit/reuse.py), the
    system has poll and FIFOs, and the temporary folder's path stands after ``\\g`` as it is."""
    return (reuse.active() and hasattr(select, "poll") and hasattr(os, "mkfifo")
            and _PLAIN_PATH.fullmatch(tempfile.gettempdir()) is not None)


@contextlib.contextmanager
def opened(program: str, env: dict[str, str], script: Callable[[str], str]) -> Iterator[Stream]:
    """A kept psql for this server and user (or a new one) running ``script(fifo)`` (a script whose COPY's data goes to
    that FIFO, ``\\g`` naming it); yields its stream. psql is kept for the next partition only where the stream and
    the script's lines were read to the end, and it still runs."""
    key = ("psql", program, tuple(sorted((k, v) for k, v in env.items() if k.startswith("PG"))))
    session = reuse.take(key)
    if session is None or not session.alive():
        if session is not None:
            session.really_close()
        session = Session(program, env)
    session.uses += 1
    fifo = os.path.join(session.folder, f"p{session.uses}")
    os.mkfifo(fifo, 0o600)
    marker = f"conveyor-end-{uuid.uuid4().hex}".encode()
    stream = Stream(session, fifo, marker)
    try:
        assert session.proc.stdin is not None
        text = f"DISCARD ALL;\n{script(fifo)}\\echo {marker.decode()}\n"
        try:
            session.proc.stdin.write(text.encode())
            session.proc.stdin.flush()
        except BrokenPipeError:
            pass  # psql stopped: read() says so
        yield stream
    finally:
        stream.close()
        if not stream.ended:  # psql may be writing into the FIFO no one reads, or mid-script: not kept
            session.really_close(kill=True)
        elif not reuse.give_back(key, session, lambda s: s.alive()):
            session.really_close()


def _widen(fd: int) -> None:
    from conveyor.connectors.postgres.passthrough import _widen as widen

    widen(fd)


__all__ = ["Session", "Stream", "opened", "usable"]
