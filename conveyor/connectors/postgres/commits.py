"""Exactly once on PostgreSQL: commit markers, the driver's guard lock, and staging tables.

**Commit markers.** Every partition's transaction also inserts a row (load id, target,
partition, rows) into ``<schema>._conveyor_commits``. The marker commits with the rows or not at
all, so the target itself says which partitions are in it, whatever died when: a write whose
marker exists writes nothing, two attempts racing for one partition collide on the marker's
primary key (the second rolls back), and ``resume`` asks the target, not a manifest that a killed
driver could not update.

**The guard.** The driver holds a session advisory lock named after its run id on the target
server for the whole run (:func:`hold_guard`). A task checks, just before it commits, that the
lock is still held: a task whose driver died (SIGKILL, OOM, lost machine) rolls back instead of
committing behind a driver that can no longer account for it.

**Staging tables** are named ``_conveyor_stage_<run id>`` and carry a comment with the run id,
target and start time. One whose run's guard lock is free belongs to a run that is gone: the next
run into the same target drops it and says so, and ``conveyor clean`` lists or drops them.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres.common import PgConnConfig, connect, ident, literal, sqlstate, translate
from conveyor.core import Expected, WriteStats, cancel_requested, check_partition_rows, check_stored
from conveyor.errors import Cancelled, ConveyorError, TransferError
from conveyor.kit import guard
from conveyor.kit.staged import Stage, stage_label

MARKERS = "_conveyor_commits"
STAGE_PREFIX = "_conveyor_stage_"

def guard_key_sql(run_id_sql: str) -> str:
    """The advisory lock key (bigint) of a run, from an SQL expression giving its run id."""
    return f"hashtextextended('conveyor:' || {run_id_sql}, 0)"


def stop_key_sql(run_id_sql: str) -> str:
    """The advisory lock key a stopping run's driver takes: no partition commits after it."""
    return f"hashtextextended('conveyor-stop:' || {run_id_sql}, 0)"


class _Guard(guard.RunGuard):
    """The runs' session advisory locks; on Ctrl-C their stop locks, which the tasks' last check before
    COMMIT takes shared: a commit is either before the stop (and waited for) or refused."""

    def __init__(self, conf: PgConnConfig, run_id: str) -> None:
        self.conf = conf
        super().__init__(run_id)

    def _connect(self) -> Any:
        return connect(self.conf, autocommit=True)

    def _take(self, con: Any, run_id: str) -> None:
        con.execute(f"SELECT pg_advisory_lock({guard_key_sql('%s')})", [run_id])
        if self.stopping:
            self._mark_stopping(con, run_id)

    def _mark_stopping(self, con: Any, run_id: str) -> None:
        con.execute(f"SELECT pg_advisory_lock({stop_key_sql('%s')})", [run_id])

    def _give_up(self, con: Any, run_id: str) -> None:
        con.execute(f"SELECT pg_advisory_unlock({guard_key_sql('%s')})", [run_id])
        if self.stopping:
            con.execute(f"SELECT pg_advisory_unlock({stop_key_sql('%s')})", [run_id])


def hold_guard(conf: PgConnConfig, run_id: str) -> None:
    """Take the run's advisory lock on a connection kept (and kept locked) until :func:`release_guard`;
    the runs of one process at one server share it (a job over many tables holds a run id per table)."""
    guard.hold(run_id, lambda: _Guard(conf, run_id), share=("postgres", conf.host, conf.port, conf.dbname, conf.user,
                                                                  tuple(sorted((conf.options or {}).items()))))


release_guard = guard.release


def driver_state_sql(run_id: str) -> str:
    """(stopping, alive): whether the run's driver holds its stop lock (Ctrl-C) and its guard, each seen
    as a shared try-lock failing against the driver's exclusive one; one round trip before COMMIT."""
    return (f"SELECT NOT pg_try_advisory_xact_lock_shared({stop_key_sql(literal(run_id))}), "
            f"NOT pg_try_advisory_xact_lock_shared({guard_key_sql(literal(run_id))})")


def _exists(con: Any, schema: str, table: str) -> bool:
    return con.execute("SELECT to_regclass(%s)", [ident(schema, table)]).fetchone()[0] is not None


