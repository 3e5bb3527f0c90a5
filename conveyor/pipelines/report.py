"""The human summary printed at the end of a run (and of ``conveyor plan``)."""

from __future__ import annotations

from typing import Any

from conveyor.pipelines.job import JobPlan, JobReport


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f}" if seconds > 0 else "-"


def summary_table(report: JobReport) -> Any:
    from rich.table import Table

    spec = report.plan.spec
    title = (
        f"{spec.names['source']} -> {spec.names['sink']} ({report.target}), "
        f"strategy={spec.names['strategy']}, runtime={spec.names['runtime']}, degree={spec.options.degree}, "
        f"load_mode={spec.options.load_mode}"
    )
    if report.sink_plan is not None and report.sink_plan.path_reason:
        title += f"\npath: {report.sink_plan.path_reason}"
    table = Table(title=title, title_justify="left")
    for col, justify in (("partition", "left"), ("reads", "left"), ("rows", "right"), ("MB", "right"),
                         ("seconds", "right"), ("rows/s", "right"), ("attempts", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    parts = {p.key: p for p in report.plan.partitions}
    for r in report.results:
        what = parts[r.partition].describe() if r.partition in parts else ""
        table.add_row(r.partition, what, f"{r.rows:,}", f"{r.bytes / 1e6:,.1f}", f"{r.seconds:.2f}",
                      _rate(r.rows, r.seconds), str(r.attempts))
    table.add_section()
    table.add_row("total", f"{len(report.results)} partitions", f"{report.rows:,}", f"{report.bytes / 1e6:,.1f}",
                  f"{report.seconds:.2f}", _rate(report.rows, report.seconds), "", style="bold")
    return table


def plan_table(plan: JobPlan) -> Any:
    from rich.table import Table

    spec = plan.spec
    table = Table(
        title=f"{plan.info.label}: {len(plan.partitions)} partition(s), strategy={spec.names['strategy']}, "
        f"degree={spec.options.degree}, sink={spec.names['sink']}, load_mode={spec.options.load_mode}",
        title_justify="left",
        caption="\n".join(x for x in (f"strategy: {plan.note}" if plan.note else "", f"path: {plan.path}" if plan.path else "") if x),
        caption_justify="left",
    )
    table.add_column("partition")
    table.add_column("reads")
    table.add_column("estimated rows", justify="right")
    for p in plan.partitions:
        table.add_row(p.key, p.describe(), "" if p.estimated_rows is None else f"{p.estimated_rows:,}")
    return table
