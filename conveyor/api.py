"""Conveyor from Python: :func:`run` and :func:`plan` take what the command line takes.

    import conveyor

    report = conveyor.run("pg_to_pg", "source.table=orders", sink={"table": "orders_copy"}, load_mode="create")
    print(report.rows, report.verification.ok)
    plan = conveyor.plan("postgres_to_parquet", source={"table": "orders"}, sink={"path": "out/orders"})

A job is a pipeline's name (``configs/pipeline/*.yaml``, or none for the bare defaults), the command
line's overrides as strings, and nested values as keywords (``source={...}``, ``load_mode=...``) put on
top of them: the same names and values as ``conveyor run``. A keyword node naming another ``type``
than the pipeline's replaces that node whole (its keys are the new plugin's).

Made for notebooks, orchestrators and threads: nothing here installs a signal handler or exits the
process; a failed job raises its :class:`~conveyor.errors.ConveyorError` (``exc.report``: the run's
report as far as it got), never ``SystemExit``; jobs run one after another in one process, or from
a thread. ``run_dir`` keeps ``report.json`` and ``manifest.json`` (what ``resume`` reads) there;
``progress=True`` prints a progress line on stderr every 10 seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conveyor.errors import ConveyorError, JobFailed

__all__ = ["run", "plan", "compose"]


def compose(pipeline: str | None = None, *overrides: str, **config: Any) -> Any:
    """The job's config (an OmegaConf node) as ``conveyor run`` composes it, with ``config`` on top."""
    from omegaconf import OmegaConf

    from conveyor.submit import compose as hydra_compose

    cfg = hydra_compose([*([f"pipeline={pipeline}"] if pipeline else []), *overrides])
    for key, value in config.items():
        node = cfg.get(key)
        if isinstance(value, dict) and node is not None and OmegaConf.is_dict(node) and value.get("type", node.get("type")) == node.get("type"):
            cfg[key] = OmegaConf.merge(node, value)
        else:
            cfg[key] = value
    return cfg


def plan(pipeline: str | None = None, *overrides: str, **config: Any) -> Any:
    """The job's plan (its partitions and what each reads; ``conveyor plan``): moves nothing."""
    from conveyor.pipelines.run import plan_run

    return plan_run(compose(pipeline, *overrides, **config))


def run(pipeline: str | None = None, *overrides: str, run_dir: str | Path | None = None, progress: bool = False,
        **config: Any) -> Any:
    """Run the job; its :class:`~conveyor.pipelines.job.JobReport` (rows, results per partition,
    verification, seconds). A failure raises what stopped it, a ConveyorError, with ``.report``."""
    from conveyor.pipelines.run import RunPlace
    from conveyor.pipelines.run import run as run_job

    cfg = compose(pipeline, *overrides, **config)
    place = RunPlace(run_dir=Path(run_dir) if run_dir is not None else None)
    if place.run_dir is not None:
        place.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return run_job(cfg, place, progress=_log_progress if progress else None)
    except JobFailed as failed:
        cause = failed.cause
        if not isinstance(cause, ConveyorError):
            raise failed from cause  # an error Conveyor did not expect: a ConveyorError too, naming it
        cause.report = failed.report  # type: ignore[attr-defined]
        raise cause from None


def _log_progress(job_plan: Any) -> Any:
    from conveyor.runtime.progress import LogProgress

    info = job_plan.info
    return LogProgress(info.estimated_rows, len(job_plan.partitions), total_bytes=info.estimated_bytes)
