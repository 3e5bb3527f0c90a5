"""Exactly once on MySQL / MariaDB: commit markers and the driver's guard, as on PostgreSQL
(``conveyor/connectors/postgres/commits.py``), in InnoDB's terms.

**Commit markers.** Every partition's transaction also inserts a row (load id, target, partition,
rows) into ``_conveyor_commits`` in the target's database. It commits with the rows or not at
all, so the target says which partitions it holds whatever died when: a write whose marker exists
writes nothing, two attempts at one partition collide on the marker's primary key (the second
rolls back), and ``resume`` asks the target, not a manifest a killed driver could not update.

**The guard.** The driver holds ``GET_LOCK('conveyor:<run id>')`` on a connection of its own for
the whole run, and a row of ``_conveyor_runs`` saying ``running``. A partition's last statement
before COMMIT inserts its marker by ``INSERT ... SELECT`` from that row ``LOCK IN SHARE MODE``,
only while the row says running and the lock is held: the shared row lock lasts until the
partition commits. On Ctrl-C the driver updates the row to ``stopping``; that waits for the
partitions already sealed to commit, and every later seal inserts nothing, so its partition rolls
back. A task whose driver died (its lock free) rolls back too.

With ``sink.commit_markers=false`` (no tables may be created) there is no marker, and the stop and
the driver's lock are checked with named locks just before COMMIT: a Ctrl-C landing between that
check and the COMMIT lets that one partition commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.mysql.common import MYSQL_DIALECT, MySqlConnConfig, qident
from conveyor.core import Expected, WriteStats, check_partition_rows
from conveyor.errors import Cancelled, ConveyorError, TransferError
from conveyor.kit import guard
from conveyor.kit.staged import Stage, stage_label

MARKERS = "_conveyor_commits"
RUNS = "_conveyor_runs"
#: a staging table, and a replaced target between its RENAME and its DROP
STAGE_PREFIX, OLD_PREFIX = "_conveyor_stage_", "_conveyor_old_"
_lit = MYSQL_DIALECT.literal


def guard_name(run_id: str) -> str:
    return f"conveyor:{run_id}"[:64]  # MySQL's lock names are at most 64 characters


def stop_name(run_id: str) -> str:
    return f"conveyor-stop:{run_id}"[:64]


def ensure_tables(conf: MySqlConnConfig) -> None:
    conf.run(
        f"CREATE TABLE IF NOT EXISTS {qident(MARKERS)} (load_id VARCHAR(64) NOT NULL, target VARCHAR(255) NOT NULL, "
        "part VARCHAR(255) NOT NULL, committed_rows BIGINT NOT NULL, committed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
        "PRIMARY KEY (load_id, target, part)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        f"CREATE TABLE IF NOT EXISTS {qident(RUNS)} (run_id VARCHAR(64) NOT NULL PRIMARY KEY, state VARCHAR(16) NOT NULL, "
        "started TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        doing=f"creating {MARKERS} (or set sink.commit_markers=false)")


class MyGuard(guard.RunGuard):
    """The runs' named locks, and (with markers) their ``running`` rows; see the module's docstring."""

    def __init__(self, conf: MySqlConnConfig, run_id: str, table: bool) -> None:
        self.conf, self.table = conf, table
        super().__init__(run_id)

    def _execute(self, con: Any, sql: str) -> Any:
        with con.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()

    def _connect(self) -> Any:
        return self.conf.connect(autocommit=True)

    def _take(self, con: Any, run_id: str) -> None:
        if not self._execute(con, f"SELECT GET_LOCK({_lit(guard_name(run_id))}, 10)")[0]:
            raise TransferError(f"{self.conf.where()}: the run's lock {guard_name(run_id)} is held by another session")
        if self.table:
            self._execute(con, f"INSERT INTO {qident(RUNS)} (run_id, state) VALUES ({_lit(run_id)}, 'running') "
                               "ON DUPLICATE KEY UPDATE run_id = run_id")
        if self.stopping:
            self._mark_stopping(con, run_id)

    def _mark_stopping(self, con: Any, run_id: str) -> None:
        self._execute(con, f"SELECT GET_LOCK({_lit(stop_name(run_id))}, 10)")
        if self.table:  # waits for the partitions that sealed (their shared lock on the row) to commit
            self._execute(con, f"UPDATE {qident(RUNS)} SET state = 'stopping' WHERE run_id = {_lit(run_id)}")

    def _ping(self, con: Any, run_ids: list[str]) -> None:
        self._execute(con, "SELECT 1")

    def _give_up(self, con: Any, run_id: str) -> None:
        if self.table:
            self._execute(con, f"DELETE FROM {qident(RUNS)} WHERE run_id = {_lit(run_id)}")
        self._execute(con, f"SELECT RELEASE_LOCK({_lit(guard_name(run_id))})")
        if self.stopping:
            self._execute(con, f"SELECT RELEASE_LOCK({_lit(stop_name(run_id))})")


def label_stage(conf: MySqlConnConfig, table: str, run_id: str, target: str) -> None:
    note = stage_label(run_id, target).replace("\\", "\\\\").replace("'", "''")
    conf.run(f"ALTER TABLE {qident(table)} COMMENT = '{note}'", doing="labelling the staging table")


def stages(conf: MySqlConnConfig) -> list[Stage]:
    """Conveyor's staging tables in the target's database, each with whether its run still holds its guard."""
    like = " OR ".join(f"table_name LIKE {_lit(p.replace('_', chr(92) + '_') + '%')}" for p in (STAGE_PREFIX, OLD_PREFIX))
    rows = conf.run(f"SELECT table_name, table_comment, coalesce(data_length, 0) + coalesce(index_length, 0) FROM information_schema.tables "
                    f"WHERE table_schema = DATABASE() AND ({like}) ORDER BY 1", doing="listing staging tables")
    out = []
    for name, comment, size in rows:
        run_id = name.split("_", 3)[-1]  # _conveyor_stage_<run id> / _conveyor_old_<run id>
        active = conf.run(f"SELECT IS_USED_LOCK({_lit(guard_name(run_id))}) IS NOT NULL", doing="listing staging tables")[0][0]
        out.append(Stage.read(conf.database or "", name, run_id, comment, int(size or 0), bool(active)))
    return out


def drop_stale(conf: MySqlConnConfig, target: str | None = None) -> list[Stage]:
    """Drop the staging tables whose run is gone (of one target, or all); returns what was dropped."""
    dropped = []
    for stage in stages(conf):
        if stage.active or (target is not None and stage.target != target):
            continue
        conf.run(f"DROP TABLE IF EXISTS {qident(stage.name)}", doing="dropping a stale staging table")
        dropped.append(stage)
    return dropped


def hold_guard(conf: MySqlConnConfig, run_id: str, table: bool) -> None:
    """The run's guard; the runs of one process at one database share its connection (a job over many tables)."""
    guard.hold(run_id, lambda: MyGuard(conf, run_id, table), share=("mysql", conf.where(), conf.user, table))