def _create_shared(con: Any, schema: str, table: str, columns: str) -> None:
    """CREATE TABLE IF NOT EXISTS of a table every run into ``schema`` shares, one run at a time: two
    runs creating it at once (two jobs started together) made PostgreSQL fail one of them with a
    duplicate pg_type key ('type ... already exists'), which IF NOT EXISTS does not cover. Runs take a
    transaction-level advisory lock on the table's name first; the second then finds it made."""
    if _exists(con, schema, table):
        return
    with con.transaction():
        con.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"conveyor-create:{schema}.{table}"])
        con.execute(f"CREATE TABLE IF NOT EXISTS {ident(schema, table)} ({columns})")


def ensure_markers(con: Any, schema: str) -> None:
    _create_shared(con, schema, MARKERS, "load_id text NOT NULL, target text NOT NULL, partition text NOT NULL, rows bigint NOT NULL, "
                                         "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (load_id, target, partition)")


def marker_insert_sql(schema: str, load_id: str, target: str, partition: str, rows: int) -> str:
    return (f"INSERT INTO {ident(schema, MARKERS)} (load_id, target, partition, rows) VALUES "
            f"({literal(load_id)}, {literal(target)}, {literal(partition)}, {int(rows)})")


def marker_rows_sql(schema: str, load_id: str, target: str, partition: str) -> str:
    return (f"SELECT rows FROM {ident(schema, MARKERS)} WHERE load_id = {literal(load_id)} "
            f"AND target = {literal(target)} AND partition = {literal(partition)}")


def committed(con: Any, schema: str, load_id: str, target: str) -> dict[str, int]:
    if not _exists(con, schema, MARKERS):
        return {}
    rows = con.execute(f"SELECT partition, rows FROM {ident(schema, MARKERS)} WHERE load_id = %s AND target = %s",
                       [load_id, target]).fetchall()
    return {p: int(n) for p, n in rows}


def forget(con: Any, schema: str, load_id: str, target: str) -> None:
    """Drop a load's markers (a staged load made visible, or dropped, no longer needs them)."""
    if _exists(con, schema, MARKERS):
        con.execute(f"DELETE FROM {ident(schema, MARKERS)} WHERE load_id = %s AND target = %s", [load_id, target])


# --- incremental cursors -------------------------------------------------------------------------

CURSORS = "_conveyor_cursors"
#: what clears a cursor's pending window
_NO_PENDING = "pending_load = NULL, pending_mode = NULL, pending_low = NULL, pending_high = NULL, pending_kind = NULL"


def ensure_cursors(con: Any, schema: str) -> None:
    _create_shared(con, schema, CURSORS, "target text NOT NULL, cursor text NOT NULL, value text, kind text, pending_load text, "
                                         "pending_mode text, pending_low text, pending_high text, pending_kind text, "
                                         "updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, cursor)")


def cursor_row(con: Any, schema: str, target: str, column: str) -> tuple[Any, ...] | None:
    """(value, kind, pending_load, pending_mode, pending_low, pending_high, pending_kind) or None."""
    if not _exists(con, schema, CURSORS):
        return None
    return con.execute(f"SELECT value, kind, pending_load, pending_mode, pending_low, pending_high, pending_kind "
                       f"FROM {ident(schema, CURSORS)} WHERE target = %s AND cursor = %s", [target, column]).fetchone()


def record_pending(con: Any, schema: str, target: str, column: str, load_id: str, mode: str, low: tuple[str, str] | None,
                   high: tuple[str, str] | None) -> None:
    """The window a load starts on (committed at once): a run that stops half way is known to the next."""
    kind = (high or low or ("", ""))[1] or None
    con.execute(
        f"INSERT INTO {ident(schema, CURSORS)} AS c (target, cursor, pending_load, pending_mode, pending_low, pending_high, pending_kind) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (target, cursor) DO UPDATE SET pending_load = excluded.pending_load, "
        "pending_mode = excluded.pending_mode, pending_low = excluded.pending_low, pending_high = excluded.pending_high, "
        "pending_kind = excluded.pending_kind, updated_at = now()",
        [target, column, load_id, mode, low[0] if low else None, high[0] if high else None, kind])


def commit_cursor_sql(schema: str, target: str, column: str, load_id: str, value: tuple[str, str] | None) -> str:
    """The statement, run in the transaction that makes the load visible, that moves the cursor to
    ``value`` (kept where None: nothing new) and clears the load's pending window."""
    new = f"{literal(value[0])}, kind = {literal(value[1])}" if value else "value, kind = kind"
    return (f"UPDATE {ident(schema, CURSORS)} SET value = {new}, {_NO_PENDING}, updated_at = now() WHERE target = {literal(target)} "
            f"AND cursor = {literal(column)} AND pending_load = {literal(load_id)}")


