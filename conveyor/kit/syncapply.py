"""The target side of a sync job (``incremental.method=replication``) for SQL sinks (PostgreSQL,
DuckDB, MySQL): the sync's state beside the target, the stage a run's changed rows load into, and
the one transaction that applies them.

A run stages, for every key the source's changes touched, the key and the row it holds at the run's
position (``_conveyor_present`` false where the row is gone). Applying is then set-based and
idempotent (:func:`apply_changes`): the keys whose rows exist at both ends are updated, the rows that
are new inserted, the keys gone at the source deleted, in an order the foreign keys between the
synced tables accept, every table in one transaction. What the targets then hold is read back in it:
each present key once with the staged values, no absent key left, and no row inserted, updated or
deleted beyond the changes (a trigger, rule or foreign key action of the target that touched other
rows). Any of them fails the run by name and the targets keep what they had. The position applied is
written in that transaction (``_conveyor_sync``: slot, target, source table, position, the source's
columns when the sync started), so the target says exactly which changes it holds; it is read (and
locked, where the engine locks rows) first, so a second run of the job applying at once is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.core.changes import Applied, Change, SyncRecord, SyncState
from conveyor.errors import ConveyorError, VerificationError, first_line

STATE = "_conveyor_sync"
PRESENT = "_conveyor_present"


class SqlChangeApplier:
    """:class:`~conveyor.core.changes.ChangeApplier` for an SQL sink. The sink gives: ``_sync_connection()`` (a context
    manager of a connection whose ``execute(sql)`` returns a cursor with ``fetchone`` and ``description``),
    ``_qualified(table)``, ``_quote(name)``, ``_sync_target`` (the target's name as the state keeps it),
    ``_stage_sql(stage)`` (the statements that make the stage from the target), ``config`` (a dataclass with ``table``)
    and ``_sync_mysql``."""

    _sync_mysql = False
    #: how a run's rows load into the stage: truncate (a stage made from the target by ``_stage_sql``), or replace (the
    #: stage created from the source's columns as the sink creates a table: as the first load created the target)
    stage_load_mode = "truncate"

    @property
    def sync_target(self) -> str:
        return self._sync_target

    def stage_sink(self, stage: str, options: Any) -> Any:
        import dataclasses

        return type(self)(dataclasses.replace(self.config, table=stage), options)  # type: ignore[call-arg, attr-defined]

    def apply_changes(self, changes: Sequence[Change]) -> list[Applied]:
        return apply_changes(changes)

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
            if self._state_missing(con):  # nothing synced yet (and no table made by a look: a migration's target stays empty)
                return None
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
            con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage_name(slot, self._sync_target))}")
        return out

    def sync_stage(self, slot: str) -> str:
        """A new, empty stage for ``slot``'s changed rows of this target: the target's columns and ``_conveyor_present``."""
        stage = stage_name(slot, self._sync_target)
        with self._sync_connection() as con:
            for sql in self._stage_sql(stage):
                con.execute(sql)
        return stage

    def drop_stage(self, stage: str) -> None:
        with self._sync_connection() as con:
            con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage)}")


    # --- what differs by engine -------------------------------------------------------------------

    def _held_position(self, con: Any, slot: str) -> int | None:
        """The position the state row of ``slot`` holds, locked until the transaction ends where the engine locks rows."""
        row = con.execute(f"SELECT position FROM {self._qualified(STATE)} WHERE slot = '{slot}' AND "
                          f"target = {_text(self._sync_target, self._sync_mysql)}{self._for_update}").fetchone()
        return int(row[0]) if row else None

    _for_update = " FOR UPDATE"
    #: whether an UPDATE's and a DELETE's own row counts are the rows they matched (MySQL's UPDATE counts the rows it changed)
    _rows_counted = True

    def _rowcount(self, cursor: Any) -> int:
        return int(cursor.rowcount)

    def _conflict(self, exc: Exception) -> bool:
        """Whether ``exc`` is the engine's refusal of a transaction that met another's writes (an engine without row
        locks: two applies at once): the apply is then refused as one that another run overtook."""
        return False

    def _effects(self, con: Any) -> tuple[int, int, int] | None:
        """The rows this transaction inserted, updated and deleted in the target so far, as the engine counts them
        (triggers' and foreign key actions' changes included); None where the engine does not count them."""
        return None

    def _reads_back(self, con: Any) -> bool:
        """Whether the apply reads the target's rows back against the stage (each present key once with the staged values,
        no gone key left); False only where nothing on the target can skip or change a row (no trigger, no rule) and
        :meth:`_effects` counts what the transaction did."""
        return True

    #: the clause an INSERT of the source's rows takes to write identity columns' values (PostgreSQL: OVERRIDING SYSTEM VALUE)
    _overriding = ""
    #: whether an update writes the key columns too (an engine whose update of a key column in place is an ordinary update)
    _sets_keys = False

    def _unwritable(self, con: Any) -> set[str]:
        """The target's columns an UPDATE cannot write (PostgreSQL: identity columns GENERATED ALWAYS)."""
        return set()

    def _computed(self, con: Any) -> set[str]:
        """The target's columns it computes itself (generated columns), which an apply leaves to it."""
        return set()

    def _state_missing(self, con: Any) -> bool:
        """Whether the target's sync state table is not there (False where the engine cannot tell cheaply: it is made)."""
        return False

    def _deferred(self) -> list[str]:
        """Statements at the start of the apply that defer the constraints that can be deferred (checked at its commit)."""
        return []

    def _outside_possible(self, con: Any) -> bool:
        """Whether a trigger or a foreign key action could change this target's rows beyond the statements' own
        (then a count before and after stands in where :meth:`_effects` is None)."""
        return False


