"""The flow of one job, on the driver.

describe the source -> plan partitions -> prepare the sink -> execute the tasks on the
runtime -> finalize (or abort) the sink -> report. Nothing connects before the config has
been validated (``conveyor.config.build_job``), and a failed run aborts the sink, which
leaves the target as it was for truncate / create / replace and with whole partitions
only for append.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import Partition, PlanRequest, PrepareRequest, SinkPlan, SourceInfo, WriteStats
from conveyor.errors import Cancelled, ConveyorError, PlanningError
from conveyor.pipelines.verify import Verification, check_mode, raise_if_failed, verify
from conveyor.runtime.task import NullProgress, Progress, Task, TaskResult, cancel_requested


@dataclass(frozen=True)
class JobPlan:
    spec: JobSpec
    info: SourceInfo
    partitions: list[Partition]
    #: what the strategy chose and why (strategy=auto explains its choice)
    note: str = ""
    #: the data path the sink expects to take (e.g. a native pass-through), when it says
    path: str = ""


@dataclass
class JobReport:
    plan: JobPlan
    results: list[TaskResult] = field(default_factory=list)
    seconds: float = 0.0
    target: str = ""
    sink_plan: SinkPlan | None = None
    error: ConveyorError | None = None
    verification: Verification | None = None

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.results)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.results)

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_job(spec: JobSpec) -> JobPlan:
    """Describe the source and plan its partitions; moves nothing."""
    if hasattr(spec.runtime, "check"):
        spec.runtime.check(spec.source, spec.sink)
    check_mode(spec.options.verify, spec.source, spec.sink)
    info = spec.source.describe()
    partitions = spec.strategy.plan(PlanRequest(source=spec.source, info=info, degree=spec.options.degree))
    if not partitions:
        raise PlanningError(f"strategy {spec.names['strategy']!r} planned no partitions for {info.label}")
    note = spec.strategy.explain() if hasattr(spec.strategy, "explain") else ""
    path = ""
    if hasattr(spec.sink, "explain_path"):
        path = spec.sink.explain_path(PrepareRequest(schema=info.schema, info=info, source=spec.source))
    return JobPlan(spec=spec, info=info, partitions=partitions, note=note, path=path)


def run_job(spec: JobSpec, progress: Progress | None = None) -> JobReport:
    """Plan and run a whole job. Raises the first error after aborting the sink."""
    start = time.perf_counter()
    return execute(plan_job(spec), progress, start)


def execute(plan: JobPlan, progress: Progress | None = None, start: float | None = None) -> JobReport:
    """Prepare the sink, run the planned partitions, finalize; abort the sink on any failure."""
    start = time.perf_counter() if start is None else start
    spec = plan.spec
    progress = progress or NullProgress()
    with source_session(spec.source) as source:
        if hasattr(progress, "session_started"):
            progress.session_started(source)
        return _execute(plan, source, progress, start)


def source_session(source: Any) -> Any:
    """A source may hold something for the whole job (a snapshot); it yields what tasks get."""
    session = getattr(source, "session", None)
    return session() if session is not None else nullcontext(source)


def _execute(plan: JobPlan, source: Any, progress: Progress, start: float) -> JobReport:
    spec = plan.spec
    report = JobReport(plan=plan)
    try:
        sink_plan = spec.sink.prepare(PrepareRequest(schema=plan.info.schema, info=plan.info, source=source))
    except ConveyorError as exc:
        exc.report = report
        raise
    report.target, report.sink_plan = sink_plan.target, sink_plan
    tasks = [Task(source, spec.sink, sink_plan, part) for part in plan.partitions]
    try:
        report.results = spec.runtime.run(tasks, spec.options.degree, progress)
        if cancel_requested():
            raise _cancelled(report)
        failures = [r for r in report.results if not r.ok]
        if failures:
            err = failures[0].error
            assert err is not None
            err.task_traceback = failures[0].traceback  # shown by --verbose
            raise err
        report.verification = verify(spec.options.verify, plan.partitions, report.results, source, spec.sink, sink_plan)
        raise_if_failed(report.verification, report.target)
        stats = [WriteStats(r.partition, r.rows, r.bytes, r.seconds) for r in report.results]
        spec.sink.finalize(sink_plan, stats)
    except BaseException as exc:
        _abort(spec.sink, sink_plan)
        report.seconds = time.perf_counter() - start
        if isinstance(exc, ConveyorError):
            report.error = exc
            exc.report = report  # the CLI writes it
        raise
    report.seconds = time.perf_counter() - start
    return report


def _cancelled(report: JobReport) -> Cancelled:
    done = [r for r in report.results if r.ok]
    if report.plan.spec.options.load_mode == "append":
        what = f"{len(done)} of {len(report.plan.partitions)} partitions had committed: their {sum(r.rows for r in done):,} rows stay in the target"
    else:
        what = "the target is as it was"
    return Cancelled(f"cancelled: {what}", hint="run again to load everything")


def _abort(sink: Any, plan: Any) -> None:
    try:
        sink.abort(plan)
    except Exception:  # noqa: BLE001 - the original error matters more; abort is best effort
        pass