def clear_pending(con: Any, schema: str, target: str, column: str, load_id: str) -> None:
    if _exists(con, schema, CURSORS):
        con.execute(f"UPDATE {ident(schema, CURSORS)} SET {_NO_PENDING} WHERE target = %s AND cursor = %s AND pending_load = %s",
                    [target, column, load_id])


# --- staging tables -----------------------------------------------------------------------------


def stage_name(run_id: str) -> str:
    return f"{STAGE_PREFIX}{run_id}"


def label_stage(con: Any, schema: str, run_id: str, target: str) -> None:
    con.execute(f"COMMENT ON TABLE {ident(schema, stage_name(run_id))} IS {literal(stage_label(run_id, target))}")


def stages(con: Any, schema: str | None = None, target: str | None = None) -> list[Stage]:
    """Conveyor's staging tables (in one schema, or all; of one target, or of any), each with whether its run
    still holds its guard: a shared try-lock on each run's guard key, which fails against the driver's exclusive
    one and, where it succeeds, ends with the statement's transaction (one query, however many stages). ``target``:
    only stages whose label names it (a job over 200 tables prepares each beside the others' 199 stages)."""
    needle = None if target is None else '"target": ' + json.dumps(target)  # as stage_label writes it
    rows = con.execute(
        "SELECT n.nspname, c.relname, obj_description(c.oid, 'pg_class'), pg_total_relation_size(c.oid), "
        f"NOT pg_try_advisory_xact_lock_shared({guard_key_sql(f'substr(c.relname, {len(STAGE_PREFIX) + 1})')}) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND c.relname LIKE %s AND (%s::text IS NULL OR n.nspname = %s) "
        "AND (%s::text IS NULL OR strpos(obj_description(c.oid, 'pg_class'), %s) > 0) ORDER BY 1, 2",
        [STAGE_PREFIX.replace("_", "\\_") + "%", schema, schema, needle, needle],
    ).fetchall()
    found = [Stage.read(nsp, name, name[len(STAGE_PREFIX):], comment, int(size or 0), bool(active))
             for nsp, name, comment, size, active in rows]
    return found if target is None else [stage for stage in found if stage.target == target]


def stream_slot_sql(target: str, slot: int) -> str:
    """Try to take stream slot ``slot`` of ``target`` for this transaction (sink.max_streams)."""
    return f"SELECT pg_try_advisory_xact_lock(hashtext({literal('conveyor-stream:' + target)}), {int(slot)})"


def drop_stale(con: Any, schema: str, target: str | None = None) -> list[Stage]:
    """Drop the stale staging tables (of one target, or all in the schema); returns what was dropped."""
    dropped = []
    for stage in stages(con, schema, target):
        if stage.active:
            continue
        con.execute(f"DROP TABLE IF EXISTS {ident(stage.schema, stage.name)}")
        dropped.append(stage)
    return dropped


# --- one partition's attempt: what every writer (Arrow or pass-through) does around its COPY ----


@dataclass(frozen=True)
class Once:
    """What keeps a load's partitions exactly once, decided in prepare and shipped to the tasks."""

    config: PgConnConfig
    #: the target's schema, its name as markers record it (schema.table), its table, the staging table
    schema: str
    target: str
    table: str
    stage: str
    load_id: str
    markers: bool
    #: the run id whose guard lock the driver holds ("" : none)
    guard: str
    #: at most this many partitions write into the target at once, whatever the degree (0: no cap)
    max_streams: int = 0
    #: statements run in each partition's transaction before its rows (a load in one transaction:
    #: TRUNCATE, dropping the indexes rebuilt after) and after them (building those indexes again)
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    #: COPY ... FREEZE: the table was truncated in the same transaction, so its rows are written frozen
    freeze: bool = False
    #: the rows the target stored must be the rows sent to it, checked before each commit (off: verify=none)
    check_stored: bool = True


