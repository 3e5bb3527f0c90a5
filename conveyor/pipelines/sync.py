"""Sync jobs (``incremental.method=replication``): a PostgreSQL source's tables kept equal to their
targets, a parallel snapshot load handed off exactly once to logical replication.

First run: the job's publication (each table's key columns) and slot are made, the slot with an
exported snapshot, and the tables are loaded by the usual job (every strategy, any degree, Ray or
local) in that snapshot; each target then records the slot's position. Every later run (or, with
``incremental.follow``, every N seconds): a temporary slot fixes the run's end position ``L`` with a
snapshot of it; the job's slot's changes up to ``L`` give the keys they touched
(:mod:`conveyor.connectors.postgres.replication`); the rows those keys hold in the snapshot are read
by the exact readers into a stage beside each target, and one target transaction deletes the keys,
inserts the rows that exist, checks what the target holds and records ``L``
(:mod:`conveyor.kit.syncapply`); the slot is advanced to ``L`` only after every table committed. A
run killed anywhere is followed by one that decodes the changes from the slot's position again:
applying a key twice writes the row it has at the later run's position, so the end state is exact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.config import JobSpec
from conveyor.connectors.postgres import replication
from conveyor.connectors.postgres.common import connect
from conveyor.connectors.postgres.replication import SyncTable, lsn_text
from conveyor.core import cancel_requested, wait_for_cancel
from conveyor.errors import Cancelled, ConfigError, ConveyorError, SchemaError
from conveyor.kit.syncapply import Applied, Change, SqlChangeApplier, SyncRecord, apply_changes
from conveyor.log import note, say

#: the source settings that say which tables, and the sink settings that say which target: the slot's default name
_IDENTITY = ("host", "port", "dbname", "database", "path", "schema", "table", "tables", "exclude")


@dataclass
class SyncRun:
    """One run's apply: the position the targets were at and the one they are at now."""

    start: int
    upto: int
    tables: dict[str, Applied] = field(default_factory=dict)
    changes: int = 0
    seconds: float = 0.0
    #: how far the source had moved past ``upto`` when the run committed: WAL bytes and seconds
    lag_bytes: int = 0
    lag_seconds: float = 0.0
    #: where the seconds went: decoding the changes, reading the changed rows into the stage, applying them
    phases: dict[str, float] = field(default_factory=dict)

    def lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - since, 4)
        return now

    @property
    def keys(self) -> int:
        return sum(a.keys for a in self.tables.values())

    def describe(self) -> str:
        rate = self.changes / self.seconds if self.seconds else 0.0
        what = "; ".join(f"{t}: {a.describe()}" for t, a in self.tables.items()) or "no change"
        return (f"sync: {self.changes:,} changes applied up to {lsn_text(self.upto)} in {self.seconds:.2f} s ({rate:,.0f}/s): {what}; "
                f"lag {self.lag_bytes:,} bytes, {self.lag_seconds:.2f} s")

    def as_dict(self) -> dict[str, Any]:
        return {"from": lsn_text(self.start), "to": lsn_text(self.upto), "changes": self.changes, "keys": self.keys,
                "seconds": round(self.seconds, 3), "changes_per_second": round(self.changes / self.seconds, 1) if self.seconds else None,
                "lag_bytes": self.lag_bytes, "lag_seconds": round(self.lag_seconds, 3), "phases": self.phases,
                "tables": {t: dataclasses.asdict(a) for t, a in self.tables.items()}}


