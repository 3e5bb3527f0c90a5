"""One owner for a run: compose -> plan -> prepare -> execute -> verify -> finalize -> report -> manifest.

:func:`run` takes a composed config and where the run keeps its files (:class:`RunPlace`), and
either returns the run's report or raises one :class:`~conveyor.errors.JobFailed` that carries
it (``report.json`` is written either way). :func:`plan_run` plans and moves nothing. The CLI
parses arguments, calls these and prints; it decides nothing about the run.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.core import NullProgress, Progress, reset_cancel
from conveyor.errors import Cancelled, ConveyorError, JobFailed
from conveyor.log import note, say
from conveyor.pipelines.job import JobReport, execute, plan_job, runtime_started
from conveyor.pipelines.manifest import Manifest, Previous, load_for_resume
from conveyor.pipelines.plan import RESUME_HINT, JobPlan, opened, resumed
from conveyor.pipelines.report import report_dict
from conveyor.pipelines.resume import marks

#: builds the run's progress display once the plan is known (a context manager yielding a Progress)
ProgressFactory = Callable[[JobPlan], ContextManager[Progress]]


@dataclass(frozen=True)
class RunPlace:
    """Where a run keeps its files: ``run_dir`` gets manifest.json (what resume reads) and, unless
    ``report_path`` says otherwise, report.json. Neither: the run writes no file."""

    run_dir: Path | None = None
    report_path: Path | None = None

    @property
    def report(self) -> Path | None:
        return self.report_path or (self.run_dir / "report.json" if self.run_dir is not None else None)


def plan_run(cfg: Any) -> JobPlan:
    """Validate, describe the source and plan its partitions (in its snapshot); moves nothing. A sync job's plan says
    its slot and where its targets are (``JobPlan.lines``)."""
    import dataclasses

    from conveyor.config import build_job

    spec = build_job(cfg)
    plan = plan_job(spec)
    if spec.incremental.method == "replication":
        from conveyor.pipelines import sync

        plan = dataclasses.replace(plan, lines=tuple(sync.plan_lines(spec)))
    return plan


def clean(cfg: Any, drop: bool) -> list[str]:
    """``conveyor clean``: what a job left behind (a sink's staging objects of runs that are gone; a sync job's slot,
    publication and state), removed with ``drop``; the lines to print."""
    from conveyor.config import build_job
    from conveyor.core import SupportsCleanup

    if (cfg.get("incremental") or {}).get("method") == "replication":
        from conveyor.pipelines.sync import leftovers

        found = leftovers(build_job(cfg), remove=drop)
        if not found:
            return ["no slot, publication or sync state found"]
        return found + ([] if drop else ["run again with --drop to drop them (the next run then loads the tables again)"])
    spec = build_job(cfg, kinds=("sink",))
    if not isinstance(spec.sink, SupportsCleanup):
        return [f"sink {spec.names['sink']}: keeps no staging objects to clean"]
    found = spec.sink.leftovers(remove=drop)
    if not found:
        return ["no staging tables found"]
    return found + ([] if drop else ["run again with --drop to remove the stale ones (tables in use by a running job are kept)"])


def run(cfg: Any, place: RunPlace = RunPlace(), progress: ProgressFactory | None = None) -> JobReport:
    """Run the job ``cfg`` describes (resuming ``cfg.resume`` when set); return its report, or
    raise :class:`JobFailed` carrying it after the sink was aborted. report.json is written either way."""
    from conveyor.config import build_job
    from conveyor.submit import receive_env

    config = _plain(cfg)
    started = time.time()
    _note_start(place)
    forwarded = receive_env()  # a job sent by conveyor submit: runtime.forward_env's values, from the submitter
    if forwarded:
        note(f"runtime.forward_env: {', '.join(forwarded)} handed over by conveyor submit")
    held: dict[str, Any] = {}  # the plan and report as far as the run got
    try:
        _writable(place)
        previous = load_for_resume(str(cfg.resume), config) if cfg.get("resume") else None
        spec = build_job(cfg, load_id=previous.load_id if previous else None)
        reset_cancel()

        def load(spec: Any) -> JobReport:
            start = time.perf_counter()
            with runtime_started(spec) as described, opened(spec, described) as (plan, source):
                held["plan"] = plan = _resumed(plan, str(cfg.get("resume") or ""), previous)
                with (progress or _no_progress)(plan) as shown:
                    with _manifest(place, plan, config, shown, source) as manifest:
                        held["report"] = report = execute(plan, manifest or shown, start, source=source)
            if report.error is not None:
                raise report.error
            return report

        if spec.incremental.method == "replication":
            return _sync(spec, place, load, config, started)
        report = load(spec)
    except Exception as exc:
        _name_run_dir(exc, place)
        if not getattr(exc, "report_written", False):  # a sync's applies wrote their own
            _write_report(place, held.get("report"), held.get("plan"), config, exc, started)
        raise JobFailed(exc, held.get("report")) from exc
    _write_report(place, report, held.get("plan"), config, None, started)
    return report


def _sync(spec: Any, place: RunPlace, load: Callable[[Any], JobReport], config: Any, started: float) -> JobReport:
    """A sync job (conveyor.pipelines.sync): its first load and its applies, each through the job loop (``load``);
    report.json rewritten after every run, and once more at the end."""
    from conveyor.pipelines import sync

    if spec.options.load_id:
        raise ConveyorError("resume= does not apply to a sync job: run it again, it goes on from the position its target holds")
    seen: dict[str, Any] = {}

    def written(report: JobReport, status: str = "running", error: BaseException | None = None) -> None:
        seen["report"] = report
        if place.report is not None:
            place.report.parent.mkdir(parents=True, exist_ok=True)
            part = place.report.with_name(place.report.name + ".part")  # replaced whole: a reader never sees half of it
            part.write_text(json.dumps(report_dict(report, None, config, status, error, started), indent=2, default=str))
            part.replace(place.report)

    try:
        if spec.migrate.schema:
            from conveyor.pipelines import migrate

            report = migrate.run(spec, load, written, sync.run)
        else:
            report = sync.run(spec, load, written)
    except BaseException as exc:
        if "report" in seen:
            written(seen["report"], "cancelled" if isinstance(exc, Cancelled) else "failed", exc)
            exc.report_written = True  # type: ignore[attr-defined]
        raise
    written(report, "succeeded")
    if place.report is not None:
        say(f"report: {place.report}")
    return report


def _writable(place: RunPlace) -> None:
    """The report's path can be written, said before anything moves (not after a load committed, as a failure)."""
    from conveyor.errors import ConfigError

    path = place.report_path
    if path is None:
        return
    probe = path.with_name(path.name + ".probe")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--report {path}: cannot be written: {exc.strerror or exc}", key="--report",
                          hint="name a file in a folder this user can write") from None