def stage_name(slot: str, target: str) -> str:
    """The stage of one target of one sync job: a name no other job or target shares (a hash of both)."""
    return "_conveyor_sync_stage_" + hashlib.sha1(f"{slot}\n{target}".encode()).hexdigest()[:20]


def _text(value: str, mysql: bool = False) -> str:
    """A string literal (MySQL's default mode reads backslashes as escapes)."""
    return "'" + (value.replace("\\", "\\\\") if mysql else value).replace("'", "''") + "'"


@dataclass
class _Table:
    change: Change
    target: str
    stage: str
    columns: list[str]
    on: str
    staged: int = 0
    existing: int = 0
    #: target rows of present keys (updated) and of gone keys (deleted): None until the statement's own count says
    matched: int | None = 0
    gone: int | None = 0
    before: tuple[int, int, int] | None = None
    count: int | None = None
    #: key columns an update may write (the sink's ``_sets_keys``, less those the target writes itself: identity ALWAYS)
    written_keys: tuple[str, ...] = ()


def apply_changes(changes: Sequence[Change]) -> list[Applied]:
    """Apply the staged rows of every table in ``changes`` (one target database) in one transaction, and record each
    table's position in it; raises, with every target as it was, where a target did not take them.

    Each change arrives as the source made it: a key whose row exists at both ends is UPDATEd (what the target's
    triggers and foreign key actions then see), a key gone at the source is DELETEd, a new one INSERTed. ``changes``
    come parents first; a table other synced tables refer to deletes after every table's inserts and updates, the
    others before theirs (a unique value a deleted row held can then be taken by an inserted one). Every table's
    state must still hold the position the run started from (a second run of the job applied meanwhile: refused). What
    the targets hold afterwards is read back in the transaction: each present key once with the staged values, no gone
    key left, and no more rows inserted, updated or deleted in any of them than the changes say (a trigger, rule or
    foreign key action that touched other rows is refused by name)."""
    first = changes[0].sink
    mysql = first._sync_mysql
    quote = first._quote
    with first._sync_connection() as con:
        con.execute("BEGIN")
        try:
            tables = [_prepare(con, c, quote) for c in changes]
            for t in tables:
                _check_position(con, t)
            for t in tables:
                t.before = t.change.sink._effects(con)
                if t.before is None and t.change.sink._outside_possible(con):
                    t.count = _count(con, t.target)
            for sql in first._deferred():
                con.execute(sql)
            for t in reversed(tables):  # children first: their deletes, and whole tables emptied
                if t.change.full:
                    con.execute(f"DELETE FROM {t.target}")
                elif not t.change.referenced:
                    _delete(con, t, quote, mysql)
            for t in tables:  # parents first: updates and inserts
                for sql in t.change.sink._planned(con, t.change.keys):
                    con.execute(sql)
                if not t.change.full:
                    _update(con, t, quote, mysql)
                _insert(con, t, quote)
            for t in reversed(tables):
                if t.change.referenced and not t.change.full:
                    _delete(con, t, quote, mysql)
            out = [_verify(con, t, quote, mysql) for t in tables]
            for t in tables:
                if t.change.record is not None:
                    t.change.sink._record(con, t.change.record)
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(Exception):
                con.execute("ROLLBACK")
            if isinstance(exc, Exception) and not isinstance(exc, ConveyorError) and first._conflict(exc):
                raise ConveyorError(f"sync of {', '.join(c.sink.sync_target for c in changes)}: another run of this job applied "
                                    f"changes meanwhile (its transaction met this one's: {first_line(exc)}): this run applied "
                                    "nothing", hint=STALE_HINT) from None
            raise
    return out


