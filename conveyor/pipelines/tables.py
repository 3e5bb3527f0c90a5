"""A job over several tables (``source.tables: [tpch.*]``): one snapshot, one pool of tasks, a load per table.

The source names its tables inside the job's session (:class:`~conveyor.core.SupportsManyTables`),
so the tables and every partition of every table read one exported snapshot: a copy of tables
written to meanwhile is consistent across them (foreign keys hold in the target). Each table
gets a source of its own in that snapshot, a target of its own (the sink aimed at it by
:class:`~conveyor.core.SupportsManyTargets`: ``sink.table='{table}'`` or a folder per table),
a run id of its own (its staging table, its guard) and the job's load id (its commit markers),
and its own plan by the job's strategy. Every target is prepared before a row moves; the tasks
of all tables run in one pool under one ``degree``, largest table first; then every table is
verified, and only then is each finalized (a staged load made visible) in turn. A failure
before that aborts every table's load: staged targets stay as they were, appends keep whole
partitions, and ``resume`` goes on across tables (partition keys name their table).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import SourceInfo, SupportsForeignKeys, SupportsManyTargets, resolve_degree
from conveyor.errors import ConfigError
from conveyor.log import note
from conveyor.pipelines.job import JobPlan, JobReport, Load, Phases, check, plan_one, stop_clock, stopped
from conveyor.pipelines.verify import Verification


def plan_tables(spec: JobSpec, session: Any) -> JobPlan:
    """Each table's plan (in the session's snapshot), and the job's: all their partitions, largest table first."""
    if spec.options.cursor:
        raise ConfigError("incremental.cursor with source.tables: not built yet (one cursor per table)", key="incremental.cursor",
                          hint="run one job per table for incremental loads")
    if not isinstance(spec.sink, SupportsManyTargets):
        raise ConfigError(f"source.tables: sink {spec.names['sink']} cannot give each table a target of its own", key="source.tables",
                          hint="PostgreSQL, MySQL, DuckDB, Parquet and CSV sinks can")
    tables = session.tables()
    subs: list[JobPlan] = []
    targets: dict[str, str] = {}
    for i, table in enumerate(tables):
        options = dataclasses.replace(spec.options, run_id=f"{spec.options.run_id}t{i}", load_id=spec.options.load)
        sub = dataclasses.replace(spec, source=session.for_table(table, options), sink=spec.sink.for_table(table.schema, table.name, options),
                                  options=options)
        _one_target_each(targets, sub.sink, table.qualified)
        check(sub)
        plan = plan_one(sub, sub.source.describe(), sub.source)
        parts = [dataclasses.replace(p, table=table.qualified) for p in plan.partitions]
        subs.append(dataclasses.replace(plan, partitions=parts))
    import pyarrow as pa

    rows = [p.info.estimated_rows for p in subs if p.info.estimated_rows is not None]
    sizes = [p.info.estimated_bytes for p in subs if p.info.estimated_bytes is not None]
    label = f"{len(subs)} tables ({', '.join(p.info.label for p in subs[:3])}{', ...' if len(subs) > 3 else ''})"
    info = SourceInfo(schema=pa.schema([]), label=label, estimated_rows=sum(rows) if rows else None,
                      estimated_bytes=sum(sizes) if sizes else None)
    note(f"plan: {len(subs)} tables in one snapshot, largest first: {', '.join(p.partitions[0].table for p in subs)}")
    return JobPlan(spec=spec, info=info, partitions=[p for sub in subs for p in sub.partitions],
                   degree=resolve_degree(spec.runtime, spec.options.degree), note=f"{len(subs)} tables", tables=tuple(subs))


def _one_target_each(seen: dict[str, str], sink: Any, table: str) -> None:
    """Two source tables may not load into one target (schemas with tables of the same name, and a
    template without ``{schema}``): sinks are built as ``cls(config, options)``, and two equal
    configs aim at one target."""
    config = getattr(sink, "config", None)
    if config is None:
        return
    where = repr(config)
    if where in seen:
        raise ConfigError(f"source.tables: {seen[where]} and {table} would load into the same target", key="sink.table",
                          hint="name targets by schema too: sink.table='{schema}_{table}' (or sink.path with {schema})")
    seen[where] = table