@dataclass
class SyncReport:
    """A sync job's outcome: its first load (the usual job report), or the applies of this process."""

    slot: str
    target: str
    initial: Any = None
    position: int = 0
    runs: list[SyncRun] = field(default_factory=list)
    retained_bytes: int = 0
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.initial.rows if self.initial is not None else sum(r.keys for r in self.runs)

    def lines(self) -> list[str]:
        if self.initial is not None:
            return [f"sync: first load, {self.initial.rows:,} rows into {self.target} in {self.initial.seconds:.2f} s; "
                    f"slot {self.slot} at {lsn_text(self.position)}: the next run applies the changes since"]
        last = self.runs[-1] if self.runs else None
        return [f"sync: {len(self.runs)} run(s), {sum(r.changes for r in self.runs):,} changes applied; {self.target} holds the source "
                f"as of {lsn_text(self.position)}" + (f" (lag {last.lag_bytes:,} bytes, {last.lag_seconds:.2f} s)" if last else ""),
                f"slot {self.slot}: {self.retained_bytes:,} bytes of WAL held on the source"]

    def as_dict(self, status: str, error: BaseException | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"status": status, "sync": {"slot": self.slot, "target": self.target, "position": lsn_text(self.position),
                                                         "retained_bytes": self.retained_bytes, "runs": [r.as_dict() for r in self.runs]}}
        if self.initial is not None:
            out["sync"]["first_load"] = {"rows": self.initial.rows, "seconds": round(self.initial.seconds, 3)}
        if error is not None:
            out["error"] = str(getattr(error, "message", error))
        return out


def slot_of(spec: JobSpec) -> str:
    """The job's slot (and publication): ``incremental.slot``, else one named after the source's tables and the target."""
    if spec.incremental.slot:
        return replication.check_slot_name(spec.incremental.slot)

    def identity(config: Any) -> str:
        plain = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
        return json.dumps({k: plain.get(k) for k in _IDENTITY if k in plain}, sort_keys=True, default=str)

    return replication.slot_name(identity(spec.source.config), spec.names.get("sink", "") + identity(spec.sink.config))


def check(spec: JobSpec) -> None:
    """A sync job's config, refused by name before anything connects."""
    from conveyor.connectors.postgres.source import PostgresSource

    if type(spec.source) is not PostgresSource or spec.source.config.query:
        raise ConfigError("incremental.method=replication reads a PostgreSQL table's changes: the source must be postgres with "
                          "source.table or source.tables (not a query, not columns/rename)", key="incremental.method")
    if not isinstance(spec.sink, SqlChangeApplier) and not hasattr(spec.sink, "apply_sync"):
        raise ConfigError(f"incremental.method=replication: sink {spec.names.get('sink')} cannot apply changes (it deletes and "
                          "inserts rows by key in one transaction)", key="sink", hint="sync into postgres, duckdb, mysql, iceberg or delta")
    if spec.options.load_mode not in ("replace", "truncate", "create"):
        raise ConfigError(f"incremental.method=replication: load_mode={spec.options.load_mode}; a sync's first run loads each table "
                          "whole, and later runs apply changes", key="load_mode", hint="use load_mode=replace (or truncate / create)")
    if spec.incremental.chunk_keys <= 0 or spec.incremental.follow < 0 or spec.incremental.wait_timeout < 0:
        raise ConfigError("incremental.chunk_keys must be > 0, and incremental.follow and incremental.wait_timeout >= 0",
                          key="incremental")


