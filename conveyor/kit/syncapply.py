"""The target side of a sync job (``incremental.method=replication``) for SQL sinks (PostgreSQL,
DuckDB, MySQL): the sync's state beside the target, the stage a run's changed rows load into, and
the one transaction that applies them.

A run stages, for every key the source's changes touched, the key and the row it holds at the run's
position (``_conveyor_present`` false where the row is gone). Applying is then set-based and
idempotent: delete every staged key from the target, insert the staged rows that exist, and read
back, in the same transaction, what the target now holds for those keys: each present key once
with the staged values, no absent key left. A trigger or rule that dropped or changed a row fails
the run by name and the target keeps what it had. The position applied is written in that
transaction (``_conveyor_sync``: slot, target, source table, position, the source's columns when the
sync started), so the target says exactly which changes it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import VerificationError

STATE = "_conveyor_sync"
PRESENT = "_conveyor_present"


@dataclass(frozen=True)
class SyncState:
    """What a target holds of a sync: the source position its rows are at, and the source's columns then."""

    position: int
    signature: str
    source: str


@dataclass(frozen=True)
class SyncRecord:
    slot: str
    source: str
    position: int
    signature: str


@dataclass(frozen=True)
class Applied:
    """What one apply did to its target, as the target holds it after (read in its transaction)."""

    keys: int
    #: rows written (the keys' rows that exist at the run's position)
    written: int
    #: target rows removed for good (their key's row is gone at the source)
    deleted: int
    #: the target was emptied first (the source's changes held a TRUNCATE)
    full: bool = False

    def describe(self) -> str:
        if self.full:
            return f"loaded again (the source was truncated): {self.written:,} rows"
        return f"{self.keys:,} changed keys: {self.written:,} rows written, {self.deleted:,} deleted"


class SqlChangeApplier:
    """The sync methods of an SQL sink. The sink gives: ``_sync_connection()`` (a context manager of a
    connection whose ``execute(sql)`` returns a cursor with ``fetchone`` and ``description``),
    ``_qualified(table)``, ``_quote(name)``, ``_sync_target`` (the target's name as the state keeps it),
    ``_stage_sql(stage)`` (the statements that make the stage from the target) and ``_sync_mysql``."""

    _sync_mysql = False
    #: how a run's rows load into the stage: truncate (a stage made from the target by ``_stage_sql``), or replace (the
    #: stage created from the source's columns as the sink creates a table: as the first load created the target)
    _stage_mode = "truncate"

    def _sync_connection(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def _qualified(self, table: str | None = None) -> str:
        raise NotImplementedError

    def _quote(self, name: str) -> str:
        raise NotImplementedError

    @property
    def _sync_target(self) -> str:
        raise NotImplementedError

    def _stage_sql(self, stage: str) -> list[str]:
        raise NotImplementedError

    def _planned(self, con: Any, keys: Sequence[str]) -> list[str]:
        """Statements at the start of the apply's transaction that steer its joins (PostgreSQL: look each staged key
        up by the target's index on the keys, where it has one; a change touches a fraction of the table)."""
        return []

    def _row_differs(self, columns: Sequence[str], quote: Callable[[str], str]) -> str:
        """A condition on a target row ``t`` and its staged row ``s``: their ``columns`` differ as text, in one
        expression where the engine has one (PostgreSQL: the rows' text); empty: column by column."""
        return ""

    def _state_table(self, con: Any) -> str:
        state = self._qualified(STATE)
        con.execute(f"CREATE TABLE IF NOT EXISTS {state} (slot VARCHAR(64) NOT NULL, target VARCHAR(512) NOT NULL, "
                    "source VARCHAR(512), position BIGINT NOT NULL, signature TEXT NOT NULL, PRIMARY KEY (slot, target))")
        return state

    def sync_state(self, slot: str) -> SyncState | None:
        """The position this target's rows are at for ``slot`` (None: no sync has committed into it)."""
        with self._sync_connection() as con:
            row = con.execute(f"SELECT position, signature, source FROM {self._state_table(con)} "
                              f"WHERE slot = '{slot}' AND target = {_text(self._sync_target, self._sync_mysql)}").fetchone()
        return SyncState(int(row[0]), row[1], row[2]) if row else None

    def record_sync(self, record: SyncRecord) -> None:
        """The position of a load that made the target equal its source (a sync's first run)."""
        with self._sync_connection() as con:
            con.execute("BEGIN")
            try:
                self._record(con, record)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def _record(self, con: Any, record: SyncRecord) -> None:
        state = self._state_table(con)
        target, source, signature = (_text(v, self._sync_mysql) for v in (self._sync_target, record.source, record.signature))
        con.execute(f"DELETE FROM {state} WHERE slot = '{record.slot}' AND target = {target}")
        con.execute(f"INSERT INTO {state} (slot, target, source, position, signature) VALUES ('{record.slot}', {target}, {source}, "
                    f"{int(record.position)}, {signature})")

    def forget_sync(self, slot: str) -> list[str]:
        """Remove the sync's state and stage from this target (``conveyor clean --drop``); what was removed."""
        out = []
        with self._sync_connection() as con:
            state = self._state_table(con)
            where = f"slot = '{slot}' AND target = {_text(self._sync_target, self._sync_mysql)}"
            if con.execute(f"SELECT count(*) FROM {state} WHERE {where}").fetchone()[0]:
                con.execute(f"DELETE FROM {state} WHERE {where}")
                out.append(f"sync state of {self._sync_target} ({slot})")
            con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage_name(slot))}")
        return out

    def sync_stage(self, slot: str) -> str:
        """A new, empty stage for ``slot``'s changed rows: the target's columns and ``_conveyor_present``."""
        stage = stage_name(slot)
        with self._sync_connection() as con:
            for sql in self._stage_sql(stage):
                con.execute(sql)
        return stage

    def drop_stage(self, stage: str) -> None:
        with self._sync_connection() as con:
            con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage)}")

    def apply_sync(self, stage: str, keys: Sequence[str], full: bool, record: SyncRecord | None) -> Applied:
        """Apply the staged rows in one transaction (see the module's docstring), recording ``record``
        in it; raises, with the target as it was, where the target did not take them."""
        with self._sync_connection() as con:
            con.execute("BEGIN")
            try:
                for sql in self._planned(con, keys):
                    con.execute(sql)
                applied = _apply(con, self._qualified(), self._qualified(stage), keys, full, self._quote, self._sync_mysql,
                                 self._sync_target, self._row_differs)
                if record is not None:
                    self._record(con, record)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    con.execute("ROLLBACK")
                raise
        return applied


