"""One table load within a run, on the driver: its sink prepared as agreed, its tasks (the partitions not
committed before), their results as the target has them, verified, then finalized or aborted. A job
is N >= 1 of them (``conveyor.pipelines.job.execute`` runs them in one loop)."""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.core import (
    Counting,
    Partition,
    PrepareRequest,
    Progress,
    SinkPlan,
    SupportsCommitMarkers,
    SupportsPartitionCounts,
    SupportsTargetCount,
    Task,
    TaskResult,
    WriteStats,
)
from conveyor.log import note, say, warn
from conveyor.pipelines.plan import JobPlan
from conveyor.pipelines.resume import check_unchanged
from conveyor.pipelines.verify import raise_if_failed, verify


class Load:
    """One target's load within a run: its sink prepared, its tasks, their results reconciled with
    the target, verified, then finalized (or aborted). A job over several tables has one per table."""

    def __init__(self, plan: JobPlan, source: Any, progress: Progress, report: Any) -> None:
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
        if sink_plan.keeps:
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
        across = None if self.plan.info.checksums and self.plan.target.checksums else spec  # no checksum both compute: compared
        report.verification = verify(spec.options.verify, self.todo, ran, self.source, spec.sink, self.sink_plan, across)
        if report.committed_before and spec.options.verify != "none":
            _still_held(report, spec.sink, self.sink_plan)
        raise_if_failed(report.verification, report.target)

    def finalize(self) -> None:
        assert self.sink_plan is not None
        self.plan.spec.sink.finalize(self.sink_plan, [WriteStats(r.partition, r.rows, r.bytes, r.seconds) for r in self.report.results])

    def abort(self) -> None:
        if self.sink_plan is not None:
            _abort(self.plan.spec.sink, self.sink_plan)


def _still_held(report: Any, sink: Any, sink_plan: SinkPlan) -> None:
    """A resumed append: the target must still hold at least every row this load committed, the run it resumes' partitions
    with this run's (checked against what the target holds now, not what the resumed part added: rows lost from the target
    since the run it resumes are a difference, not an "ok")."""
    out = report.verification
    if sink_plan.load_mode != "append":
        return
    if not isinstance(sink, SupportsTargetCount) or not isinstance(sink, SupportsCommitMarkers) or sink.committed(sink_plan) is None:
        # a target without commit markers (files: a resumed append writes its own files again, and counts those)
        out.notes.append("the partitions committed by the run it resumes were not counted again in the target")
        return
    held = sink.target_rows(sink_plan)
    if held is None:
        return
    committed = sum(r.rows for r in report.results)
    out.notes.append(f"the target holds {held:,} rows: at least the {committed:,} this load committed, the run it resumes' included")
    if held < committed:
        out.mismatched.append(f"target: {held:,} rows, fewer than the {committed:,} this load committed into it (rows of the partitions "
                              "the run it resumes committed are gone from it)")


def _in_many(plan: JobPlan) -> bool:
    """A table's plan within a job over several tables (its partitions name their table)."""
    return bool(plan.partitions) and bool(plan.partitions[0].table)


def _counted(sink_plan: SinkPlan, todo: list[Partition], source: Any) -> SinkPlan:
    """Where the agreement counts the source before the tasks: its partitions counted, in the job's
    snapshot (a source that cannot, after all, is counted after the tasks)."""
    if sink_plan.counting != Counting.BEFORE:
        return sink_plan
    counts = source.count_rows(todo) if isinstance(source, SupportsPartitionCounts) else None
    if counts is None:
        return dataclasses.replace(sink_plan, counting=Counting.AFTER)
    return dataclasses.replace(sink_plan, expected_rows={p.key: n for p, n in zip(todo, counts)})


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


def _abort(sink: Any, plan: Any) -> None:
    try:
        sink.abort(plan)
    except Exception:  # the original error matters more; abort is best effort
        pass
