"""DuckDB's connections, one thread at a time opening and closing a file, and its identifiers."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from conveyor.errors import ConnectError


def qident(name: str) -> str:
    """A DuckDB identifier, double-quoted with embedded quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    return f"{qident(schema)}.{qident(table)}"


#: DuckDB's connect and close, one thread at a time in a process: each partition's write opens the
#: file and closes it after its commit, and a close that shut the file's database down (its last
#: connection) while another thread opened the same file failed that open ("Unique file handle
#: conflict: ... already attached"; ~3% of opens with two threads here)
_OPEN_CLOSE = threading.Lock()


def connect(database: str, read_only: bool = False) -> Any:
    import duckdb

    try:
        with _OPEN_CLOSE:
            return duckdb.connect(database, read_only=read_only)
    except duckdb.Error as exc:
        raise ConnectError(f"duckdb database {database!r}: {str(exc).splitlines()[0]}",
                           hint="check the path and that no other process holds it open for writing") from None


def new_file(database: str) -> bool:
    """Whether connecting to ``database`` makes its file (an in-memory database has none)."""
    return database not in ("", ":memory:") and not database.startswith(":memory:") and not os.path.exists(database)


def remove_file(database: str) -> None:
    """A database file a failed run made, and its write-ahead log, removed."""
    for path in (database, f"{database}.wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def close(con: Any) -> None:
    with _OPEN_CLOSE:
        con.close()
