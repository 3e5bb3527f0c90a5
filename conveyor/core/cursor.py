"""Incremental loads: the job's ``incremental`` settings (a cursor column, or a sync job's replication),
the window of rows a cursor run reads (``low < column <= high``), the cursor value as a sink keeps it,
and the sources that read only a window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class IncrementalConfig:
    #: a timestamp, date or increasing integer column: each run reads only rows past the value the
    #: last successful run committed (kept in the target), up to the source's maximum in the job's
    #: snapshot; the first run loads every row with a cursor. null: every run reads every row
    cursor: str | None = None
    #: cursor (the column above), or replication: a PostgreSQL source kept in sync by logical decoding (its first
    #: run loads the tables, each later one applies the inserts, updates and deletes since the last)
    method: str = "cursor"
    #: replication: the slot and publication's name (null: conveyor_<hash of source and target>)
    slot: str | None = None
    #: replication: keep applying every this many seconds until Ctrl-C / SIGTERM (0: one run)
    follow: float = 0
    #: replication: the changed keys one transaction applies at most (a larger change set takes several)
    chunk_keys: int = 1_000_000
    #: replication: how long a run waits for the source's open transactions to end before its snapshot can begin
    #: (each wait is said: which transaction, since when), in seconds; 0: as long as it takes
    wait_timeout: float = 0


@dataclass(frozen=True)
class CursorWindow:
    """An incremental load's rows: ``low < column <= high``. ``low`` None: from the first row (the
    first run); ``high`` None: the source had no row with a cursor (nothing to read)."""

    column: str
    low: Any = None
    high: Any = None

    @property
    def empty(self) -> bool:
        return self.high is None or (self.low is not None and self.high <= self.low)

    def describe(self) -> str:
        if self.high is None:
            return f"{self.column}: the source has no row with a {self.column} value: nothing to read"
        if self.low is None:
            return f"{self.column} <= {self.high!s} (first run: every row with a {self.column})"
        if self.empty:
            return f"{self.column} > {self.low!s}: no new rows since the last run"
        return f"{self.column} > {self.low!s} AND {self.column} <= {self.high!s}"


def encode_cursor(value: Any) -> tuple[str, str]:
    """A cursor value as (text, kind) for the state a sink keeps; :func:`decode_cursor` reverses it."""
    import datetime as dt
    import decimal

    if isinstance(value, bool):
        raise TypeError("a boolean cannot be a cursor")
    if isinstance(value, int):
        return str(value), "integer"
    if isinstance(value, decimal.Decimal):
        return str(value), "decimal"
    if isinstance(value, dt.datetime):
        return value.isoformat(), "timestamp"
    if isinstance(value, dt.date):
        return value.isoformat(), "date"
    raise TypeError(f"a {type(value).__name__} cannot be a cursor (a timestamp, a date or an increasing integer can)")


def decode_cursor(text: str, kind: str) -> Any:
    import datetime as dt
    import decimal

    return {"integer": int, "decimal": decimal.Decimal, "timestamp": dt.datetime.fromisoformat,
            "date": dt.date.fromisoformat}[kind](text)


@runtime_checkable
class SupportsWindow(Protocol):
    """A source that reads only an incremental window: the cursor's maximum in the job's snapshot,
    and a copy of itself whose partitions, counts and checksums all keep to ``low < column <= high``."""

    def cursor_max(self, column: str) -> Any: ...

    def windowed(self, window: CursorWindow) -> Any: ...


__all__ = [
    "IncrementalConfig",
    "CursorWindow",
    "encode_cursor",
    "decode_cursor",
    "SupportsWindow",
]
