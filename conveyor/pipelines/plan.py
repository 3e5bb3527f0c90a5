"""Planning a job, on the driver: describe the source and the target, split the source into
partitions, agree on the path; for one table or for several (``source.tables``), in one snapshot.

:func:`opened` describes the source, opens its session (one snapshot for the job) and plans inside
it. A job over several tables plans each table as a job of one (:func:`plan_one`), with a source in
the shared snapshot, a target of its own and the job's load id: its plan is theirs together, largest
table first. :func:`resumed` takes the partitions and what finished of a run being resumed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import (
    Agreement,
    CursorWindow,
    Partition,
    PlanRequest,
    PrepareRequest,
    SourceInfo,
    SupportsCursorState,
    SupportsManyTargets,
    SupportsWindow,
    TargetInfo,
    resolve_degree,
    sink_capabilities,
)
from conveyor.errors import ConfigError, PlanningError
from conveyor.kit import reuse
from conveyor.log import note
from conveyor.pipelines import threads
from conveyor.pipelines.agree import agree
from conveyor.pipelines.verify import check_checksums, check_mode

#: how a hint names the run directory to resume (the CLI puts the run's own in its place)
RESUME_HINT = "resume=<run dir>"


@dataclass(frozen=True)
class JobPlan:
    spec: JobSpec
    info: SourceInfo
    partitions: list[Partition]
    #: tasks at once: the configured degree resolved once against the runtime (the strategy, the
    #: runtime and the report all get this number)
    degree: int = 1
    #: what the strategy chose and why (strategy=auto explains its choice)
    note: str = ""
    #: the data path the sink expects to take (e.g. a native pass-through), when it says
    path: str = ""
    #: resuming: the run directory resumed, and what its manifest says was committed ({key: rows});
    #: a sink that keeps commit markers answers for itself instead
    resumed_from: str = ""
    previously_done: dict[str, int] = field(default_factory=dict)
    #: resuming: what the source saw in the run resumed (SupportsChangeCheck.change_mark), to tell whether
    #: the partitions it finished are unchanged
    resumed_mark: Any = None
    #: incremental.cursor: the rows this run reads (past the cursor the target last committed)
    window: CursorWindow | None = None
    #: a job over several tables (``source.tables``): each table's own plan (its source, target and
    #: partitions); ``partitions`` is then all of theirs, largest table first
    tables: tuple[JobPlan, ...] = ()
    #: what the target said of itself (``Sink.describe_target``)
    target: TargetInfo = field(default_factory=TargetInfo)
    #: what the two ends agreed on for this load (``conveyor.pipelines.agree``): prepare follows it
    agreement: Agreement = field(default_factory=Agreement)
    #: what ``conveyor plan`` says after the partitions (a sync job: its slot and where its targets are)
    lines: tuple[str, ...] = ()

    @property
    def loads(self) -> tuple[JobPlan, ...]:
        """The table loads of the job: itself for a job of one table, each table's plan for several."""
        return self.tables or (self,)

    def __str__(self) -> str:
        """What ``conveyor plan`` prints: the partitions' table (the first 20, then how many more), its caption (the
        strategy's choice, the data path, the reader) and :attr:`lines`, as plain text."""
        import io

        from rich.console import Console

        from conveyor.pipelines.report import plan_table

        out = io.StringIO()
        console = Console(file=out, width=120, color_system=None, highlight=False)
        console.print(plan_table(self))
        for text in self.lines:
            console.print(text)
        return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())

    def __repr__(self) -> str:
        return (f"<JobPlan {self.info.label}: {len(self.partitions)} partition(s), degree {self.degree}"
                + (f", path: {self.path}" if self.path else "") + ">")


@contextmanager
def opened(spec: JobSpec, described: Callable[[SourceInfo], None] | None = None) -> Iterator[tuple[JobPlan, Any]]:
    """Describe the source, open its session (one snapshot for the job) and plan inside it.

    Yields the plan and the source the tasks get; planning queries (key values, quantiles) see
    the same snapshot as every partition and the verification, so a row written meanwhile is
    either in all of them or in none. ``described`` hears what the source is (its size) as soon as
    that is known: :func:`runtime_started`'s, so that the runtime gets ready while the job plans.
    """
    check(spec)
    with reuse.reusing():  # the driver's connections, reused from step to step and table to table (kit/reuse.py)
        if spec.source.many():
            with spec.source.session() as session:  # one snapshot: every table's partitions read it
                plan = plan_tables(spec, session)
                if described is not None:  # the tables' size is known once each is described
                    described(plan.info)
                yield plan, session
            return
        info = spec.source.describe()
        if described is not None:
            described(info)
            _warm_up(spec, info)
        with spec.source.session() as source:
            window = _window(spec, source)
            if window is not None:
                source = source.windowed(window)
            yield plan_one(spec, info, source, window), source