def _prepare(con: Any, change: Change, quote: Callable[[str], str]) -> _Table:
    from conveyor.kit.merge import _ints

    sink = change.sink
    if change.stage is None:
        return _Table(change, sink._qualified(), "", [], "")
    target, stage = sink._qualified(), sink._qualified(change.stage)
    present = f"s.{quote(PRESENT)}"
    computed = sink._computed(con)  # the target makes these from its own expression: never written
    columns = [d[0] for d in con.execute(f"SELECT * FROM {stage} LIMIT 0").description if d[0] != PRESENT and d[0] not in computed]
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in change.keys)
    t = _Table(change, target, stage, columns, on)
    if sink._sets_keys:
        fixed = sink._unwritable(con)
        t.written_keys = tuple(k for k in change.keys if k not in fixed)
    t.staged, t.existing = _ints(con, f"SELECT count(*), sum(CASE WHEN {present} THEN 1 ELSE 0 END) FROM {stage} AS s")
    if change.full:
        t.gone = _count(con, target)
    elif sink._rows_counted and any(c not in change.keys for c in columns):
        t.matched = t.gone = None  # the update's and the delete's own counts say (one join of the stage fewer)
    else:
        t.matched, t.gone = _ints(con, f"SELECT sum(CASE WHEN {present} THEN 1 ELSE 0 END), sum(CASE WHEN {present} THEN 0 ELSE 1 END) "
                                       f"FROM {target} AS t JOIN {stage} AS s ON {on}")
    return t


def _count(con: Any, table: str) -> int:
    return int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] or 0)


def _check_position(con: Any, t: _Table) -> None:
    change = t.change
    if change.expect is None or change.record is None:
        return
    held = change.sink._held_position(con, change.record.slot)
    if held != change.expect:
        raise stale(change.sink.sync_target, held, change.expect, "this run applied nothing")


STALE_HINT = "run one sync of a job at a time; run it again to go on from the target's position"


def stale(target: str, held: int | None, expect: int, what: str) -> ConveyorError:
    """A target whose state no longer holds the position the run began from: another run applied meanwhile."""
    now = "no sync state" if held is None else f"the changes up to position {held}"
    return ConveyorError(f"sync of {target}: another run of this job applied changes meanwhile (the target holds {now}, this run "
                         f"began at {expect}): {what}", hint=STALE_HINT)