def stage_name(slot: str) -> str:
    return f"_conveyor_sync_stage_{slot[-16:]}"


def _text(value: str, mysql: bool = False) -> str:
    """A string literal (MySQL's default mode reads backslashes as escapes)."""
    return "'" + (value.replace("\\", "\\\\") if mysql else value).replace("'", "''") + "'"


def _apply(con: Any, target: str, stage: str, keys: Sequence[str], full: bool, quote: Callable[[str], str], mysql: bool,
           where: str, row_differs: Callable[[Sequence[str], Callable[[str], str]], str] = lambda cols, quote: "") -> Applied:
    from conveyor.kit.merge import _differs, _ints

    present = f"s.{quote(PRESENT)}"
    columns = [d[0] for d in con.execute(f"SELECT * FROM {stage} LIMIT 0").description if d[0] != PRESENT]
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    staged, existing = _ints(con, f"SELECT count(*), sum(CASE WHEN {present} THEN 1 ELSE 0 END) FROM {stage} AS s")
    gone = (_ints(con, f"SELECT count(*) FROM {target}")[0] if full else
            _ints(con, f"SELECT count(*) FROM {target} AS t JOIN {stage} AS s ON {on} WHERE NOT {present}")[0])
    if full:
        con.execute(f"DELETE FROM {target}")
    elif mysql:
        con.execute(f"DELETE t FROM {target} AS t JOIN {stage} AS s ON {on}")
    else:
        # a join, not EXISTS: the staged keys are distinct, and the target's rows are then found in the stage's key order
        con.execute(f"DELETE FROM {target} AS t USING {stage} AS s WHERE {on}")
    cols = ", ".join(quote(c) for c in columns)
    order = ", ".join(f"s.{quote(k)}" for k in keys)  # in key order: the target's key index grows page by page
    con.execute(f"INSERT INTO {target} ({cols}) SELECT {', '.join(f's.{quote(c)}' for c in columns)} FROM {stage} AS s WHERE {present} "
                f"ORDER BY {order}")
    # what the target holds now, in this transaction
    compared = [c for c in columns if c not in keys]
    differs = row_differs(compared, quote) or " OR ".join(_differs(f"t.{quote(c)}", f"s.{quote(c)}", mysql) for c in compared) or "1 = 0"
    held, changed, kept = _ints(con, f"SELECT sum(CASE WHEN {present} THEN 1 ELSE 0 END), "
                                     f"sum(CASE WHEN {present} AND ({differs}) THEN 1 ELSE 0 END), "
                                     f"sum(CASE WHEN {present} THEN 0 ELSE 1 END) FROM {target} AS t JOIN {stage} AS s ON {on}")
    total = _ints(con, f"SELECT count(*) FROM {target}")[0] if full else existing
    if held != existing or total != existing:
        raise VerificationError(f"verification failed for {where}: after applying the changes it holds {held:,} of the {existing:,} "
                                "rows written (a trigger or rule on it skipped rows without an error): rolled back",
                                hint="the target was not changed; see its triggers and rules")
    if changed:
        raise VerificationError(f"verification failed for {where}: {changed:,} of the rows written do not hold the source's values "
                                "(a trigger or rule on it changed them): rolled back", hint="the target was not changed; see its triggers and rules")
    if kept:
        raise VerificationError(f"verification failed for {where}: {kept:,} rows deleted at the source are still in it after the "
                                "delete (a rule on it kept them): rolled back", hint="the target was not changed; see its rules")
    return Applied(keys=staged, written=existing, deleted=gone, full=full)

