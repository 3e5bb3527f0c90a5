"""The pass-through: a PostgreSQL source's binary COPY stream into a PostgreSQL target, untouched.

Three parts, one per side and one between them:

- :func:`negotiate` (the sink, in prepare): the source's offer (``SourceInfo.native``) against
  the target's columns: identical types (typmods may differ: PostgreSQL checks each value) agree
  on ``pgcopy-binary``; anything else says why and takes the Arrow path.
- :func:`export` (the source, in the task): ``psql`` runs ``COPY (SELECT ...) TO STDOUT`` inside
  the job's snapshot with the source's credentials; the stream it yields raises the source's
  error at its end, before the sink can commit.
- :func:`relay` (the sink, in the task): 1 MiB chunks into ``COPY ... FROM STDIN (FORMAT binary)``.

psql's stdout is a pipe that holds one chunk, 1 MiB (Linux's default maximum pipe size), not the
default 64 KiB: psql goes on reading the source while the relay writes a chunk into the target,
where through a 64 KiB pipe the two sides took turns.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.connectors.postgres.common import PgConnConfig, ident
from conveyor.connectors.postgres.types import PgColumn
from conveyor.core import NativeExport, NativeStream, cancel_requested
from conveyor.errors import Cancelled, SchemaError, TransferError

FORMAT = "pgcopy-binary"
CHUNK = 1 << 20


def _widen(pipe: Any) -> None:
    """Make ``pipe`` hold CHUNK bytes where the system lets us (Linux: F_SETPIPE_SZ, up to
    /proc/sys/fs/pipe-max-size); elsewhere, or when refused, it keeps its size."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return
    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsz is not None and pipe is not None:
        with contextlib.suppress(OSError):  # over this user's pipe-buffer allowance: the default size
            fcntl.fcntl(pipe.fileno(), setsz, CHUNK)


def offer(columns: Sequence[PgColumn]) -> NativeExport:
    """What a PostgreSQL source offers: its column types, and the stream where psql is installed."""
    if shutil.which("psql") is None:
        return NativeExport("postgres", tuple(columns), None, "psql (PostgreSQL's client) is not installed")
    return NativeExport("postgres", tuple(columns), FORMAT)


def source_columns(native: NativeExport | None) -> dict[str, PgColumn]:
    """{name: PgColumn} of a PostgreSQL source ({} for any other)."""
    return {c.name: c for c in native.columns} if native is not None and native.dialect == "postgres" else {}


def negotiate(native: NativeExport | None, pairs: Sequence[tuple[str, str]], targets: Sequence[PgColumn],
              copy_path: str) -> tuple[str | None, str]:
    """(the agreed format or None, why): pass the stream through when both ends are PostgreSQL with
    identical column types; ``copy_path=passthrough`` refuses anything else, ``arrow`` never asks."""
    if copy_path == "arrow":
        return None, "arrow: copy_path=arrow"
    src = source_columns(native)
    why = None
    if not src or native is None:
        why = "the source is not PostgreSQL"
    elif native.format != FORMAT:
        why = native.why_not or f"the source streams no {FORMAT}"
    else:
        for (s, _), t in zip(pairs, targets):
            sc = src[s]
            same = sc.type_oid == t.type_oid and sc.type_oid < 16384 and sc.typtype == "b"
            same = same or (sc.typtype == "e" and t.typtype == "e" and sc.typname == t.typname)
            if not same:
                why = f"column {s}: {sc.type_sql} -> {t.type_sql} differ"
                break
    if why is None:
        differ = [f"{s} {src[s].type_sql} -> {t.type_sql}" for (s, _), t in zip(pairs, targets) if src[s].type_sql != t.type_sql]
        if differ:  # same types, other typmods: PostgreSQL checks each value against the target's
            return FORMAT, ("pass-through: PostgreSQL binary COPY stream, same column types; typmods differ "
                            f"(each value checked by PostgreSQL): {', '.join(differ)}")
        return FORMAT, "pass-through: PostgreSQL binary COPY stream, identical column types"
    if copy_path == "passthrough":
        raise SchemaError(f"copy_path=passthrough is not possible: {why}", hint="use sink.copy_path=auto or arrow")
    return None, f"arrow: {why}"


class _CopyOut:
    """psql's stdout; at its end, psql's exit status and the binary COPY trailer are checked."""

    def __init__(self, proc: subprocess.Popen[bytes], config: PgConnConfig, key: str) -> None:
        self.proc, self.config, self.key = proc, config, key
        self.tail = b""

    def read(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        chunk = self.proc.stdout.read(size)
        if chunk:
            self.tail = (self.tail + chunk[-2:])[-2:]  # not tail + chunk, which copied every 1 MiB chunk once more
            return chunk
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        if self.proc.wait() != 0 or self.tail != b"\xff\xff":  # a stream cut short has no trailer
            msg = self.config.scrub(err.strip().splitlines()[-1] if err.strip() else f"psql exited {self.proc.returncode}")
            raise TransferError(f"postgres source {self.config.where()}: reading {self.key}: {msg}",
                                partition=self.key, retriable="connection" in msg or "terminat" in msg)
        return b""


@contextlib.contextmanager
def export(config: PgConnConfig, select_sql: str, begin_sql: Sequence[str], key: str) -> Iterator[NativeStream]:
    """A partition as PostgreSQL's binary COPY stream, read by psql in the job's snapshot."""
    args = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1"]
    for stmt in [*begin_sql, f"COPY ({select_sql}) TO STDOUT (FORMAT binary)", "COMMIT"]:
        args += ["-c", stmt]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=config.subprocess_env())
    _widen(proc.stdout)
    try:
        yield _CopyOut(proc, config, key)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def relay(con: Any, table: str, columns: Sequence[str], stream: NativeStream, key: str, freeze: bool = False) -> tuple[int, int]:
    """Forward ``stream`` into ``COPY table FROM STDIN`` on ``con`` (in its transaction): (rows, bytes).
    ``freeze``: the table was truncated in this transaction, so its rows are written frozen."""
    nbytes = 0
    options = "FORMAT binary, FREEZE" if freeze else "FORMAT binary"
    with con.cursor() as cur:
        with cur.copy(f"COPY {table} ({', '.join(ident(c) for c in columns)}) FROM STDIN ({options})") as cp:
            while chunk := stream.read(CHUNK):
                if cancel_requested():
                    raise Cancelled(f"partition {key}: cancelled")
                cp.write(chunk)
                nbytes += len(chunk)
        return cur.rowcount, nbytes