def _delete(con: Any, t: _Table, quote: Callable[[str], str], mysql: bool) -> None:
    if t.gone == 0 or t.existing == t.staged:
        t.gone = 0 if t.gone is None else t.gone
        return
    present = f"s.{quote(PRESENT)}"
    if mysql:
        done = con.execute(f"DELETE t FROM {t.target} AS t JOIN {t.stage} AS s ON {t.on} WHERE NOT {present}")
    else:
        done = con.execute(f"DELETE FROM {t.target} AS t USING {t.stage} AS s WHERE {t.on} AND NOT {present}")
    if t.gone is None:
        t.gone = t.change.sink._rowcount(done)


def _written(t: _Table) -> list[str]:
    """The columns an update writes: every one but the keys, and the keys too where the sink rewrites them (a key the
    source rewrote as a value its type calls equal, numeric 1.0 as 1.00, is then stored as the source holds it)."""
    return [c for c in t.columns if c not in t.change.keys or c in t.written_keys]


def _update(con: Any, t: _Table, quote: Callable[[str], str], mysql: bool) -> None:
    values = _written(t)
    if t.matched == 0 or not values or not t.existing:
        t.matched = 0 if t.matched is None else t.matched
        return
    present = f"s.{quote(PRESENT)}"
    if mysql:
        sets = ", ".join(f"t.{quote(c)} = s.{quote(c)}" for c in values)
        done = con.execute(f"UPDATE {t.target} AS t JOIN {t.stage} AS s ON {t.on} SET {sets} WHERE {present}")
    else:
        sets = ", ".join(f"{quote(c)} = s.{quote(c)}" for c in values)
        done = con.execute(f"UPDATE {t.target} AS t SET {sets} FROM {t.stage} AS s WHERE {t.on} AND {present}")
    if t.matched is None:
        t.matched = t.change.sink._rowcount(done)


def _insert(con: Any, t: _Table, quote: Callable[[str], str]) -> None:
    new = t.existing - (0 if t.change.full else t.matched)
    if not new:
        return
    cols = ", ".join(quote(c) for c in t.columns)
    keys = t.change.keys
    order = ", ".join(f"s.{quote(k)}" for k in keys)  # in key order: the target's key index grows page by page
    anti = "" if t.change.full else f" AND t.{quote(keys[0])} IS NULL"
    join = "" if t.change.full else f" LEFT JOIN {t.target} AS t ON {t.on}"
    con.execute(f"INSERT INTO {t.target} ({cols}) {t.change.sink._overriding}SELECT {', '.join(f's.{quote(c)}' for c in t.columns)} "
                f"FROM {t.stage} AS s{join} "
                f"WHERE s.{quote(PRESENT)}{anti} ORDER BY {order}")