def committed(conf: MySqlConnConfig, load_id: str, target: str) -> dict[str, int]:
    """{partition: rows} committed under ``load_id`` into ``target``."""
    exists = conf.run(f"SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = {_lit(MARKERS)}",
                      doing="reading commit markers")[0][0]
    if not exists:
        return {}
    rows = conf.run(f"SELECT part, committed_rows FROM {qident(MARKERS)} WHERE load_id = {_lit(load_id)} AND target = {_lit(target)}",
                    doing="reading commit markers")
    return {p: int(n) for p, n in rows}


def forget_sql(load_id: str, target: str) -> str:
    """Drops a load's markers (a staged load made visible, or dropped, no longer needs them)."""
    return f"DELETE FROM {qident(MARKERS)} WHERE load_id = {_lit(load_id)} AND target = {_lit(target)}"


class _Raced(Exception):
    """Another attempt at the partition committed first (its marker's key): this one rolls back."""


@dataclass(frozen=True)
class Once:
    """What keeps a load's partitions exactly once, decided in prepare and shipped to the tasks."""

    #: the target as markers record it (database.table)
    target: str
    load_id: str
    markers: bool
    #: the run id whose guard the driver holds
    run_id: str


class Attempt:
    """One attempt at one partition in one MySQL transaction: skipped if committed before, sealed
    (row count, driver state, marker) as its last statement, a failure turned into the error to raise.

    ``execute(sql)`` runs a statement in the partition's transaction and returns the rows it changed
    (None: not known; then ``seen()`` counts this partition's marker inside the transaction);
    ``fetch(sql)`` runs a query (on any connection) and returns its first row."""

    def __init__(self, conf: MySqlConnConfig, once: Once, key: str, expected: Expected | None) -> None:
        self.conf, self.once, self.key, self.expected = conf, once, key, expected
        self.start = time.perf_counter()

    def committed_before(self) -> WriteStats | None:
        """The stats of an earlier attempt or run that committed this partition under the load id."""
        if not self.once.markers:
            return None
        rows = committed(self.conf, self.once.load_id, self.once.target).get(self.key)
        return None if rows is None else self.skipped(rows)

    def skipped(self, rows: int) -> WriteStats:
        return WriteStats(self.key, rows, 0, time.perf_counter() - self.start, already_committed=True)

    def seal(self, rows: int, execute: Callable[[str], int | None], fetch: Callable[[str], Any],
             seen: Callable[[], int] | None = None) -> None:
        """Just before COMMIT: the rows are the source's, the driver still holds the run, the marker joins."""
        o = self.once
        check_partition_rows(o.target, self.key, self.expected, rows)
        alive = f"IS_USED_LOCK({_lit(guard_name(o.run_id))}) IS NOT NULL"
        if not o.markers:
            free, held = fetch(f"SELECT IS_FREE_LOCK({_lit(stop_name(o.run_id))}), {alive}")
            if not (free and held):
                self._refuse(not free, not held)
            return
        try:
            sealed = execute(f"INSERT INTO {qident(MARKERS)} (load_id, target, part, committed_rows) SELECT {_lit(o.load_id)}, "
                             f"{_lit(o.target)}, {_lit(self.key)}, {int(rows)} FROM {qident(RUNS)} WHERE run_id = {_lit(o.run_id)} "
                             f"AND state = 'running' AND {alive} LOCK IN SHARE MODE")
        except Exception as exc:
            if "1062" in str(exc) or "Duplicate entry" in str(exc):  # another attempt committed it first
                raise _Raced() from None
            raise
        if sealed is None:
            assert seen is not None, "a transaction whose statements do not say what they changed counts the marker"
            sealed = seen()
        if not sealed:
            state = self.conf.run(f"SELECT (SELECT state FROM {qident(RUNS)} WHERE run_id = {_lit(o.run_id)}), {alive}",
                                  doing="reading the run's state")[0]
            self._refuse(state[0] == "stopping", not state[1])

    def _refuse(self, stopping: bool, gone: bool) -> None:
        if stopping:
            raise Cancelled(f"partition {self.key}: the run is stopping: rolled back instead of committing")
        # retriable: a target that restarted drops the driver's lock for a moment (it takes it again);
        # a driver that is really gone stays gone, and every retry rolls back the same way
        raise TransferError(f"partition {self.key}: the run's driver is gone: rolled back instead of committing",
                            partition=self.key, retriable=True, hint="resume the run: committed partitions are not loaded again")

    def failed(self, exc: BaseException) -> BaseException | WriteStats:
        """After the rollback: the stats of the attempt that won a race for the partition, or the error to raise."""
        if isinstance(exc, _Raced):
            return self.skipped(committed(self.conf, self.once.load_id, self.once.target).get(self.key, 0))
        if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
            return exc
        return self.conf.translate(exc, f"writing {self.key}", self.key)
