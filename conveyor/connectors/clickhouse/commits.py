"""Exactly once on ClickHouse, which has no transaction over two statements.

**Each partition is written into a table of its own** (``_conveyor_part_<load>_<partition>``, made
like the target) and counted there: the count is what the server stored. Then:

- *append*: a marker row ``attaching`` (load id, target, partition, rows) goes into
  ``_conveyor_commits``; ``ALTER TABLE target ATTACH PARTITION ... FROM`` the partition's table moves
  its parts in (the parts are hard-linked: a partition's rows appear in the target together); a
  marker ``committed`` follows, then the partition's table is dropped.
- *truncate / create / replace*: a marker ``staged`` is written and the partition's table stays;
  the driver's finalize attaches every staged partition into one table, counts it, and swaps it in
  (``RENAME TABLE``). A failed run drops them: the target is as it was.

A retry or a resume reads the markers first: a partition ``committed`` (or ``staged``) is not
written again. A partition whose marker says ``attaching`` with no ``committed`` was stopped between
the two (its task or driver killed: Ray stops a dead driver's tasks). The ATTACH statements run with
``log_queries=1``, so the server's ``system.query_log`` says which of them finished: the next attempt
flushes the log, waits for any still running, attaches the partition's parts whose ATTACH never
finished, and records it. Only where the log cannot tell (no query_log on the server, or a server
that stopped in the middle of an ATTACH) is the partition refused by name, its table kept: never
written twice, never dropped.

**The guard.** The driver appends a row to ``_conveyor_runs`` every second (``running``, or
``stopping`` after Ctrl-C or SIGTERM). A partition attaches (or marks itself staged) only while its
run's latest row says running and is at most 15 s old on the server's clock: after Ctrl-C no new
partition commits, and a task whose driver died does not commit behind it.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.clickhouse.common import ClickHouseConnConfig, literal, qident
from conveyor.errors import Cancelled, ConveyorError, TransferError
from conveyor.kit import guard
from conveyor.kit.staged import Stage

MARKERS = "_conveyor_commits"
RUNS = "_conveyor_runs"
#: a partition's own table, the job's table made of them (finalize), a replaced target before its drop
PART_PREFIX, STAGE_PREFIX, OLD_PREFIX = "_conveyor_part_", "_conveyor_stage_", "_conveyor_old_"
#: a driver whose last beat is older than this is gone
ALIVE_SECONDS = 15


def ensure_tables(conf: ClickHouseConnConfig) -> None:
    conf.run(f"CREATE TABLE IF NOT EXISTS {qident(MARKERS)} (load_id String, target String, part String, state String, rows UInt64, "
             "at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY (load_id, target, part)",
             f"CREATE TABLE IF NOT EXISTS {qident(RUNS)} (run_id String, load_id String, state String, seq UInt64, "
             "at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY (run_id, seq)",
             doing=f"creating {MARKERS} and {RUNS}")


def short(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def part_table(load_id: str, target: str, key: str) -> str:
    """The table a partition of a load is written into (the same name on every attempt and resume)."""
    return f"{PART_PREFIX}{short(load_id + '|' + target)}_{short(key)}"


@dataclass(frozen=True)
class Once:
    """What keeps a load's partitions exactly once, decided in prepare and shipped to the tasks."""

    target: str  # database.table, as markers name it
    load_id: str
    run_id: str


def mark(conf: ClickHouseConnConfig, once: Once, key: str, state: str, rows: int) -> None:
    conf.run(f"INSERT INTO {qident(MARKERS)} (load_id, target, part, state, rows) VALUES ({literal(once.load_id)}, "
             f"{literal(once.target)}, {literal(key)}, {literal(state)}, {int(rows)})", doing="recording a partition's commit")


def states(conf: ClickHouseConnConfig, load_id: str, target: str) -> dict[str, dict[str, int]]:
    """{partition: {state: rows}} of a load's markers for a target."""
    rows = conf.run(f"SELECT part, state, max(rows) FROM {qident(MARKERS)} WHERE load_id = {literal(load_id)} "
                    f"AND target = {literal(target)} GROUP BY part, state", doing="reading commit markers")
    out: dict[str, dict[str, int]] = {}
    for part, state, n in rows:
        out.setdefault(part, {})[state] = int(n)
    return out


