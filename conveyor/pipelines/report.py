"""The human summary printed at the end of a run (and of ``conveyor plan``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conveyor.errors import ConfigError, ConveyorError
from conveyor.pipelines.job import JobReport
from conveyor.pipelines.plan import JobPlan
from conveyor.secrets import mask


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f}" if seconds > 0 else "-"


def _degree(plan: JobPlan) -> str:
    configured = plan.spec.options.degree
    return str(plan.degree) if configured == plan.degree else f"{plan.degree} (degree={configured} of the runtime's CPUs)"


def summary_table(report: JobReport) -> Any:
    from rich.table import Table

    spec = report.plan.spec
    title = (
        f"{spec.names['source']} -> {spec.names['sink']} ({report.target}), "
        f"strategy={spec.names['strategy']}, runtime={spec.names['runtime']}, degree={_degree(report.plan)}, "
        f"load_mode={spec.options.load_mode}"
    )
    if report.sink_plan is not None and report.sink_plan.path_reason:
        title += f"\npath: {report.sink_plan.path_reason}"
    if report.plan.window is not None:
        title += f"\nincremental: {report.plan.window.describe()}"
    if report.runtime_note:
        title += f"\n{report.runtime_note}"
    if report.startup_seconds >= 0.01:
        what = "ray" if spec.names["runtime"] == "auto" else spec.names["runtime"]  # what runtime=auto started is Ray
        title += f"\n{what} start-up: {report.startup_seconds:.2f} s (not in the totals' seconds and rows/s)"
    table = Table(title=title, title_justify="left")
    for col, justify in (("partition", "left"), ("reads", "left"), ("rows", "right"), ("MB", "right"),
                         ("seconds", "right"), ("rows/s", "right"), ("attempts", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    parts = {p.key: p for p in report.plan.partitions}
    for r in report.results:
        what = parts[r.partition].describe() if r.partition in parts else ""
        table.add_row(r.partition, what, f"{r.rows:,}", f"{r.bytes / 1e6:,.1f}", f"{r.seconds:.2f}",
                      _rate(r.rows, r.seconds), str(r.attempts))
    if report.verification is not None:
        v = report.verification
        table.caption = f"verify={v.mode}: " + ("ok" if v.ok else "MISMATCH") + (
            f", source {v.source_rows:,} rows" if v.source_rows is not None else "") + (
            f", target {v.target_rows:,} new rows" if v.target_rows is not None else "") + (
            f", staged {v.staged_rows:,} rows" if v.staged_rows is not None else "") + (
            f", checksum {v.target_checksum}" if v.target_checksum else "") + "".join(f"; {n}" for n in v.notes)
        table.caption_justify = "left"
    table.add_section()
    table.add_row("total", f"{len(report.results)} partitions", f"{report.rows:,}", f"{report.bytes / 1e6:,.1f}",
                  f"{report.transfer_seconds:.2f}", _rate(report.rows, report.transfer_seconds), "", style="bold")
    return table


def plan_table(plan: JobPlan) -> Any:
    from rich.table import Table

    spec = plan.spec
    table = Table(
        title=f"{plan.info.label}: {len(plan.partitions)} partition(s), strategy={spec.names['strategy']}, "
        f"degree={_degree(plan)}, sink={spec.names['sink']}, load_mode={spec.options.load_mode}",
        title_justify="left",
        caption="\n".join(x for x in (f"strategy: {plan.note}" if plan.note else "", f"path: {plan.path}" if plan.path else "",
                                      f"source: {plan.info.reader}" if plan.info.reader and not plan.agreement.native else "",
                                      f"incremental: {plan.window.describe()}" if plan.window else "",
                                      *(_table_line(t) for t in plan.tables)) if x),
        caption_justify="left",
    )
    table.add_column("partition")
    table.add_column("reads")
    table.add_column("estimated rows", justify="right")
    for p in plan.partitions[:PLAN_ROWS]:
        table.add_row(p.key, p.describe(), "" if p.estimated_rows is None else f"{p.estimated_rows:,}")
    if len(plan.partitions) > PLAN_ROWS:
        rest = plan.partitions[PLAN_ROWS:]
        table.add_row("...", f"{len(rest):,} more ({rest[0].key} .. {rest[-1].key})", "")
    return table


def _table_line(plan: JobPlan) -> str:
    """One table of a job over several: what it reads, how it is split, the path its rows take."""
    rows = sum(p.estimated_rows or 0 for p in plan.partitions)
    return (f"{plan.info.label}: {len(plan.partitions)} partition(s), ~{rows:,} rows; {plan.note or plan.spec.names['strategy']}"
            + (f"; path: {plan.path}" if plan.path else ""))


#: a plan shows its first partitions, then how many more (a plan of thousands stays readable)
PLAN_ROWS = 20



def report_dict(report: JobReport | None, plan: JobPlan | None, config: Any, status: str, error: BaseException | None,
                started: float | None = None) -> dict[str, Any]:
    """The run report as JSON-ready data: the Conveyor version, when the run started (``started``: a ``time.time()``) and
    ended (now), per partition, totals, verification, the masked config."""
    import time

    from conveyor import __version__

    def stamp(at: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"

    out: dict[str, Any] = {"status": status, "conveyor_version": __version__,
                           **({"started_at": stamp(started)} if started is not None else {}), "ended_at": stamp(time.time()),
                           "config": mask(config)}
    if error is not None:
        ours = isinstance(error, ConveyorError)
        out["error"] = {"type": type(error).__name__, "message": str(error), "hint": error.hint if ours else None,
                        "exit_code": error.exit_code if ours else 1}
    plan = plan or (report.plan if report else None)
    if plan is not None:
        spec = plan.spec
        if plan.window is not None:
            w = plan.window
            out["incremental"] = {"cursor": w.column, "after": None if w.low is None else str(w.low),
                                  "up_to": None if w.high is None else str(w.high), "window": w.describe()}
        out.update(run_id=spec.options.run_id, plugins=spec.names, source=plan.info.label, strategy_note=plan.note,
                   options={"load_mode": spec.options.load_mode, "map_method": spec.options.map_method,
                            "batch_size": spec.options.batch_size, "degree": plan.degree, "verify": spec.options.verify})
        if plan.degree != spec.options.degree:
            out["options"]["degree_configured"] = spec.options.degree
    if report is not None:
        parts = {p.key: p for p in report.plan.partitions}
        out["target"] = report.target
        out["path"] = report.sink_plan.path_reason if report.sink_plan else ""
        if report.sink_plan and report.sink_plan.definition:
            out["definition"] = report.sink_plan.definition  # what of the source table's definition a new table carries
        out["partitions"] = [
            {"partition": r.partition, "reads": parts[r.partition].describe() if r.partition in parts else "", "rows": r.rows,
             "bytes": r.bytes, "seconds": round(r.seconds, 4), "attempts": r.attempts,
             "error": str(r.error) if r.error else None, "committed_before": r.partition in report.committed_before}
            for r in report.results
        ]
        secs = report.transfer_seconds
        out["totals"] = {"partitions": len(report.plan.partitions), "rows": report.rows, "bytes": report.bytes,
                         "seconds": round(secs, 4), "rows_per_s": round(report.rows / secs) if secs else None,
                         "mb_per_s": round(report.bytes / 1e6 / secs, 2) if secs else None,
                         "runtime_startup_seconds": round(report.startup_seconds, 4), "wall_seconds": round(report.seconds, 4)}
        if report.phases:
            out["phases"] = dict(report.phases)
        if report.runtime_note:
            out["runtime_note"] = report.runtime_note
        if report.verification is not None:
            out["verification"] = report.verification.as_dict()
        if report.sync is not None:
            out["sync"] = report.sync.as_dict()
        if report.tables:
            out["tables"] = [{"table": t.plan.partitions[0].table if t.plan.partitions else t.plan.info.label, "source": t.plan.info.label,
                              "target": t.target, "partitions": len(t.plan.partitions), "rows": t.rows, "bytes": t.bytes,
                              "path": t.sink_plan.path_reason if t.sink_plan else "", "strategy_note": t.plan.note,
                              "verification": t.verification.as_dict() if t.verification else None} for t in report.tables]
    return out


def _sweep(folder: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(job, its overrides, its report) for every job of a ``conveyor run -m`` sweep, in job order."""
    jobs = []
    for report in sorted(folder.glob("*/report.json"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0):
        overrides_file = report.parent / ".hydra" / "overrides.yaml"
        overrides = overrides_file.read_text().replace("\n- ", " ").strip("- \n") if overrides_file.exists() else ""
        jobs.append((report.parent.name, overrides, json.loads(report.read_text())))
    if not jobs:
        raise ConfigError(f"report: {folder} holds no <job>/report.json",
                          hint="give the directory of a `conveyor run -m` sweep (benchmark results: python benchmarks/report.py)")
    return jobs


def multirun_markdown(folder: Path | str) -> str:
    """``conveyor report <multirun dir>``: a table of a ``conveyor run -m`` sweep's jobs, from their report.json."""
    rows = []
    for job, overrides, data in _sweep(Path(folder)):
        t = data.get("totals", {})
        rows.append(f"| {job} | {overrides} | {data.get('status')} | {t.get('rows', '')} | {t.get('seconds', '')} | "
                    f"{t.get('rows_per_s', '')} | {t.get('mb_per_s', '')} |")
    return "\n".join(["| job | overrides | status | rows | seconds | rows/s | MB/s |", "|---|---|---|---:|---:|---:|---:|", *rows])


def plot_title(jobs: list[tuple[Any, str, dict[str, Any]]], varied: set[str], folder: Path) -> str:
    """A sweep's picture's title: what it moved (the source, the target), the overrides every job shared, and the sweep's
    folder (its date and time)."""
    done = [data for _, _, data in jobs if data.get("status") == "succeeded"] or [data for _, _, data in jobs]
    first = done[0] if done else {}
    what = f"{first.get('source', '?')} -> {(first.get('plugins') or {}).get('sink', 'sink')} {first.get('target', '?')}"
    shared = sorted({o for _, overrides, _ in jobs for o in overrides.split()
                     if o.split("=", 1)[0] not in varied and not o.split("=", 1)[0].endswith("degree")})
    fixed = " ".join(o for o in shared if all(o in overrides.split() for _, overrides, _ in jobs))
    return "\n".join(x for x in (what, fixed, f"conveyor run -m: {folder.parent.name}/{folder.name}") if x)


def multirun_plot(folder: Path | str, out: Path | str) -> Path:
    """The picture of a degree sweep: rows/s against the degree the job ran at, one line per
    combination of the other overrides (e.g. per strategy); failed jobs are left out."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("report: the plot needs matplotlib", hint="pip install 'conveyor[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = _sweep(Path(folder))
    # a line per value of the overrides the sweep varies (other than degree): e.g. strategy=none
    seen: dict[str, set[str]] = {}
    for _, overrides, _data in jobs:
        for o in overrides.split():
            seen.setdefault(o.split("=", 1)[0], set()).add(o)
    varied = {k for k, values in seen.items() if len(values) > 1 and not k.endswith("degree")}
    series: dict[str, list[tuple[int, float]]] = {}
    for _, overrides, data in jobs:
        rate, degree = data.get("totals", {}).get("rows_per_s"), data.get("options", {}).get("degree")
        if data.get("status") != "succeeded" or rate is None or degree is None:
            continue
        label = " ".join(o for o in overrides.split() if o.split("=", 1)[0] in varied) or "rows/s"
        series.setdefault(label, []).append((int(degree), float(rate)))
    if not series:
        raise ConfigError(f"report: no job of {folder} succeeded: nothing to plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(series.items()):
        points.sort()
        ax.plot([d for d, _ in points], [r for _, r in points], marker="o", label=label)
    ax.set_xticks(sorted({d for points in series.values() for d, _ in points}))
    ax.set_xlabel("degree (tasks at once)")
    ax.set_ylabel("rows/s (whole job)")
    ax.set_title(plot_title(jobs, varied, Path(folder)), fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
