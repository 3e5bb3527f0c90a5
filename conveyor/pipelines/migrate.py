"""Whole-database migrations: a sync job (``incremental.method=replication``) with ``migrate.schema=true``, through the
declared contracts alone (the sync's :mod:`conveyor.core.changes`, the migration's :mod:`conveyor.core.migration`).

Steps, each recorded on the target where it commits, so a rerun goes on from the last one:

1. **schema**: in the snapshot the sync's slot is made with, the source's definitions are exported (PostgreSQL:
   pg_dump's pre-data and post-data sections); the pre-data is run on the target in one transaction, the post-data
   kept with the step. Then the first load copies every table in that snapshot (the job's strategy and degree, Ray
   or local) into the tables the pre-data made.
2. **indexed**: the post-data (indexes, constraints, triggers) run in one transaction after the load, and the
   sequences set to their source values. Every later run applies the changes as a replica would (the target's
   triggers and foreign key actions do not fire again for rows the source's own already changed).
3. **done** (``migrate.cutover=true``, once the application's writes to the source have stopped): the changes up to
   now applied, every sequence set past its source value, every table compared row by row (``conveyor verify``),
   a last look that the source took no change meanwhile, then the slot, publication and the migration's records
   dropped. The write downtime it reports is the cutover's own time: from its start (the writes stopped before) to
   the verified end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.core import resolve_degree
from conveyor.core.migration import SchemaExport, SchemaImport, SchemaScript
from conveyor.errors import ConfigError, VerificationError
from conveyor.log import say


@dataclass
class MigrationReport:
    """A migration's part of a sync's report: what this run did of it."""

    step: str = ""
    made: dict[str, str] = field(default_factory=dict)
    sequences: int = 0
    verified: dict[str, int] = field(default_factory=dict)
    downtime_seconds: float | None = None
    dropped: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"migrate: {section} definitions made: {what}" for section, what in self.made.items()]
        if self.sequences:
            out.append(f"migrate: {self.sequences} sequence(s) set to their source values")
        if self.verified:
            out.append(f"migrate: {len(self.verified)} table(s) verified equal to the source, {sum(self.verified.values()):,} rows")
        if self.downtime_seconds is not None:
            out.append(f"migrate: cutover done: write downtime {self.downtime_seconds:.2f} s (from the cutover's start to its verified end); "
                       f"dropped {', '.join(self.dropped) or 'nothing'}: point the application at the target")
        elif self.step:
            out.append(f"migrate: at step {self.step}: run with incremental.follow=N to keep applying, then migrate.cutover=true "
                       "once the application's writes to the source have stopped")
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check(spec: Any) -> None:
    """A migration's config, refused by name before anything connects."""
    if not isinstance(spec.source, SchemaExport) or not isinstance(spec.sink, SchemaImport):
        raise ConfigError(f"migrate.schema=true: a migration moves a database's definitions from a source that exports them to a sink "
                          f"that runs them (postgres to postgres), not {spec.names.get('source')} to {spec.names.get('sink')}",
                          key="migrate.schema", hint="use pipeline=pg_migrate")
    if spec.incremental.method != "replication":
        raise ConfigError("migrate.schema=true is a sync: set incremental.method=replication", key="incremental.method",
                          hint="use pipeline=pg_migrate")
    if not spec.source.many():
        raise ConfigError("migrate.schema=true moves a database: its tables are source.tables (patterns), not one source.table",
                          key="source.tables", hint="use pipeline=pg_migrate (source.tables=['*.*'])")
    if spec.options.load_mode != "append":
        raise ConfigError(f"migrate.schema=true: load_mode={spec.options.load_mode}; the first load appends to the empty tables the "
                          "source's definitions made (each partition committed once, by its marker)", key="load_mode",
                          hint="use load_mode=append (pipeline=pg_migrate sets it)")
    if spec.migrate.cutover and spec.incremental.follow:
        raise ConfigError("migrate.cutover=true ends the sync: it does not go with incremental.follow", key="migrate.cutover",
                          hint="stop the follow (Ctrl-C), stop the application's writes, then run the cutover")