def forget(conf: ClickHouseConnConfig, load_id: str, target: str) -> None:
    """A staged load made visible, or dropped, no longer needs its markers (a mutation: best effort)."""
    conf.run(f"ALTER TABLE {qident(MARKERS)} DELETE WHERE load_id = {literal(load_id)} AND target = {literal(target)}",
             doing="dropping a load's markers")


class ChGuard(guard.RunGuard):
    """The driver's beat in ``_conveyor_runs``, one row per run in one INSERT; see the module's docstring."""

    class _Conn:
        def close(self) -> None:
            pass

    def __init__(self, conf: ClickHouseConnConfig, run_id: str, load_id: str) -> None:
        self.conf = conf
        self.seq = itertools.count(int(time.time() * 1000))
        super().__init__(run_id, load_id)

    def _beat(self, states: dict[str, str]) -> None:
        rows = ", ".join(f"({literal(run_id)}, {literal(self.about.get(run_id) or '')}, {literal(state)}, {next(self.seq)})"
                         for run_id, state in states.items())
        self.conf.run(f"INSERT INTO {qident(RUNS)} (run_id, load_id, state, seq) VALUES {rows}", doing="recording the run's state")

    def _connect(self) -> Any:
        return self._Conn()

    def _take(self, con: Any, run_id: str) -> None:
        self._beat({run_id: "stopping" if self.stopping else "running"})

    def _mark_stopping(self, con: Any, run_id: str) -> None:
        self._beat({run_id: "stopping"})

    def _ping(self, con: Any, run_ids: list[str]) -> None:
        if run_ids:
            self._beat({run_id: "stopping" if self.stopping else "running" for run_id in run_ids})

    def _give_up(self, con: Any, run_id: str) -> None:
        self._beat({run_id: "done"})


def hold_guard(conf: ClickHouseConnConfig, run_id: str, load_id: str) -> None:
    """The run's beat; the runs of one process at one server share one beat (a job over many tables)."""
    guard.hold(run_id, lambda: ChGuard(conf, run_id, load_id), share=("clickhouse", conf.where(), conf.user), about=load_id)


def check_running(conf: ClickHouseConnConfig, run_id: str, key: str) -> None:
    """Before a partition commits: its run is running, and its driver beat within the last ALIVE_SECONDS."""
    rows = conf.run(f"SELECT argMax(state, seq), now() - max(at) FROM {qident(RUNS)} WHERE run_id = {literal(run_id)}",
                    doing="reading the run's state")
    state, age = (rows[0][0], int(rows[0][1])) if rows and rows[0][0] else ("", 1 << 30)
    if state == "stopping":
        raise Cancelled(f"partition {key}: the run is stopping: not committed")
    if state != "running" or age > ALIVE_SECONDS:
        raise TransferError(f"partition {key}: the run's driver is gone: not committed", partition=key, retriable=True,
                            hint="resume the run: committed partitions are not loaded again")


def stages(conf: ClickHouseConnConfig) -> list[Stage]:
    """Conveyor's tables in the target's database (a partition's, a job's stage, a replaced target), each with
    whether a run that may use it still beats."""
    db = literal(conf.database)
    names = conf.run(f"SELECT name, toString(total) FROM system.tables AS t ANY LEFT JOIN (SELECT table AS name, sum(bytes_on_disk) "
                     f"AS total FROM system.parts WHERE active AND database = {db} GROUP BY table) USING name WHERE database = {db} "
                     f"AND (startsWith(name, '{PART_PREFIX}') OR startsWith(name, '{STAGE_PREFIX}') OR startsWith(name, '{OLD_PREFIX}')) "
                     "ORDER BY name", doing="listing staging tables")
    if not names:
        return []
    live = _live(conf)
    out = []
    for name, size in names:
        owner = name.split("_")[3] if name.startswith(PART_PREFIX) else name.split("_", 3)[-1]
        active = any(owner in (run_id, short(load_id + "|" + target)) for run_id, load_id, target in live)
        out.append(Stage(conf.database or "", name, owner, "", "", int(size) if size.isdigit() else 0, active))
    return out


