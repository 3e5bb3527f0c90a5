"""What a DuckDB target keeps of its loads, in the database file beside the target: commit markers
and incremental cursors, as a PostgreSQL target keeps them (``conveyor/connectors/postgres/commits.py``).

``<schema>._conveyor_commits``: one row per partition committed, inserted in the partition's own
transaction, so a retried or resumed partition that had committed writes nothing and ``resume``
asks the target. ``<schema>._conveyor_cursors``: per target and cursor column, the value the last
finished load committed and the window of a load that started and has not finished. DuckDB's
sink writes from the driver's process only, so no task can outlive its driver: no guard is kept.
"""

from __future__ import annotations

import threading
from typing import Any

from conveyor.core import CursorState, CursorWindow, decode_cursor, encode_cursor

MARKERS = "_conveyor_commits"
CURSORS = "_conveyor_cursors"


def _q(schema: str, table: str) -> str:
    return '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'


#: one thread at a time makes the state tables: the tables of a job over several tables are prepared in threads, and two
#: CREATE TABLE IF NOT EXISTS of one table at once conflict in DuckDB ("Catalog write-write conflict on create")
MAKING = threading.Lock()


def ensure(con: Any, schema: str, markers: bool, cursors: bool) -> None:
    """The tables a load keeps its state in (only those it uses)."""
    with MAKING:
        _ensure(con, schema, markers, cursors)


def _ensure(con: Any, schema: str, markers: bool, cursors: bool) -> None:
    if markers:
        con.execute(f"CREATE TABLE IF NOT EXISTS {_q(schema, MARKERS)} (load_id VARCHAR NOT NULL, target VARCHAR NOT NULL, "
                    "part VARCHAR NOT NULL, committed_rows BIGINT NOT NULL, committed_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                    "PRIMARY KEY (load_id, target, part))")
    if not cursors:
        return
    con.execute(f"CREATE TABLE IF NOT EXISTS {_q(schema, CURSORS)} (target VARCHAR NOT NULL, cursor VARCHAR NOT NULL, value VARCHAR, "
                "kind VARCHAR, pending_load VARCHAR, pending_mode VARCHAR, pending_low VARCHAR, pending_high VARCHAR, "
                "pending_kind VARCHAR, PRIMARY KEY (target, cursor))")


def _exists(con: Any, schema: str, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?", [schema, table]).fetchone()[0])


def committed_rows(con: Any, schema: str, load_id: str, target: str, part: str) -> int | None:
    row = con.execute(f"SELECT committed_rows FROM {_q(schema, MARKERS)} WHERE load_id = ? AND target = ? AND part = ?",
                      [load_id, target, part]).fetchone()
    return None if row is None else int(row[0])


def mark(con: Any, schema: str, load_id: str, target: str, part: str, rows: int) -> None:
    con.execute(f"INSERT INTO {_q(schema, MARKERS)} (load_id, target, part, committed_rows) VALUES (?, ?, ?, ?)",
                [load_id, target, part, rows])


def committed(con: Any, schema: str, load_id: str, target: str) -> dict[str, int]:
    if not _exists(con, schema, MARKERS):
        return {}
    rows = con.execute(f"SELECT part, committed_rows FROM {_q(schema, MARKERS)} WHERE load_id = ? AND target = ?", [load_id, target])
    return {p: int(n) for p, n in rows.fetchall()}


def forget(con: Any, schema: str, load_id: str, target: str) -> None:
    """A staged load made visible, or dropped, no longer needs its markers."""
    if _exists(con, schema, MARKERS):
        con.execute(f"DELETE FROM {_q(schema, MARKERS)} WHERE load_id = ? AND target = ?", [load_id, target])


def cursor_state(con: Any, schema: str, target: str, column: str) -> CursorState:
    if not _exists(con, schema, CURSORS):
        return CursorState()
    row = con.execute(f"SELECT value, kind, pending_load, pending_mode, pending_low, pending_high, pending_kind FROM {_q(schema, CURSORS)} "
                      "WHERE target = ? AND cursor = ?", [target, column]).fetchone()
    if row is None:
        return CursorState()
    value, kind, load, mode, low, high, pkind = row
    state = CursorState(value=decode_cursor(value, kind) if value is not None else None)
    if not load:
        return state
    window = CursorWindow(column, decode_cursor(low, pkind) if low is not None else None, decode_cursor(high, pkind) if high is not None else None)
    done = len(committed(con, schema, load, target)) if mode == "append" else 0
    return CursorState(value=state.value, pending=window, pending_load=load, pending_mode=mode, pending_committed=done)


def record_pending(con: Any, schema: str, target: str, window: CursorWindow, load_id: str, mode: str) -> None:
    """The window a load starts on (committed at once): a run that stops half way is known to the next."""
    low = encode_cursor(window.low) if window.low is not None else None
    high = encode_cursor(window.high) if window.high is not None else None
    kind = (high or low or ("", ""))[1] or None
    con.execute(f"INSERT INTO {_q(schema, CURSORS)} (target, cursor, pending_load, pending_mode, pending_low, pending_high, pending_kind) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (target, cursor) DO UPDATE SET pending_load = excluded.pending_load, "
                "pending_mode = excluded.pending_mode, pending_low = excluded.pending_low, pending_high = excluded.pending_high, "
                "pending_kind = excluded.pending_kind",
                [target, window.column, load_id, mode, low[0] if low else None, high[0] if high else None, kind])


def commit_cursor(con: Any, schema: str, target: str, window: CursorWindow, load_id: str) -> None:
    """In the transaction that makes the load visible: the window's upper end becomes the cursor (kept
    where the window was empty), and the load's window is no longer pending."""
    value = None if window.empty else encode_cursor(window.high)
    keep = "value = ?, kind = ?," if value else ""
    con.execute(f"UPDATE {_q(schema, CURSORS)} SET {keep} pending_load = NULL, pending_mode = NULL, pending_low = NULL, "
                "pending_high = NULL, pending_kind = NULL WHERE target = ? AND cursor = ? AND pending_load = ?",
                [*(value or ()), target, window.column, load_id])


def clear_pending(con: Any, schema: str, target: str, column: str, load_id: str) -> None:
    if _exists(con, schema, CURSORS):
        con.execute(f"UPDATE {_q(schema, CURSORS)} SET pending_load = NULL, pending_mode = NULL, pending_low = NULL, pending_high = NULL, "
                    "pending_kind = NULL WHERE target = ? AND cursor = ? AND pending_load = ?", [target, column, load_id])