def run(spec: Any, load: Callable[[Any], Any], on_run: Callable[[Any], None] | None, sync_run: Callable[..., Any]) -> Any:
    """The migration ``spec`` describes, from the step its target recorded (see the module's docstring); returns the
    sync's report with ``report.sync.migration`` this run's :class:`MigrationReport`."""
    from conveyor.pipelines import sync

    check(spec)
    sync.check(spec)
    slot = sync.slot_of(spec)
    settings = spec.migrate
    version = spec.sink.server_version()
    spec = dataclasses.replace(spec, sink=spec.sink.as_replica())
    migration = MigrationReport()
    step, later = spec.sink.migration_step(slot)
    report = None

    def export(section: str, snapshot: Any) -> SchemaScript:
        return spec.source.export_schema(section, snapshot, settings.owners, settings.pg_dump, version)

    if step != "indexed":
        def schema_first(snapshot: Any) -> None:
            if step is not None:  # made by a run that stopped in its load: the tables emptied, loaded again in this snapshot
                spec.sink.empty_tables([(t.schema, t.name) for t in _tables(spec)])
                return
            pre, post = export("pre-data", snapshot), export("post-data", snapshot)
            spec.sink.import_schema(pre, slot, "schema", later=post)
            migration.made["pre-data"] = pre.describe()
            say(f"migrate: the source's definitions made on the target ({pre.describe()}); loading the tables")

        once = dataclasses.replace(spec, incremental=dataclasses.replace(spec.incremental, follow=0))
        report = sync_run(once, load, None, before_load=schema_first)
        if later is None:
            later = spec.sink.migration_step(slot)[1]
        if later is None:  # a step recorded by a run that kept no post-data: take it now
            later = export("post-data", None)
        spec.sink.import_schema(later, slot, "indexed", jobs=resolve_degree(spec.runtime, spec.options.degree))
        migration.made["post-data"] = later.describe()
        migration.sequences = spec.sink.set_sequences(spec.source.sequence_values())
        say(f"migrate: indexes, constraints and triggers made ({later.describe()}); {migration.sequences} sequence(s) set")
    migration.step = "indexed"
    if settings.cutover:
        return _cutover(spec, load, sync_run, slot, migration)
    if report is not None and not spec.incremental.follow:
        report.sync.migration = migration
        if on_run is not None:
            on_run(report)
        return report

    def said(report: Any) -> None:
        report.sync.migration = migration
        if on_run is not None:
            on_run(report)

    report = sync_run(spec, load, said)
    report.sync.migration = migration
    return report


def _cutover(spec: Any, load: Callable[[Any], Any], sync_run: Callable[..., Any], slot: str, migration: MigrationReport) -> Any:
    """The last changes applied, sequences set, every table verified, no change taken meanwhile, the sync dropped."""
    from conveyor.pipelines import sync
    from conveyor.pipelines.compare import compare

    started = time.perf_counter()
    sync_run(spec, load, None)  # the changes up to now
    _quiet(sync_run(spec, load, None), "before its checks")  # ... and none since: the writes have stopped
    migration.sequences = spec.sink.set_sequences(spec.source.sequence_values())
    tables = _tables(spec)

    def compared(t: Any) -> Any:
        return compare(dataclasses.replace(spec, source=spec.source.for_table(t, spec.options),
                                           sink=spec.sink.for_target(t.schema, t.name, spec.options)))

    from concurrent.futures import ThreadPoolExecutor

    differ = []
    at_once = resolve_degree(spec.runtime, spec.options.degree) if spec.runtime.runs_tasks_here() else 1  # Ray: its tasks are the parallelism
    with ThreadPoolExecutor(max(1, at_once), thread_name_prefix="conveyor-cutover") as pool:
        results = list(pool.map(compared, tables))  # a small table's fixed costs beside a large one's reads (each reads in parallel too)
    for t, result in zip(tables, results):
        if result.equal:
            migration.verified[t.qualified] = result.source.rows
        else:
            differ.append(f"{t.qualified} ({result.source.rows:,} rows in the source, {result.target.rows:,} in the target)")
    if differ:
        raise VerificationError(f"migrate: the cutover found tables that differ from the source: {'; '.join(differ)}",
                                hint="the sync stays as it was: conveyor verify (source.table=... sink.table=...) names the rows")
    last = sync_run(spec, load, None)
    _quiet(last, "while it verified the tables")
    migration.sequences = spec.sink.set_sequences(spec.source.sequence_values())
    migration.dropped = sync.leftovers(spec, remove=True) + spec.sink.forget_migration(slot, [(t.schema, t.name) for t in tables])
    migration.step = "done"
    migration.downtime_seconds = round(time.perf_counter() - started, 3)
    last.sync.migration = migration
    return last


def _tables(spec: Any) -> list[Any]:
    """The migration's tables: the source's, as its session sees them."""
    with spec.source.session() as session:
        return list(session.tables())


def _quiet(report: Any, when: str) -> None:
    """A cutover's look that the source took no change: else the application still writes, and the cutover stops."""
    taken = report.sync.runs[-1].changes if report.sync.runs else 0
    if taken:
        raise VerificationError(f"migrate: the source took {taken:,} change(s) {when} (applied to the target): the application "
                            "still writes to the source, and the cutover stopped", hint="stop every write to the source (e.g. "
                            "ALTER DATABASE ... SET default_transaction_read_only = on, and reconnect the application), then run "
                            "the cutover again")
