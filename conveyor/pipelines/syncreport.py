"""What a sync job reports (``JobReport.sync``): each run's apply (:class:`SyncRun`) and the job's slot, position and runs
(:class:`SyncReport`), as the CLI prints them and ``report.json`` keeps them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from conveyor.core.changes import Applied


@dataclass
class SyncRun:
    """One run's apply: the position the targets were at and the one they are at now."""

    start: int
    upto: int
    tables: dict[str, Applied] = field(default_factory=dict)
    changes: int = 0
    seconds: float = 0.0
    #: how far the source had moved past ``upto`` when the run committed: WAL bytes and seconds
    lag_bytes: int = 0
    lag_seconds: float = 0.0
    #: where the seconds went: decoding the changes, reading the changed rows into the stage, applying them
    phases: dict[str, float] = field(default_factory=dict)
    #: each changed table's stage load, as its job reported it (target, rows the stage stored, partitions, runtime): a
    #: summary, kept by a long follow's report; the run's reports themselves go to the job's report of this run only
    staged: list[dict[str, Any]] = field(default_factory=list)
    #: a position as the source writes it
    text: Callable[[int], str] = field(default=str, repr=False)

    def lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - since, 4)
        return now

    @property
    def keys(self) -> int:
        return sum(a.keys for a in self.tables.values())

    def describe(self) -> str:
        rate = self.changes / self.seconds if self.seconds else 0.0
        what = "; ".join(f"{t}: {a.describe()}" for t, a in self.tables.items()) or "no change"
        return (f"sync: {self.changes:,} changes applied up to {self.text(self.upto)} in {self.seconds:.2f} s ({rate:,.0f}/s): {what}; "
                f"lag {self.lag_bytes:,} bytes, {self.lag_seconds:.2f} s")

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.text(self.start), "to": self.text(self.upto), "changes": self.changes, "keys": self.keys,
                "seconds": round(self.seconds, 3), "changes_per_second": round(self.changes / self.seconds, 1) if self.seconds else None,
                "lag_bytes": self.lag_bytes, "lag_seconds": round(self.lag_seconds, 3), "phases": self.phases,
                "staged": self.staged,
                "tables": {t: dataclasses.asdict(a) for t, a in self.tables.items()}}


@dataclass
class SyncReport:
    """A sync job's part of its :class:`~conveyor.pipelines.job.JobReport` (``report.sync``): its slot and position, and
    what its first load or its applies in this process did."""

    slot: str
    target: str
    #: the first load's rows and seconds (this process made it), else None
    first_load: tuple[int, float] | None = None
    position: int = 0
    runs: list[SyncRun] = field(default_factory=list)
    retained_bytes: int = 0
    seconds: float = 0.0
    #: a position as the source writes it
    text: Callable[[int], str] = field(default=str, repr=False)
    #: a whole-database migration's part (``conveyor.pipelines.migrate.MigrationReport``), else None
    migration: Any = None
    #: the source keeps the job's position (a PostgreSQL slot); false: the targets' states are it (a MySQL binlog)
    held: bool = True

    #: the runs a long ``follow`` keeps in its report (the newest; every run's line is in the log)
    KEPT: ClassVar[int] = 1000

    def add(self, run: SyncRun) -> None:
        self.runs.append(run)
        self.position = run.upto
        del self.runs[:-self.KEPT]

    def lines(self) -> list[str]:
        return self._lines() + (self.migration.lines() if self.migration is not None else [])

    def _lines(self) -> list[str]:
        if self.first_load is not None and not self.runs:
            rows, seconds = self.first_load
            return [f"sync: first load, {rows:,} rows into {self.target} in {seconds:.2f} s; "
                    f"slot {self.slot} at {self.text(self.position)}: the next run applies the changes since"]
        last = self.runs[-1] if self.runs else None
        first = []
        if self.first_load is not None:
            rows, seconds = self.first_load
            first = [f"sync: first load, {rows:,} rows into {self.target} in {seconds:.2f} s, then the changes made while it read"]
        held = (f"slot {self.slot}: {self.retained_bytes:,} bytes of WAL held on the source" if self.held else
                f"job {self.slot}: the source keeps no position for it (the target's sync state is its position)")
        return first + [f"sync: {len(self.runs)} run(s), {sum(r.changes for r in self.runs):,} changes applied; {self.target} holds the "
                        f"source as of {self.text(self.position)}" + (f" (lag {last.lag_bytes:,} bytes, {last.lag_seconds:.2f} s)" if last else ""),
                        held]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"slot": self.slot, "target": self.target, "position": self.text(self.position),
                               "retained_bytes": self.retained_bytes, "runs": [r.as_dict() for r in self.runs]}
        if self.first_load is not None:
            out["first_load"] = {"rows": self.first_load[0], "seconds": round(self.first_load[1], 3)}
        if self.migration is not None:
            out["migration"] = self.migration.as_dict()
        return out


__all__ = ["SyncReport", "SyncRun"]