def run(spec: JobSpec, load: Callable[[JobSpec], Any], on_run: Callable[[SyncReport], None] | None = None) -> SyncReport:
    """The sync job ``spec`` describes: its first load, or its applies (every ``incremental.follow``
    seconds until Ctrl-C / SIGTERM, which raise :class:`Cancelled` with every applied change committed)."""
    check(spec)
    start = time.perf_counter()
    source = spec.source
    slot = slot_of(spec)
    con = connect(source.config, autocommit=True)
    try:
        replication.check_source(con, source.config.where())
        replication.lock(con, slot)  # one run of the job at a time, until this connection closes
        version = int(con.execute("SHOW server_version_num").fetchone()[0])
        names = [(t.schema, t.name) for t in source.tables()] if source.many() else [(source.config.schema, source.config.table)]
        tables = [replication.describe(con, schema, name, version) for schema, name in names]
        sinks = [spec.sink.for_target(t.schema, t.name, spec.options) if source.many() else spec.sink for t in tables]
        report = SyncReport(slot=slot, target=", ".join(s._sync_target for s in sinks))
        states = [s.sync_state(slot) for s in sinks]
        held = replication.slot_state(con, slot)
        if held is None or any(s is None for s in states):
            if held is not None:
                note(f"sync: slot {slot} exists but the target has no record of the load that began with it (a first run that "
                     "stopped): loading again")
            elif any(s is not None for s in states):
                note(f"sync: the target holds a sync of slot {slot}, and the source has no such slot (dropped, or the source is "
                     "another server): the changes since are lost to it, so the tables are loaded again")
            report.initial, report.position = _first(spec, con, slot, tables, sinks, version, load)
            report.retained_bytes = (replication.slot_state(con, slot) or (0, 0))[1]
            report.seconds = time.perf_counter() - start
            if on_run is not None:
                on_run(report)
            if not spec.incremental.follow:
                return report
            if wait_for_cancel(spec.incremental.follow):
                raise Cancelled(f"sync stopped: {report.target} holds the source as of {lsn_text(report.position)}, every applied "
                                "change committed", hint="run it again to go on from there")
        while True:
            done = _apply(spec, con, slot, tables, sinks, version)
            report.runs.append(done)
            report.position = done.upto
            report.retained_bytes = (replication.slot_state(con, slot) or (0, 0))[1]
            report.seconds = time.perf_counter() - start
            say(done.describe())
            if on_run is not None:
                on_run(report)
            if not spec.incremental.follow:
                return report
            if wait_for_cancel(spec.incremental.follow):
                raise Cancelled(f"sync stopped: {report.target} holds the source as of {lsn_text(report.position)}, every applied "
                                "change committed", hint="run it again to go on from there")
    finally:
        con.close()


def _first(spec: JobSpec, con: Any, slot: str, tables: list[SyncTable], sinks: list[Any], version: int,
           load: Callable[[JobSpec], Any]) -> tuple[Any, int]:
    """The first load, in the snapshot the job's new slot exported; each target records the slot's position."""
    for dropped in replication.drop(con, slot):
        note(f"sync: dropped {dropped} (its first load had not finished)")
    replication.publish(con, slot, tables, version)  # before the slot: pgoutput reads it as of each change
    try:
        with replication.exported(spec.source.config, slot, temporary=False, wait_timeout=spec.incremental.wait_timeout) as (position,
                                                                                                                      snapshot):
            say(f"sync: slot {slot} made at {lsn_text(position)}: loading the tables in its snapshot")
            spec.source.imported_snapshot = snapshot
            job = load(spec)
    except BaseException:
        with contextlib.suppress(Exception):  # a first load that failed holds no WAL back on the source
            replication.drop(con, slot)
        raise
    for table, sink in zip(tables, sinks):
        sink.record_sync(SyncRecord(slot, table.label, position, table.signature))
    return job, position


def _apply(spec: JobSpec, con: Any, slot: str, tables: list[SyncTable], sinks: list[Any], version: int) -> SyncRun:
    """One run: the changes since the targets' position up to a position fixed now, applied."""
    began = time.perf_counter()
    states = [s.sync_state(slot) for s in sinks]
    if any(s is None for s in states):
        raise ConveyorError(f"sync: the sync state of {', '.join(s._sync_target for s, st in zip(sinks, states) if st is None)} is gone",
                            hint=f"conveyor clean --drop (this job's settings) drops slot {slot}; the next run loads the tables again")
    at = min(s.position for s in states)
    replication.check_published(con, slot, tables, version)
    for table, state in zip(tables, states):
        now = replication.describe(con, table.schema, table.name, version)
        if state.signature != now.signature:
            raise SchemaError(f"sync of {table.label} stopped: the source table changed since the sync began: "
                              f"{replication.changed_columns(state.signature, now.signature)}",
                              hint="change the target to match, then conveyor clean --drop (this job's settings) and run again: "
                                   "the first run loads the table again")
    temporary = f"conveyor_run_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with replication.exported(spec.source.config, temporary, temporary=True, wait_timeout=spec.incremental.wait_timeout) as (upto, snapshot):
        taken = time.time()
        confirmed, _ = replication.slot_state(con, slot) or (0, 0)
        if confirmed > at:
            raise ConveyorError(f"sync: slot {slot} is at {lsn_text(confirmed)}, past the changes the target holds ({lsn_text(at)}): "
                                "something else consumed the changes between", hint=f"conveyor clean --drop (this job's settings) "
                                f"drops slot {slot}; the next run loads the tables again")
        if at > confirmed:  # the last run committed and stopped before it moved the slot
            note(f"sync: the targets hold the changes up to {lsn_text(at)}: slot {slot} advanced to it")
            replication.advance(con, slot, at)
        done = SyncRun(start=at, upto=upto)
        lap = done.lap("start", began)
        done.changes = replication.collect(con, slot, upto)
        done.lap("decode", lap)
        try:
            if all(isinstance(s, SqlChangeApplier) for s in sinks):
                done.tables.update(_apply_sql(spec, con, slot, tables, sinks, [s.position for s in states], upto, snapshot, done))
            else:
                for table, sink in zip(tables, sinks):
                    if cancel_requested():
                        raise Cancelled("cancelled")
                    done.tables[table.label] = _apply_table(spec, con, slot, table, sink, upto, snapshot, done)
        except Cancelled:
            applied = f" ({', '.join(done.tables)} up to {lsn_text(upto)})" if done.tables else ""
            raise Cancelled(f"sync stopped while applying: every target holds this run's changes{applied} or the last run's, "
                            "each committed whole", hint="run it again: it applies the changes from there") from None
        if upto > max(confirmed, at):
            replication.advance(con, slot, upto)
        done.lag_bytes = max(int(con.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint",
                                             (lsn_text(upto),)).fetchone()[0]), 0)
        done.lag_seconds = time.time() - taken
    done.seconds = time.perf_counter() - began
    return done