def resumed(plan: JobPlan, resume: str, partitions: list[Any], done: dict[str, int], marks: dict[str, Any] | None = None) -> JobPlan:
    """A job over several tables resumed: each table takes its saved partitions and what finished of them."""
    by_table: dict[str, list[Any]] = {}
    for p in partitions:
        by_table.setdefault(p.table, []).append(p)
    known = {sub.partitions[0].table: sub for sub in plan.tables if sub.partitions}
    missing = sorted(set(by_table) - set(known))
    if missing:
        raise ConfigError(f"resume: table(s) {', '.join(missing)} of that run are not among source.tables now", key="resume",
                          hint="resume with the same tables (or run the job afresh)")
    subs = tuple(dataclasses.replace(known[t], partitions=parts, resumed_from=resume,
                                     previously_done={p.key: done[p.key] for p in parts if p.key in done},
                                     resumed_mark=(marks or {}).get(t))
                 for t, parts in by_table.items())
    return dataclasses.replace(plan, tables=subs, partitions=[p for sub in subs for p in sub.partitions], resumed_from=resume,
                               previously_done=done, note=f"resumed from {resume}")


def execute_tables(plan: JobPlan, report: JobReport, progress: Any, start: float) -> JobReport:
    """Prepare every table's target, run all their tasks in one pool, verify every table, then finalize each."""
    clock = Phases(report.phases)
    loads = [Load(sub, sub.spec.source, progress, JobReport(plan=sub)) for sub in plan.tables]
    report.tables = [load.report for load in loads]
    finalized = 0
    try:
        for load in loads:  # every target checked (and staged) before a row moves
            load.prepare()
        report.target = _targets(report)
        clock.lap("prepare")
        tasks = [task for load in loads for task in load.tasks()]
        report.committed_before = {k for load in loads for k in load.report.committed_before}
        clock.lap("count source")
        results = {r.partition: r for r in plan.spec.runtime.run(tasks, plan.degree, progress)}
        for load in loads:
            load.conclude([results[p.key] for p in load.todo if p.key in results])
        report.results = [r for load in loads for r in load.report.results]
        clock.lap("tasks")
        stopped(report)
        for load in loads:  # every table checked before any is made visible
            load.verify()
        report.verification = combined([load.report for load in loads])
        clock.lap("verify")
        for load in loads:
            load.finalize()
            finalized += 1
        _foreign_keys(loads)
        clock.lap("finalize")
    except BaseException as exc:
        for load in loads[finalized:]:
            load.abort()
        if finalized and isinstance(exc, Exception):
            done = ", ".join(load.report.target for load in loads[:finalized])
            note(f"tables made visible before the failure: {done}")
        report.verification = report.verification or combined([load.report for load in loads if load.report.verification])
        stop_clock(report, start)
        if not isinstance(exc, Exception):
            raise
        report.error = exc
        return report
    stop_clock(report, start)
    return report


def _foreign_keys(loads: list[Load]) -> None:
    """The sources' foreign keys between the tables of the job, made between their targets (where the
    sink makes them: PostgreSQL with sink.foreign_keys=true), once every table is loaded."""
    by_source = {load.plan.partitions[0].table: load for load in loads if load.plan.partitions}
    for load in loads:
        sink = load.plan.spec.sink
        keys = [(fk, by_source[fk.referenced].plan.spec.sink) for fk in load.plan.info.foreign_keys if fk.referenced in by_source]
        if keys and isinstance(sink, SupportsForeignKeys) and load.sink_plan is not None:
            for made in sink.add_foreign_keys(load.sink_plan, keys):
                note(f"foreign key: {made}")


def _targets(report: JobReport) -> str:
    names = [t.target for t in report.tables]
    return f"{len(names)} tables: " + (", ".join(names) if len(names) <= 3 else f"{names[0]}, ... {names[-1]}")


def combined(reports: list[JobReport]) -> Verification | None:
    """One verification of every table's: ok when each is; mismatches name their table."""
    checked = [r for r in reports if r.verification is not None]
    if not checked:
        return None
    verifications = [r.verification for r in checked if r.verification is not None]
    out = Verification(verifications[0].mode)
    sources = [v.source_rows for v in verifications]
    out.source_rows = None if None in sources else sum(s or 0 for s in sources)
    for r, v in zip(checked, verifications):
        out.written_rows += v.written_rows
        out.mismatched += [f"{r.target}: {m}" for m in v.mismatched]
        out.notes += [n for n in v.notes if n not in out.notes]
    out.notes.append(f"{len(checked)} tables verified")
    return out


__all__ = ["combined", "execute_tables", "plan_tables", "resumed"]
