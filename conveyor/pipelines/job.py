"""The flow of one job, on the driver: a job is N >= 1 table loads, run in one loop.

plan (``conveyor.pipelines.plan``: describe the source and the target, split, agree) -> prepare every
load's sink -> run all their tasks in one pool on the runtime -> verify every load -> finalize each
(or abort every one not finalized) -> report. Nothing connects before the config has been validated
(``conveyor.config.build_job``), and a failed run aborts its loads, which leaves each target as it
was for truncate / create / replace and with whole partitions only for append. A job over several
tables has a load per table (``source.tables``), one snapshot and one pool for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import (
    NullProgress,
    Progress,
    SinkPlan,
    SourceInfo,
    TaskResult,
    cancel_requested,
)
from conveyor.errors import Cancelled, ConveyorError
from conveyor.log import note
from conveyor.pipelines import threads
from conveyor.pipelines.load import Load
from conveyor.pipelines.plan import RESUME_HINT, JobPlan, opened
from conveyor.pipelines.verify import Verification
from conveyor.runtime.task import first_failure


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
    #: a sync job (``incremental.method=replication``): its slot, position and runs (``conveyor.pipelines.syncreport.SyncReport``);
    #: the partitions above are its first load's, or its last run's stage loads' (``tables``)
    sync: Any = None

    def lines(self) -> list[str]:
        """What the run says after its summary table (a sync job: where its targets are now)."""
        return self.sync.lines() if self.sync is not None else []

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


def plan_job(spec: JobSpec) -> JobPlan:
    """Describe the source and plan its partitions (in the source's snapshot); moves nothing (a Ray
    cluster joined to count its CPUs is left again)."""
    with runtime_started(spec), opened(spec) as (plan, _):
        return plan


@contextmanager
def runtime_started(spec: JobSpec) -> Iterator[Callable[[SourceInfo], None]]:
    """The runtime gets ready (Ray's private instance starts) while the job plans and prepares:
    yields what :func:`opened` calls once the source is described (the runtime then knows the job's
    size); what the runtime started and the tasks did not use is stopped on the way out."""
    def described(info: SourceInfo) -> None:
        spec.runtime.start_early(spec.options.degree, info.estimated_bytes)

    try:
        yield described
    finally:
        spec.runtime.release()


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
    from conveyor.telemetry import Traced

    start = time.perf_counter() if start is None else start
    traced = Traced(plan, start)  # OpenTelemetry's spans and metrics of the job, where it is installed
    progress = traced.progress(progress or NullProgress())
    try:
        if source is not None:
            report = _execute(plan, source, progress, start)
        else:
            with plan.spec.source.session() as session:
                report = _execute(plan, session, progress, start)
    except BaseException:
        traced.done(JobReport(plan=plan, error=RuntimeError("the job's process is leaving")))
        raise
    traced.done(report)
    return report


def _execute(plan: JobPlan, source: Any, progress: Progress, start: float) -> JobReport:
    """Every load of the job through one loop (see the module's docstring): a job of one table is its own
    load and its report the job's; a job over several has a load, and a report, per table."""
    report = JobReport(plan=plan)
    report.phases["plan"] = round(time.perf_counter() - start, 4)  # describing and planning, since the job's start
    clock = Phases(report.phases)
    loads = ([Load(sub, sub.spec.source, progress, JobReport(plan=sub)) for sub in plan.tables] if plan.tables
             else [Load(plan, source, progress, report)])
    many = bool(plan.tables)
    if many:
        report.tables = [load.report for load in loads]
    finalized: list[Load] = []
    workers = threads.workers(plan.degree, len(loads))
    try:
        threads.each(loads, Load.prepare, workers)  # every target checked (and staged) before a row moves
        if many:
            report.target = _targets(report)
        clock.lap("prepare")
        tasks = [task for load in loads for task in load.tasks()]
        report.committed_before = {k for load in loads for k in load.report.committed_before}
        if any(load.counted for load in loads):
            clock.lap("count source")
        results = {r.partition: r for r in plan.spec.runtime.run(tasks, plan.degree, progress)}
        for load in loads:
            load.conclude([results[p.key] for p in load.todo if p.key in results])
        if many:
            report.results = [r for load in loads for r in load.report.results]
        clock.lap("tasks")
        stopped(report)
        threads.each(loads, Load.verify, workers)  # every table checked before any is made visible
        if many:
            report.verification = combined([load.report for load in loads])
        clock.lap("verify")
        threads.each(loads, Load.finalize, workers, done=finalized)
        _foreign_keys(loads)
        clock.lap("finalize")
    except BaseException as exc:
        for load in loads:
            if load not in finalized:
                load.abort()
        if many and finalized and isinstance(exc, Exception):
            made = [load.report.target for load in loads if load in finalized]
            note(f"tables made visible before the failure: {', '.join(made)}")
        if many:
            report.verification = report.verification or combined([load.report for load in loads if load.report.verification])
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


class Phases:
    """Laps of the driver's clock, each written into ``phases`` under its name."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.last = phases, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.last, 4)
        self.last = now


def stop_clock(report: JobReport, start: float) -> None:
    """The run's seconds, and of them the runtime's start-up (reported apart, not in rows/s)."""
    report.seconds = time.perf_counter() - start
    runtime = report.plan.spec.runtime
    report.startup_seconds = min(runtime.startup_seconds(), report.seconds)
    report.runtime_note = runtime.report_note


def _foreign_keys(loads: list[Load]) -> None:
    """The sources' foreign keys between the tables of the job, made between their targets (where the
    sink makes them: PostgreSQL with sink.foreign_keys=true), once every table is loaded."""
    by_source = {load.plan.partitions[0].table: load for load in loads if load.plan.partitions}
    for load in loads:
        sink = load.plan.spec.sink
        keys = [(fk, by_source[fk.referenced].plan.spec.sink) for fk in load.plan.info.foreign_keys if fk.referenced in by_source]
        if keys and load.sink_plan is not None:
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