def _note_start(place: RunPlace) -> None:
    import os
    import socket

    from conveyor import __version__

    note(f"conveyor {__version__}: driver pid {os.getpid()} on {socket.gethostname()}"
         + (f", run directory {place.run_dir}" if place.run_dir is not None else ""))


def _plain(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False)


def _no_progress(plan: JobPlan) -> ContextManager[Progress]:
    return contextlib.nullcontext(NullProgress())


def _resumed(plan: JobPlan, resume: str, previous: Previous | None) -> JobPlan:
    """The plan of the run being resumed: its partitions (saved predicates) and what it finished."""
    if previous is None:
        return plan
    return resumed(plan, resume, previous.partitions, previous.done, previous.marks)


@contextlib.contextmanager
def _manifest(place: RunPlace, plan: JobPlan, config: Any, progress: Progress, source: Any) -> Any:
    """A progress wrapper that keeps manifest.json in the run directory (None without one)."""
    if place.run_dir is None:
        yield None
        return
    place.run_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(place.run_dir / "manifest.json", config, progress)
    opts = plan.spec.options
    snapshot = source.snapshot_id
    manifest.start(opts.run_id, opts.load, plan.partitions, snapshot, plan.previously_done, marks(plan, source))
    try:
        yield manifest
    finally:
        manifest.close()


def _write_report(place: RunPlace, report: JobReport | None, plan: JobPlan | None, config: Any, error: BaseException | None,
                  started: float | None = None) -> None:
    path = place.report
    if path is None:
        return
    status = "succeeded" if error is None else ("cancelled" if isinstance(error, Cancelled) else "failed")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report_dict(report, plan, config, status, error, started), indent=2, default=str))
    except Exception:  # a failed run's own error matters more than its report's
        if error is None:
            raise
        return
    say(f"report: {path}")


def _name_run_dir(exc: BaseException, place: RunPlace) -> None:
    """A hint that says ``resume=<run dir>`` names this run's directory."""
    if isinstance(exc, ConveyorError) and exc.hint and RESUME_HINT in exc.hint and place.run_dir is not None:
        exc.hint = exc.hint.replace(RESUME_HINT, f"resume={place.run_dir}")