def _verify(con: Any, t: _Table, quote: Callable[[str], str], mysql: bool) -> Applied:
    """What the target holds now, in this transaction: each present key once with the staged values, no gone key left,
    and the rows inserted, updated and deleted (as the engine counts them, or its count of rows) no more than the changes'."""
    sink, where = t.change.sink, t.change.sink._sync_target
    compared = _written(t)
    if t.change.stage is None:
        held = changed = kept = 0
    elif sink._reads_back(con):
        held, changed, kept = _read_back(con, t, quote, mysql, compared)
    else:  # nothing on the target can skip or change a row: the engine's own counts below say what it did
        held, changed, kept = t.existing, 0, 0
    total = _count(con, t.target) if t.change.full else t.existing
    if held != t.existing or total != t.existing:
        raise VerificationError(f"verification failed for {where}: after applying the changes it holds {held:,} of the {t.existing:,} "
                                "rows written (a trigger or rule on it skipped rows without an error): rolled back",
                                hint="the target was not changed; see its triggers and rules")
    if changed:
        raise VerificationError(f"verification failed for {where}: {changed:,} of the rows written do not hold the source's values "
                                "(a trigger or rule on it changed them): rolled back", hint="the target was not changed; see its triggers and rules")
    if kept:
        raise VerificationError(f"verification failed for {where}: {kept:,} rows deleted at the source are still in it after the "
                                "delete (a rule on it kept them): rolled back", hint="the target was not changed; see its rules")
    inserted = t.existing - (0 if t.change.full else t.matched)
    updated = 0 if t.change.full or not compared else t.matched
    if t.before is not None:
        after = sink._effects(con)
        did = tuple(a - b for a, b in zip(after or t.before, t.before))
        if did != (inserted, updated, t.gone):
            raise VerificationError(f"verification failed for {where}: the changes insert {inserted:,}, update {updated:,} and delete "
                                    f"{t.gone:,} rows of it, and {did[0]:,} were inserted, {did[1]:,} updated and {did[2]:,} deleted "
                                    "(a trigger, rule or foreign key action of the target changed rows the source did not): rolled back",
                                    hint="the target was not changed; drop or change that trigger, rule or ON DELETE/ON UPDATE action "
                                         "on the target (the source's own changes arrive as its inserts, updates and deletes)")
    elif t.count is not None:
        now = _count(con, t.target)
        if now != t.count - t.gone + inserted:
            raise VerificationError(f"verification failed for {where}: it holds {now:,} rows after the apply, and the changes make "
                                    f"{t.count - t.gone + inserted:,} (a trigger or foreign key action of the target changed rows the "
                                    "source did not): rolled back", hint="the target was not changed; drop or change that trigger or "
                                    "ON DELETE/ON UPDATE action on the target")
    return Applied(keys=t.staged, written=t.existing, deleted=t.gone, full=t.change.full)


def _read_back(con: Any, t: _Table, quote: Callable[[str], str], mysql: bool, compared: Sequence[str]) -> tuple[int, ...]:
    """(staged rows present in the target, of them those whose values differ, gone keys still there)."""
    from conveyor.kit.merge import _differs, _ints

    present = f"s.{quote(PRESENT)}"
    differs = (t.change.sink._row_differs(compared, quote) or " OR ".join(_differs(f"t.{quote(c)}", f"s.{quote(c)}", mysql) for c in compared)
               or "1 = 0")
    return _ints(con, f"SELECT sum(CASE WHEN {present} THEN 1 ELSE 0 END), sum(CASE WHEN {present} AND ({differs}) THEN 1 ELSE 0 END), "
                      f"sum(CASE WHEN {present} THEN 0 ELSE 1 END) FROM {t.target} AS t JOIN {t.stage} AS s ON {t.on}")


class ApplyPerTable:
    """:meth:`~conveyor.core.changes.ChangeApplier.apply_changes` for a sink that applies one table in one commit of its
    own (Iceberg, Delta Lake): each table's ``apply_sync(stage, keys, full, record)`` (a table without changes: its
    position alone, after its state was read to hold the position the run began from), which checks again, in the commit
    it makes, that the state it replaces holds ``expect`` (another apply may have committed in between)."""

    @property
    def sync_target(self) -> str:
        return self._sync_target  # type: ignore[attr-defined, no-any-return]

    def apply_changes(self, changes: Sequence[Change]) -> list[Applied]:
        out = []
        for change in changes:
            sink = change.sink
            if change.expect is not None and change.record is not None:
                held = sink.sync_state(change.record.slot)
                if held is None or held.position != change.expect:
                    raise stale(sink.sync_target, None if held is None else held.position, change.expect,
                                "this run applied nothing more to it")
            if change.stage is None:
                if change.record is not None:
                    sink.record_sync(change.record)
                out.append(Applied(keys=0, written=0, deleted=0))
            else:
                out.append(sink.apply_sync(change.stage, change.keys, change.full, change.record, change.expect))
        return out