class Attempt:
    """One attempt at one partition, in one transaction (:meth:`run`): skipped if committed
    before, sealed (guard check + marker) just before commit, a failure rolled back and turned
    into the error to raise. Every PostgreSQL writer (ADBC, pgpq, pass-through) runs through it."""

    def __init__(self, once: Once, key: str, expected: Expected | None = None) -> None:
        self.once, self.key, self.expected = once, key, expected
        self.start = time.perf_counter()

    def run(self, conn: Any, execute: Any, fetch: Any, body: Any, cause: Any = None) -> WriteStats:
        """The partition's transaction on ``conn``: ``body()`` writes it and returns (rows the target
        stored, bytes, rows sent to it: None where not known);
        ``execute`` / ``fetch`` run SQL in the same transaction; ``cause()`` is an error a driver may
        have wrapped (the source's or a cast's), raised in its stead. The caller closes ``conn``."""
        try:
            before = self._committed_before(fetch)
            if before is not None:
                conn.rollback()
                return self._skipped(before)
            self._take_stream(fetch)
            for stmt in self.once.before:
                execute(stmt)
            rows, nbytes, sent = body()
            for stmt in self.once.after:
                execute(stmt)
            self._seal(rows, sent, execute, fetch)
            conn.commit()
        except BaseException as exc:
            outcome = self._failed(conn, exc, cause() if cause is not None else None)
            if isinstance(outcome, WriteStats):
                return outcome
            raise outcome from None
        return WriteStats(self.key, rows, nbytes, time.perf_counter() - self.start)

    def _committed_before(self, fetch: Any) -> int | None:
        """Rows of this partition committed under the load id by an earlier attempt or run."""
        o = self.once
        if not o.markers:
            return None
        row = fetch(marker_rows_sql(o.schema, o.load_id, o.target, self.key))
        return None if row is None else int(row[0])

    def _take_stream(self, fetch: Any) -> None:
        """Wait for one of the target's ``max_streams`` slots: a transaction-level advisory lock
        (released by commit or rollback, and by the server when a killed worker's connection ends),
        so every process writing into the target counts, whatever the runtime or degree."""
        o = self.once
        if o.max_streams <= 0:
            return
        wait = 0.02
        while True:
            for slot in range(o.max_streams):
                if fetch(stream_slot_sql(o.target, slot))[0]:
                    return
            if cancel_requested():
                raise Cancelled(f"partition {self.key}: cancelled while waiting for a stream into {o.target}")
            time.sleep(wait)
            wait = min(wait * 2, 0.5)

    def _skipped(self, rows: int) -> WriteStats:
        return WriteStats(self.key, rows, 0, time.perf_counter() - self.start, already_committed=True)

    def _seal(self, rows: int, sent: int | None, execute: Any, fetch: Any) -> None:
        """Just before commit: the target stored what it was sent and the source counted, the driver
        still holds the run, and the marker joins the transaction."""
        o = self.once
        if o.check_stored:
            check_stored(o.target, self.key, sent, rows)
        check_partition_rows(o.target, self.key, self.expected, rows)
        stopping, alive = fetch(driver_state_sql(o.guard)) if o.guard else (False, True)
        if stopping:
            raise Cancelled(f"partition {self.key}: the run is stopping: rolled back instead of committing")
        if not alive:
            # retriable: a target that restarted drops the driver's lock for a moment (it takes it again);
            # a driver that is really gone stays gone, and every retry rolls back the same way
            raise TransferError(f"partition {self.key}: the run's driver is gone: rolled back instead of committing",
                                partition=self.key, retriable=True,
                                hint="resume the run: committed partitions are not loaded again")
        if o.markers:
            execute(marker_insert_sql(o.schema, o.load_id, o.target, self.key, rows))

    def _failed(self, conn: Any, exc: BaseException, cause: BaseException | None = None) -> BaseException | WriteStats:
        """Roll back; the stats of the attempt that won a race for the partition, or the error to raise
        (the original where one is known: a source or cast error the driver only wrapped)."""
        with contextlib.suppress(Exception):
            conn.rollback()
        o = self.once
        if sqlstate(exc) == "23505" and MARKERS in str(exc):  # two attempts: the other one committed first
            con = connect(o.config, autocommit=True)
            try:
                return self._skipped(committed(con, o.schema, o.load_id, o.target).get(self.key, 0))
            finally:
                con.close()
        if cause is not None:
            return cause
        if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
            return exc
        err = translate(exc, o.config, f"writing {self.key} into {o.target}", self.key)
        # the staging table is ours: the user knows the target ('relation "_conveyor_stage_..."')
        err.message = err.message.replace(f'relation "{o.stage}"', f'relation "{o.table}" (staged)')
        return err