def _apply_sql(spec: JobSpec, con: Any, slot: str, tables: list[SyncTable], sinks: list[Any], held: list[int], upto: int,
               snapshot: str, done: SyncRun) -> dict[str, Applied]:
    """One run into an SQL target: every table's changed rows staged (in chunks of ``incremental.chunk_keys`` keys), then
    applied in one target transaction across the tables, parents first (:func:`conveyor.kit.syncapply.apply_changes`)."""
    order, referenced = replication.parents_first(con, tables)
    changes: list[Change] = []
    staged: list[tuple[Any, str]] = []
    lap = time.perf_counter()
    try:
        for i in order:
            if cancel_requested():
                raise Cancelled("cancelled")
            table, sink = tables[i], sinks[i]
            record = SyncRecord(slot, table.label, upto, table.signature)
            full = replication.truncated(con, table)
            count = 0 if full else replication.changed_keys(con, table)
            lap = done.lap("keys", lap)
            if not full and not count:
                changes.append(Change(sink, None, table.keys, False, record, held[i], i in referenced))
                continue
            stage = sink.sync_stage(slot)
            staged.append((sink, stage))
            chunks = 1 if full else -(-count // spec.incremental.chunk_keys)
            for c in range(chunks):
                query = replication.whole_query(table) if full else replication.rows_query(con, table, c, chunks)
                _stage(spec, table, sink, stage, query, snapshot, sink._stage_mode if c == 0 else "append")
            lap = done.lap("stage", lap)
            changes.append(Change(sink, stage, table.keys, full, record, held[i], i in referenced))
        if cancel_requested():
            raise Cancelled("cancelled")
        applied = apply_changes(changes)
        done.lap("apply", lap)
    finally:
        for sink, stage in staged:
            with contextlib.suppress(Exception):  # the next run makes it again; conveyor clean --drop removes a left one
                sink.drop_stage(stage)
    by_table = {c.record.source: a for c, a in zip(changes, applied) if c.record is not None}
    return {t.label: by_table[t.label] for t in tables}


def _apply_table(spec: JobSpec, con: Any, slot: str, table: SyncTable, sink: Any, upto: int, snapshot: str, done: SyncRun) -> Applied:
    record = SyncRecord(slot, table.label, upto, table.signature)
    lap = time.perf_counter()
    full = replication.truncated(con, table)
    count = 0 if full else replication.changed_keys(con, table)
    lap = done.lap("keys", lap)
    if not full and not count:
        sink.record_sync(record)  # nothing changed: the position alone
        return Applied(keys=0, written=0, deleted=0)
    chunks = 1 if full else -(-count // spec.incremental.chunk_keys)
    stage = sink.sync_stage(slot)
    total = Applied(keys=0, written=0, deleted=0, full=full)
    try:
        for i in range(chunks):
            query = replication.whole_query(table) if full else replication.rows_query(con, table, i, chunks)
            _stage(spec, table, sink, stage, query, snapshot)
            lap = done.lap("stage", lap)
            got = sink.apply_sync(stage, table.keys, full, record if i == chunks - 1 else None)
            lap = done.lap("apply", lap)
            total = Applied(total.keys + got.keys, total.written + got.written, total.deleted + got.deleted, full)
    finally:
        with contextlib.suppress(Exception):  # the next run makes it again; conveyor clean --drop removes a left one
            sink.drop_stage(stage)
    return total


def _stage(spec: JobSpec, table: SyncTable, sink: Any, stage: str, query: str, snapshot: str, mode: str | None = None) -> Any:
    """The rows of one chunk of keys, read in the run's snapshot by the usual exact path into the stage
    (one partition on the driver; the load's own count check compares what the stage stored)."""
    from conveyor.connectors.postgres.source import PostgresSource
    from conveyor.pipelines.job import run_job
    from conveyor.runtime.local import LocalRuntime, LocalRuntimeConfig
    from conveyor.strategies.basic import NoneStrategy, NoneStrategyConfig

    options = dataclasses.replace(spec.options, load_mode=mode or sink._stage_mode, run_id=uuid.uuid4().hex[:12], load_id="", cursor=None)
    source = PostgresSource(dataclasses.replace(spec.source.config, table=None, tables=[], exclude=[], query=query), options)
    source.imported_snapshot = snapshot
    target = (sink.stage_sink(stage, options) if hasattr(sink, "stage_sink") else
              type(sink)(dataclasses.replace(sink.config, table=stage), options))
    job = JobSpec(source=source, sink=target, strategy=NoneStrategy(NoneStrategyConfig(), options),
                  runtime=LocalRuntime(LocalRuntimeConfig(), options), options=options,
                  names={**spec.names, "strategy": "none", "runtime": "local"}, incremental=spec.incremental)
    return run_job(job)


def plan_lines(spec: JobSpec) -> list[str]:
    """What ``conveyor plan`` says of a sync job: its slot, the WAL it holds on the source, and each target's position."""
    check(spec)
    slot = slot_of(spec)
    con = connect(spec.source.config, autocommit=True)
    try:
        held = replication.slot_state(con, slot)
    finally:
        con.close()
    if held is None:
        return [f"sync: no slot yet: the first run makes slot {slot} (and its publication) and loads the tables in its snapshot"]
    states = [spec.sink.sync_state(slot)] if not spec.source.many() else []
    at = ", ".join(lsn_text(s.position) for s in states if s is not None) or "(per table)"
    return [f"sync: slot {slot} at {lsn_text(held[0])} holds {held[1]:,} bytes of WAL on the source; the target is at {at}: "
            "a run applies the changes since"]


def leftovers(spec: JobSpec, remove: bool) -> list[str]:
    """``conveyor clean`` of a sync job: its slot and publication on the source, its state and stage beside
    each target; dropped with ``remove`` (the next run then loads the tables again)."""
    check(spec)
    slot = slot_of(spec)
    source = spec.source
    con = connect(source.config, autocommit=True)
    try:
        held = replication.slot_state(con, slot)
        if not remove:
            out = [f"replication slot {slot}: holds {held[1]:,} bytes of WAL on the source"] if held is not None else []
            return out + [f"sync state of {s._sync_target} ({slot})" for s in _sinks(spec) if s.sync_state(slot) is not None]
        out = [f"dropped {what}" for what in replication.drop(con, slot)]
    finally:
        con.close()
    return out + [f"dropped {what}" for s in _sinks(spec) for what in s.forget_sync(slot)]


def _sinks(spec: JobSpec) -> list[Any]:
    if not spec.source.many():
        return [spec.sink]
    return [spec.sink.for_target(t.schema, t.name, spec.options) for t in spec.source.tables()]
