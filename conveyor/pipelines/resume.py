"""A resumed run reads only the partitions the stopped run did not finish: that is exact only while
the finished ones still hold the rows it loaded. Before any task runs, the source is asked
(:class:`~conveyor.core.SupportsChangeCheck`, against what the first run's manifest kept of its
snapshot or files) or, where it cannot tell, its finished partitions are counted; a partition that
changed refuses the resume by name, with the ways on. Nothing is loaded twice or missed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.core import SupportsChangeCheck, SupportsPartitionCounts
from conveyor.errors import PlanningError
from conveyor.log import note, say


def table_of(plan: Any) -> str:
    """The key a table's mark is kept under in a manifest: its name in a job over several, "" in a job of one."""
    return plan.partitions[0].table if plan.partitions and plan.partitions[0].table else ""


def marks(plan: Any, source: Any) -> dict[str, Any]:
    """What each table's source saw in this run (its snapshot, its files), for the run's manifest."""
    out = {}
    for sub, src in ([(t, t.spec.source) for t in plan.tables] if plan.tables else [(plan, source)]):
        mark = src.change_mark() if isinstance(src, SupportsChangeCheck) else None
        if mark is not None:
            out[table_of(sub)] = mark
    return out


def check_unchanged(plan: Any, source: Any, done: Mapping[str, int], mark: Any) -> None:
    """Refuse a resume whose finished partitions (``done``: key -> rows loaded) no longer hold those
    rows at the source, read in this run's snapshot; say how it was told."""
    finished = [p for p in plan.partitions if p.key in done]
    if not finished:
        return
    rows = [done[p.key] for p in finished]
    changed = source.changed_since(mark, finished, rows) if mark and isinstance(source, SupportsChangeCheck) else None
    how = "their rows are the versions the first run read"
    if changed is None:
        counts = source.count_rows(finished) if isinstance(source, SupportsPartitionCounts) else None
        if counts is None:
            note(f"resume: {plan.info.label} cannot show whether its finished partitions changed since the first run: trusted as they are")
            return
        changed = [f"{p.key}: {n:,} rows now, {r:,} loaded" for p, r, n in zip(finished, rows, counts) if n != r]
        how = "counted: as many rows as were loaded (this source has no row versions to compare: an update in place is not seen)"
    if changed:
        shown = "; ".join(changed[:3]) + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
        raise PlanningError(
            f"resume: {plan.info.label} changed since the run it resumes, in {len(changed)} of the {len(finished)} partitions that run "
            f"finished: {shown}. Resuming would load rows twice or miss them",
            hint="load the table whole again instead (load_mode=truncate or replace: the stopped run's rows are replaced in one "
                 "transaction); ctid page ranges move with every UPDATE, so on a table being written a key strategy "
                 "(strategy=rangeid or ntile on its primary key) keeps a resume possible")
    say(f"resume: the {len(finished)} finished partitions of {plan.info.label} are unchanged since the first run ({how})")