def _warm_up(spec: JobSpec, info: SourceInfo) -> None:
    """Let the source get ready for its reads (``Source.warm_up``) while the job plans and prepares,
    where they will be Arrow reads in this process: a sink that cannot import the source's native
    format, a runtime that runs the tasks here."""
    native = info.native.format if info.native is not None else None
    takes_native = native is not None and native in sink_capabilities(spec.sink).native_formats
    if not takes_native and spec.runtime.runs_tasks_here():
        spec.source.warm_up()


def _window(spec: JobSpec, source: Any) -> CursorWindow | None:
    """An incremental load's window: past the cursor value the target last committed, up to the
    source's maximum in the job's snapshot; a resumed run takes the window its first run recorded."""
    column = spec.options.cursor
    if not column:
        return None
    if not isinstance(source, SupportsWindow):
        raise ConfigError(f"incremental.cursor: source {spec.names['source']} cannot read a window of its rows", key="incremental.cursor",
                          hint="SQL sources can (PostgreSQL, DuckDB, ADBC); or load every row (leave incremental.cursor unset)")
    if not isinstance(spec.sink, SupportsCursorState):
        raise ConfigError(f"incremental.cursor: sink {spec.names['sink']} keeps no cursor where its loads commit", key="incremental.cursor",
                          hint="PostgreSQL and DuckDB sinks can (the cursor in <schema>._conveyor_cursors), and Parquet and CSV "
                               "sinks (beside their files, in _conveyor_cursors.json)")
    state = spec.sink.cursor_state(column)
    if state.pending is not None:
        if spec.options.load_id and state.pending_load == spec.options.load_id:
            note(f"incremental: resuming the window {state.pending.describe()}")
            return state.pending
        if state.pending_mode == "append" and state.pending_committed:
            raise PlanningError(f"incremental.cursor: the run with load id {state.pending_load} stopped after committing "
                                f"{state.pending_committed} partition(s) of its window ({state.pending.describe()}); a new window "
                                "would load those rows again",
                                hint=f"finish that run first: run it again with {RESUME_HINT} (its run directory); it loads the rest "
                                     "of its window and moves the cursor")
        note(f"incremental: the window of run {state.pending_load} committed nothing: a new window replaces it")
    return CursorWindow(column, state.value, source.cursor_max(column))


def check(spec: JobSpec) -> None:
    modes = sink_capabilities(spec.sink).load_modes
    if spec.options.load_mode not in modes:
        raise ConfigError(f"load_mode={spec.options.load_mode}: sink {spec.names['sink']} does not do it", key="load_mode",
                          hint=f"its load modes: {', '.join(modes)}")
    if spec.runtime is not None:  # conveyor serve plans a source alone
        spec.runtime.check(spec.source, spec.sink)
    check_mode(spec.options.verify)


def plan_one(spec: JobSpec, info: SourceInfo, source: Any, window: CursorWindow | None = None, tables: int = 1) -> JobPlan:
    """One table's plan: the target described (once, read-only), the source split along what it wants
    (its range partitions, its smallest partition), and what the two ends agree on for those partitions."""
    degree = resolve_degree(spec.runtime, spec.options.degree)
    target = (spec.sink.describe_target(PrepareRequest(schema=info.schema_as_given, info=info, window=window))
              if spec.sink is not None else TargetInfo())  # conveyor serve plans a source alone
    if spec.sink is not None:
        check_checksums(spec.options.verify, info, target, spec)
    planned = spec.strategy.plan(PlanRequest(source=source, info=info, degree=degree, target=target.layout,
                                             min_partition_rows=(target.min_partition_rows, target.min_partition_why), tables=tables))
    partitions = list(planned.partitions)
    if not partitions:
        raise PlanningError(f"strategy {spec.names['strategy']!r} planned no partitions for {info.label}")
    agreement = agree(info, target, spec.options, partitions, source, window)
    chosen = ", ".join(f"{kind}={spec.names[kind]}" for kind in ("runtime", "sink") if kind in spec.names)  # serve has neither
    note(f"plan: {info.label}: {len(partitions)} partition(s), strategy={spec.names['strategy']}, degree={degree}, "
         f"{chosen}, load_mode={spec.options.load_mode}" + (f"; {planned.note}" if planned.note else ""))
    return JobPlan(spec=spec, info=info, partitions=partitions, degree=degree, note=planned.note, path=agreement.path,
                   window=window, agreement=agreement, target=target)


