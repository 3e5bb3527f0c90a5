"""The flow of one job, on the driver.

describe the source -> plan partitions -> prepare the sink -> execute the tasks on the
runtime -> finalize (or abort) the sink -> report. Nothing connects before the config has
been validated (``conveyor.config.build_job``), and a failed run aborts the sink, which
leaves the target as it was for truncate / create / replace and with whole partitions
only for append.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import (
    Agreement,
    ChecksBeforeRun,
    Counting,
    CursorWindow,
    NullProgress,
    Partition,
    PlanRequest,
    PrepareRequest,
    Progress,
    ReportsStartup,
    RunsTasksHere,
    SinkPlan,
    SourceInfo,
    StartsEarly,
    SupportsCommitMarkers,
    SupportsCursorState,
    SupportsManyTables,
    SupportsNativeWrite,
    SupportsPartitionCounts,
    SupportsSpecialValues,
    SupportsWarmUp,
    SupportsWindow,
    TargetInfo,
    Task,
    TaskResult,
    WriteStats,
    cancel_requested,
    open_session,
    resolve_degree,
    sink_capabilities,
)
from conveyor.errors import Cancelled, ConfigError, ConveyorError, PlanningError
from conveyor.log import note, say, warn
from conveyor.pipelines.agree import agree
from conveyor.pipelines.resume import check_unchanged
from conveyor.pipelines.verify import Verification, check_mode, raise_if_failed, verify
from conveyor.runtime.task import first_failure


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
    #: what the two ends agreed on for this load (``conveyor.pipelines.agree``): prepare follows it
    agreement: Agreement = field(default_factory=Agreement)


@dataclass
class JobReport:
    plan: JobPlan
    results: list[TaskResult] = field(default_factory=list)
    seconds: float = 0.0
    target: str = ""
    sink_plan: SinkPlan | None = None
    #: what stopped a failed run (a ConveyorError, or an error Conveyor did not expect)
    error: Exception | None = None
    verification: Verification | None = None
    #: partitions a resumed run found committed by the run it resumes (not run again)
    committed_before: set[str] = field(default_factory=set)
    #: of ``seconds``, what the runtime spent getting ready (Ray starting or joining an instance)
    startup_seconds: float = 0.0
    #: where the seconds went, phase by phase (plan, prepare, tasks, verify, finalize): a job's fixed
    #: costs against its transfer, in the report
    phases: dict[str, float] = field(default_factory=dict)
    #: where the tasks ran, when the runtime chose other than its usual (Ray running one task in the driver)
    runtime_note: str = ""
    #: a job over several tables: each table's report (its target, partitions, verification)
    tables: list[JobReport] = field(default_factory=list)

    @property
    def transfer_seconds(self) -> float:
        """The run's seconds without the runtime's start-up: what rows/s is measured against."""
        return max(self.seconds - self.startup_seconds, 0.0)

    @property
    def rows(self) -> int:
        """Rows this run moved (partitions committed before it, by an earlier run, not counted)."""
        return sum(r.rows for r in self.moved)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.moved)

    @property
    def moved(self) -> list[TaskResult]:
        return [r for r in self.results if r.partition not in self.committed_before]

    @property
    def ok(self) -> bool:
        return self.error is None


@contextmanager
def opened(spec: JobSpec, described: Callable[[SourceInfo], None] | None = None) -> Iterator[tuple[JobPlan, Any]]:
    """Describe the source, open its session (one snapshot for the job) and plan inside it.

    Yields the plan and the source the tasks get; planning queries (key values, quantiles) see
    the same snapshot as every partition and the verification, so a row written meanwhile is
    either in all of them or in none. ``described`` hears what the source is (its size) as soon as
    that is known: :func:`runtime_started`'s, so that the runtime gets ready while the job plans.
    """
    check(spec)
    if isinstance(spec.source, SupportsManyTables) and spec.source.many():
        from conveyor.pipelines.tables import plan_tables

        with open_session(spec.source) as session:  # one snapshot: every table's partitions read it
            plan = plan_tables(spec, session)
            if described is not None:  # the tables' size is known once each is described
                described(plan.info)
            yield plan, session
        return
    info = spec.source.describe()
    if described is not None:
        described(info)
        _warm_up(spec)
    with open_session(spec.source) as source:
        window = _window(spec, source)
        if window is not None:
            source = source.windowed(window)
        yield plan_one(spec, info, source, window), source


def _warm_up(spec: JobSpec) -> None:
    """Let the source get ready for its reads (SupportsWarmUp) while the job plans and prepares, where
    they will be Arrow reads in this process: a sink that takes no native stream, a runtime that runs
    the tasks here."""
    if (isinstance(spec.source, SupportsWarmUp) and not isinstance(spec.sink, SupportsNativeWrite)
            and isinstance(spec.runtime, RunsTasksHere) and spec.runtime.runs_tasks_here()):
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


def plan_job(spec: JobSpec) -> JobPlan:
    """Describe the source and plan its partitions (in the source's snapshot); moves nothing (a Ray
    cluster joined to count its CPUs is left again)."""
    with runtime_started(spec), opened(spec) as (plan, _):
        return plan


def check(spec: JobSpec) -> None:
    modes = sink_capabilities(spec.sink).load_modes
    if spec.options.load_mode not in modes:
        raise ConfigError(f"load_mode={spec.options.load_mode}: sink {spec.names['sink']} does not do it", key="load_mode",
                          hint=f"its load modes: {', '.join(modes)}")
    if isinstance(spec.runtime, ChecksBeforeRun):
        spec.runtime.check(spec.source, spec.sink)
    check_mode(spec.options.verify, spec.source, spec.sink)


def plan_one(spec: JobSpec, info: SourceInfo, source: Any, window: CursorWindow | None = None) -> JobPlan:
    """One table's plan: the target described (once, read-only), the source split along what it wants
    (its range partitions, its smallest partition), and what the two ends agree on for those partitions."""
    degree = resolve_degree(spec.runtime, spec.options.degree)
    target = (spec.sink.describe_target(PrepareRequest(schema=info.schema_as_given, info=info, window=window))
              if spec.sink is not None else TargetInfo())  # conveyor serve plans a source alone
    planned = spec.strategy.plan(PlanRequest(source=source, info=info, degree=degree, target=target.layout,
                                             min_partition_rows=(target.min_partition_rows, target.min_partition_why)))
    partitions = list(planned.partitions)
    if not partitions:
        raise PlanningError(f"strategy {spec.names['strategy']!r} planned no partitions for {info.label}")
    agreement = agree(info, target, spec.options, partitions, source, window)
    chosen = ", ".join(f"{kind}={spec.names[kind]}" for kind in ("runtime", "sink") if kind in spec.names)  # serve has neither
    note(f"plan: {info.label}: {len(partitions)} partition(s), strategy={spec.names['strategy']}, degree={degree}, "
         f"{chosen}, load_mode={spec.options.load_mode}" + (f"; {planned.note}" if planned.note else ""))
    return JobPlan(spec=spec, info=info, partitions=partitions, degree=degree, note=planned.note, path=agreement.path,
                   window=window, agreement=agreement)


@contextmanager
def runtime_started(spec: JobSpec) -> Iterator[Callable[[SourceInfo], None]]:
    """The runtime gets ready (Ray's private instance starts) while the job plans and prepares:
    yields what :func:`opened` calls once the source is described (the runtime then knows the job's
    size); what the runtime started and the tasks did not use is stopped on the way out."""
    runtime = spec.runtime if isinstance(spec.runtime, StartsEarly) else None

    def described(info: SourceInfo) -> None:
        if runtime is not None:
            runtime.start_early(spec.options.degree, info.estimated_bytes)

    try:
        yield described
    finally:
        if runtime is not None:
            runtime.release()


def run_job(spec: JobSpec, progress: Progress | None = None) -> JobReport:
    """Plan and run a whole job (the library's entry point); raises the error that stopped it,
    after aborting the sink. ``conveyor.pipelines.run`` is the CLI's, with report and manifest."""
    start = time.perf_counter()
    with runtime_started(spec) as described, opened(spec, described) as (plan, source):
        report = execute(plan, progress, start, source)
    if report.error is not None:
        raise report.error
    return report


def execute(plan: JobPlan, progress: Progress | None = None, start: float | None = None, source: Any = None) -> JobReport:
    """Prepare the sink, run the planned partitions, finalize; abort the sink on any failure.

    Always returns the report: ``report.error`` says what stopped a failed run (the sink was
    aborted). ``source`` is the session's source from :func:`opened`; without it a session is
    opened here.
    """
    start = time.perf_counter() if start is None else start
    progress = progress or NullProgress()
    if source is not None:
        return _execute(plan, source, progress, start)
    with open_session(plan.spec.source) as session:
        return _execute(plan, session, progress, start)


def _execute(plan: JobPlan, source: Any, progress: Progress, start: float) -> JobReport:
    report = JobReport(plan=plan)
    report.phases["plan"] = round(time.perf_counter() - start, 4)  # describing and planning, since the job's start
    if plan.tables:
        from conveyor.pipelines.tables import execute_tables

        return execute_tables(plan, report, progress, start)
    clock = Phases(report.phases)
    load = Load(plan, source, progress, report)
    try:
        load.prepare()
    except Exception as exc:  # nothing was prepared: nothing to abort
        report.error, report.seconds = exc, time.perf_counter() - start
        return report
    clock.lap("prepare")
    try:
        tasks = load.tasks()
        if load.counted:
            clock.lap("count source")
        load.conclude(plan.spec.runtime.run(tasks, plan.degree, progress))
        clock.lap("tasks")
        stopped(report)
        load.verify()
        clock.lap("verify")
        load.finalize()
        clock.lap("finalize")
    except BaseException as exc:
        load.abort()
        stop_clock(report, start)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not a failed run but a leaving process
            raise
        report.error = exc
        return report
    stop_clock(report, start)
    return report


def stopped(report: JobReport) -> None:
    """Raise what stops the run after its tasks: a Ctrl-C, or the first failed partition (with what
    the run left in the target)."""
    if cancel_requested():
        raise _cancelled(report)
    failed = first_failure(report.results)
    if failed is not None:
        err = failed.error
        assert err is not None
        err.task_traceback = failed.traceback  # shown by --verbose
        raise _with_committed(err, report)


class Load:
    """One target's load within a run: its sink prepared, its tasks, their results reconciled with
    the target, verified, then finalized (or aborted). A job over several tables has one per table."""

    def __init__(self, plan: JobPlan, source: Any, progress: Progress, report: JobReport) -> None:
        self.plan, self.source, self.progress, self.report = plan, source, progress, report
        self.sink_plan: SinkPlan | None = None
        self.todo: list[Partition] = []
        self.before: list[TaskResult] = []
        self.counted = False

    def prepare(self) -> None:
        spec, plan = self.plan.spec, self.plan
        agreed = plan.agreement
        made = spec.sink.prepare(PrepareRequest(schema=plan.info.schema_as_given, info=plan.info, partitions=len(plan.partitions),
                                                window=plan.window, agreement=agreed))
        # what was agreed, on the plan the tasks get (the sink's own details of how it writes after the path)
        sink_plan = dataclasses.replace(made, native=agreed.native, checks_before_commit=agreed.checks_before_commit,
                                        counting=agreed.counting, path=agreed.path,
                                        path_reason="; ".join(x for x in (agreed.path, made.path_reason) if x))
        self.report.target, self.report.sink_plan, self.sink_plan = sink_plan.target, sink_plan, sink_plan
        if sink_plan.path_reason:
            note(f"path: {sink_plan.path_reason}")
        if plan.info.reader and not sink_plan.native:
            note(f"source: {plan.info.reader}")
        if sink_plan.keeps and isinstance(self.source, SupportsSpecialValues):
            self.source = self.source.keeping(sink_plan.keeps)  # e.g. infinity passed on, not refused

    def tasks(self) -> list[Task]:
        """The tasks of the partitions not committed before (by the run this one resumes)."""
        spec, plan = self.plan.spec, self.plan
        assert self.sink_plan is not None
        done, whose = _already_done(plan, spec.sink, self.sink_plan)
        self.report.committed_before = set(done)
        if plan.resumed_from:
            of = f" of {plan.info.label}" if _in_many(plan) else ""
            say(f"resume: {len(done)} of {len(plan.partitions)} partitions{of} finished in {plan.resumed_from} (per {whose}); "
                f"running the other {len(plan.partitions) - len(done)}")
        if plan.resumed_from:
            check_unchanged(plan, self.source, done, plan.resumed_mark)
        self.todo = [p for p in plan.partitions if p.key not in done]
        # the partitions this run writes (a resumed file append counts only their files)
        sink_plan = dataclasses.replace(self.sink_plan, to_write=tuple(p.index for p in self.todo))
        self.before = [TaskResult(p.key, p.index, rows=done[p.key], already_committed=True) for p in plan.partitions if p.key in done]
        for result in self.before:
            self.progress.finished(result)
        self.sink_plan = _counted(sink_plan, self.todo, self.source)
        self.report.sink_plan = self.sink_plan
        self.counted = self.sink_plan.counting == Counting.BEFORE
        return [Task(self.source, spec.sink, self.sink_plan, part) for part in self.todo]

    def conclude(self, results: list[TaskResult]) -> None:
        """The tasks' results, as the target has them (commit markers), logged."""
        assert self.sink_plan is not None
        self.report.results = _reconciled(sorted(self.before + results, key=lambda r: r.index), self.plan.spec.sink, self.sink_plan)
        _log_results(self.report.results)

    def verify(self) -> None:
        spec, report = self.plan.spec, self.report
        assert self.sink_plan is not None
        ran = [r for r in report.results if r.partition not in report.committed_before]
        report.verification = verify(spec.options.verify, self.todo, ran, self.source, spec.sink, self.sink_plan)
        raise_if_failed(report.verification, report.target)

    def finalize(self) -> None:
        assert self.sink_plan is not None
        self.plan.spec.sink.finalize(self.sink_plan, [WriteStats(r.partition, r.rows, r.bytes, r.seconds) for r in self.report.results])

    def abort(self) -> None:
        if self.sink_plan is not None:
            _abort(self.plan.spec.sink, self.sink_plan)


def _in_many(plan: JobPlan) -> bool:
    """A table's plan within a job over several tables (its partitions name their table)."""
    return bool(plan.partitions) and bool(plan.partitions[0].table)


class Phases:
    """Laps of the driver's clock, each written into ``phases`` under its name."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.last = phases, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.last, 4)
        self.last = now


def _counted(sink_plan: SinkPlan, todo: list[Partition], source: Any) -> SinkPlan:
    """Where the agreement counts the source before the tasks: its partitions counted, in the job's
    snapshot (a source that cannot, after all, is counted after the tasks)."""
    if sink_plan.counting != Counting.BEFORE:
        return sink_plan
    counts = source.count_rows(todo) if isinstance(source, SupportsPartitionCounts) else None
    if counts is None:
        return dataclasses.replace(sink_plan, counting=Counting.AFTER)
    return dataclasses.replace(sink_plan, expected_rows={p.key: n for p, n in zip(todo, counts)})


def stop_clock(report: JobReport, start: float) -> None:
    """The run's seconds, and of them the runtime's start-up (reported apart, not in rows/s)."""
    report.seconds = time.perf_counter() - start
    runtime = report.plan.spec.runtime
    if isinstance(runtime, ReportsStartup):
        report.startup_seconds = min(runtime.startup_seconds(), report.seconds)
    report.runtime_note = getattr(runtime, "report_note", "") or ""


def _reconciled(results: list[TaskResult], sink: Any, sink_plan: SinkPlan) -> list[TaskResult]:
    """The results as the target has them. A task stopped after its commit (its worker killed when
    another partition failed, or on Ctrl-C, between COMMIT and returning) reports no rows, yet its
    rows are in the target: where the sink keeps commit markers (written in the partition's own
    transaction), they decide, so the run's message, report and manifest say what really stayed."""
    if all(r.ok for r in results) or not isinstance(sink, SupportsCommitMarkers):
        return results
    try:
        marked = sink.committed(sink_plan)
    except Exception as exc:  # the partition's own error matters more; say the count may be short
        warn(f"could not read the target's commit markers to confirm what the stopped partitions left: {exc}")
        return results
    if not marked:
        return results
    return [dataclasses.replace(r, rows=marked[r.partition], error=None, cancelled=False, traceback=None,
                                notes=(*r.notes, "its worker was stopped after the commit: the target's commit marker has it"))
            if not r.ok and r.partition in marked else r for r in results]


def _log_results(results: list[TaskResult]) -> None:
    """Each partition's outcome, with the task's own notes (where it ran, what it retried) and a
    failed one's traceback: the run's log has them whichever process ran the task."""
    for r in results:
        if r.already_committed:
            outcome = f"committed before ({r.rows:,} rows)"
        elif r.ok:
            outcome = f"{r.rows:,} rows in {r.seconds:.2f} s"
        else:
            outcome = ("cancelled: " if r.cancelled else "failed: ") + str(r.error)
        note(f"partition {r.partition}: {outcome}, attempts {r.attempts}" + "".join(f"; {n}" for n in r.notes))
        if r.traceback:
            note(f"partition {r.partition}: the task's traceback:\n{r.traceback.rstrip()}")


def _already_done(plan: JobPlan, sink: Any, sink_plan: SinkPlan) -> tuple[dict[str, int], str]:
    """Partitions committed before this run, and whose word that is: the target's own commit markers
    where the sink keeps them (they commit with the rows, so they are right whatever died when),
    else the manifest's."""
    if not plan.resumed_from:
        return {}, ""
    if isinstance(sink, SupportsCommitMarkers):
        marked = sink.committed(sink_plan)
        if marked is not None:
            keys = {p.key for p in plan.partitions}
            return {k: n for k, n in marked.items() if k in keys}, "the target's commit markers"
    return dict(plan.previously_done), "its manifest"


RESUME_HINT = "resume=<run dir>"


def committed_note(report: JobReport) -> str:
    """What a stopped run left in the target: whole partitions (append) or nothing (staged loads)."""
    done = [r for r in report.results if r.ok]
    if report.plan.spec.options.load_mode != "append":
        if done and report.sink_plan is not None and report.sink_plan.checks_before_commit:  # a truncate in one transaction
            return f"the load had committed before it stopped: the target holds its {sum(r.rows for r in done):,} new rows"
        return "the target is as it was"
    if not done:
        return "no partition had committed: the target is as it was"
    return (f"{len(done)} of {len(report.plan.partitions)} partitions had committed: "
            f"their {sum(r.rows for r in done):,} rows stay in the target")


def _resume_hint(report: JobReport) -> str:
    if report.plan.spec.options.load_mode != "append":
        return "run it again" + ("" if any(r.ok for r in report.results) else ": nothing was changed")
    if not any(r.ok for r in report.results):
        return "run it again when the cause is fixed"
    # running the job again from the start would load the committed partitions a second time
    return f"do not simply run it again (the committed rows would be loaded twice): run it with {RESUME_HINT} to load only the rest"


def _cancelled(report: JobReport) -> Cancelled:
    return Cancelled(f"cancelled: {committed_note(report)}", hint=_resume_hint(report))


def _with_committed(err: ConveyorError, report: JobReport) -> ConveyorError:
    """A partition's error, saying what the run left in the target and how to go on."""
    if report.plan.spec.options.load_mode == "append" and not err.committed_noted:
        err.message = f"{err.message} ({committed_note(report)})"
        err.args = (err.message,)
        err.hint = f"{err.hint}; then {_resume_hint(report)}" if err.hint else _resume_hint(report)
        err.committed_noted = True
    return err


def _abort(sink: Any, plan: Any) -> None:
    try:
        sink.abort(plan)
    except Exception:  # the original error matters more; abort is best effort
        pass