def _live(conf: ClickHouseConnConfig) -> list[tuple[str, str, str]]:
    """(run id, load id, target) of the runs that beat within ALIVE_SECONDS and are not done."""
    try:
        rows = conf.run(f"SELECT run_id, any(load_id) FROM {qident(RUNS)} GROUP BY run_id HAVING argMax(state, seq) != 'done' "
                        f"AND now() - max(at) <= {ALIVE_SECONDS}", doing="listing running loads")
        targets = conf.run(f"SELECT DISTINCT load_id, target FROM {qident(MARKERS)}", doing="listing running loads")
    except Exception:  # no such tables: nothing runs
        return []
    by_load: dict[str, list[str]] = {}
    for load_id, target in targets:
        by_load.setdefault(load_id, []).append(target)
    return [(run_id, load_id, target) for run_id, load_id in rows for target in by_load.get(load_id, [""])]


def drop_stale(conf: ClickHouseConnConfig) -> list[Stage]:
    """Drop Conveyor's tables whose run is gone; returns what was dropped."""
    dropped = []
    for stage in stages(conf):
        if not stage.active:
            conf.run(f"DROP TABLE IF EXISTS {qident(conf.database or 'default')}.{qident(stage.name)}", doing="dropping a stale table")
            dropped.append(stage)
    return dropped


#: seconds an ATTACH the query log does not show yet is looked for again before it is taken as never run
LOG_SETTLE = 3.0


def attach_outcomes(conf: ClickHouseConnConfig, source: str, seconds: float = 60) -> dict[str, str]:
    """{partition id: done | failed | unknown} of the ATTACH statements from ``source`` (a qualified table) the
    server logged; an id it never logged is absent. Waits (at most ``seconds``) for those still running."""
    deadline = time.monotonic() + seconds
    while int(conf.run(f"SELECT count() FROM system.processes WHERE position(query, {literal('FROM ' + source)}) > 0 "
                       "AND position(query, 'system.processes') = 0", doing="waiting for an ATTACH")[0][0]):
        if time.monotonic() > deadline:
            raise TransferError(f"an ATTACH from {source} is still running after {seconds:.0f} s", retriable=True)
        time.sleep(0.2)
    # an ATTACH that just finished may reach the log's queue a moment after its client saw it end (seen under load: an
    # ATTACH done, the log read without it, the partition attached twice): an empty answer is asked again for LOG_SETTLE s
    settle = time.monotonic() + LOG_SETTLE
    while True:
        conf.run("SYSTEM FLUSH LOGS", doing="flushing the server's query log")
        rows = _attaches_logged(conf, source)
        if rows or time.monotonic() > settle:
            break
        time.sleep(0.5)
    out = {}
    for query, kind in rows:
        part_id = query.split("ATTACH PARTITION ID ", 1)[1].split(" FROM ", 1)[0].strip().strip("'")
        out[part_id] = {"2": "done", "3": "failed", "4": "failed"}.get(kind, "unknown")
    return out


def _attaches_logged(conf: ClickHouseConnConfig, source: str) -> list[list[str]]:
    """The ATTACH statements from ``source`` in the server's query log, with their last event. A server whose log has no
    table yet has logged no query since it began: a logged query, flushed, makes it (an ATTACH was logged only if the
    log is configured at all); where the table still does not appear, the log is not kept and the error says so."""
    query = (f"SELECT query, max(type) FROM system.query_log WHERE position(query, {literal('FROM ' + source)}) > 0 "
             "AND position(query, 'ATTACH PARTITION ID') > 0 GROUP BY query")
    try:
        return conf.run(query, doing="reading the server's query log")
    except ConveyorError as exc:
        if "Code: 60" not in str(exc):  # UNKNOWN_TABLE: system.query_log not made yet
            raise
    conf.run("SELECT 1", doing="logging a query", settings={"log_queries": 1})
    conf.run("SYSTEM FLUSH LOGS", doing="flushing the server's query log")
    return conf.run(query, doing="reading the server's query log")