def plan_tables(spec: JobSpec, session: Any) -> JobPlan:
    """Each table's plan (in the session's snapshot), and the job's: all their partitions, largest table first."""
    if spec.options.cursor:
        raise ConfigError("incremental.cursor with source.tables: not built yet (one cursor per table)", key="incremental.cursor",
                          hint="run one job per table for incremental loads")
    if not isinstance(spec.sink, SupportsManyTargets):
        raise ConfigError(f"source.tables: sink {spec.names['sink']} cannot give each table a target of its own", key="source.tables",
                          hint="PostgreSQL, MySQL, DuckDB, Parquet and CSV sinks can")
    tables = session.tables()

    def plan_table(numbered: tuple[int, Any]) -> JobPlan:
        i, table = numbered
        options = dataclasses.replace(spec.options, run_id=f"{spec.options.run_id}t{i}", load_id=spec.options.load)
        sub = dataclasses.replace(spec, source=session.for_table(table, options), sink=spec.sink.for_target(table.schema, table.name, options),
                                  options=options)
        check(sub)
        plan = plan_one(sub, sub.source.describe(), sub.source, tables=len(tables))
        return dataclasses.replace(plan, partitions=[dataclasses.replace(p, table=table.qualified) for p in plan.partitions])

    degree = resolve_degree(spec.runtime, spec.options.degree)
    subs = threads.each(list(enumerate(tables)), plan_table, threads.workers(degree, len(tables)))  # latency, not CPU: overlapped
    targets: dict[str, str] = {}
    for table, plan in zip(tables, subs):
        _one_target_each(targets, plan.target.label, table.qualified)
    import pyarrow as pa

    rows = [p.info.estimated_rows for p in subs if p.info.estimated_rows is not None]
    sizes = [p.info.estimated_bytes for p in subs if p.info.estimated_bytes is not None]
    label = f"{len(subs)} tables ({', '.join(p.info.label for p in subs[:3])}{', ...' if len(subs) > 3 else ''})"
    info = SourceInfo(schema=pa.schema([]), label=label, estimated_rows=sum(rows) if rows else None,
                      estimated_bytes=sum(sizes) if sizes else None)
    note(f"plan: {len(subs)} tables in one snapshot, largest first: {', '.join(p.partitions[0].table for p in subs)}")
    return JobPlan(spec=spec, info=info, partitions=[p for sub in subs for p in sub.partitions],
                   degree=degree, note=f"{len(subs)} tables", tables=tuple(subs))


def _one_target_each(seen: dict[str, str], target: str, table: str) -> None:
    """Two source tables may not load into one target (schemas with tables of the same name, and a
    template without ``{schema}``): their targets, as the sink describes them, must differ."""
    if target in seen:
        raise ConfigError(f"source.tables: {seen[target]} and {table} would load into the same target ({target})", key="sink.table",
                          hint="name targets by schema too: sink.table='{schema}_{table}' (or sink.path with {schema})")
    seen[target] = table


def resumed(plan: JobPlan, resume: str, partitions: list[Partition], done: dict[str, int], marks: dict[str, Any]) -> JobPlan:
    """The plan of a run being resumed: its partitions (their saved predicates), what finished of them
    and what the source saw; for a job over several tables, each table takes its own."""
    if not plan.tables:
        return dataclasses.replace(plan, partitions=partitions, resumed_from=resume, previously_done=done,
                                   note=f"resumed from {resume}", resumed_mark=marks.get(""))
    by_table: dict[str, list[Any]] = {}
    for p in partitions:
        by_table.setdefault(p.table, []).append(p)
    known = {sub.partitions[0].table: sub for sub in plan.tables if sub.partitions}
    missing = sorted(set(by_table) - set(known))
    if missing:
        raise ConfigError(f"resume: table(s) {', '.join(missing)} of that run are not among source.tables now", key="resume",
                          hint="resume with the same tables (or run the job afresh)")
    subs = tuple(dataclasses.replace(known[t], partitions=parts, resumed_from=resume,
                                     previously_done={p.key: done[p.key] for p in parts if p.key in done}, resumed_mark=marks.get(t))
                 for t, parts in by_table.items())
    return dataclasses.replace(plan, tables=subs, partitions=[p for sub in subs for p in sub.partitions], resumed_from=resume,
                               previously_done=done, note=f"resumed from {resume}")
