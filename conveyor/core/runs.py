"""Planning and running: ``Strategy`` (a ``PartitionPlan``), ``Runtime``, the ``Task`` it runs and
the ``TaskResult`` it reports, ``Progress``, and the degree resolved once."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from conveyor.core.options import JobOptions
from conveyor.core.partitions import Partition
from conveyor.core.sinks import SinkPlan, TargetLayout
from conveyor.core.sources import SourceInfo

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up

    from conveyor.errors import ConveyorError


@dataclass(frozen=True)
class PlanRequest:
    """Everything a strategy may use; new settings become new fields with defaults."""

    source: Any
    info: SourceInfo
    degree: int
    #: the target's range partitions, where the sink can tell (strategy.align=true plans along them)
    target: TargetLayout | None = None
    #: the rows a partition should hold at least for the target, and why (a columnar target's stripe)
    min_partition_rows: tuple[int, str] = (0, "")
    #: how many tables the job's tasks share one pool with (a job over several tables): the tables
    #: themselves spread over the workers, so a small one needs no split of its own
    tables: int = 1


@dataclass(frozen=True)
class PartitionPlan:
    """What a strategy decided: the partitions, and a note saying how it chose them (for
    ``conveyor plan`` and the report)."""

    partitions: Sequence[Partition]
    note: str = ""


class Strategy(Protocol):
    """Splits a source into partitions. Never writes SQL: connectors render partitions."""

    #: the plugin's config dataclass (its YAML node is merged into it, unknown keys refused)
    config_class: ClassVar[type]

    def plan(self, request: PlanRequest) -> PartitionPlan: ...


class Progress(Protocol):
    """Receives what tasks do, per batch (never per row).

    ``live_rows_after`` (seconds): how far into the run it first shows the rows of partitions still
    running (a log line every 10 s: 10; a live display: 0). A runtime that must start something to
    gather those counts (Ray: an actor, a worker process of its own) waits that long."""

    live_rows_after: float

    def started(self, key: str) -> None: ...

    def advanced(self, key: str, rows: int, nbytes: int) -> None: ...

    def finished(self, result: TaskResult) -> None: ...


class ProgressRelay:
    """A progress that passes every call on to the one it wraps (``inner``): a wrapper overrides what it adds to."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner

    @property
    def live_rows_after(self) -> float:
        """The wrapped display's: when it first shows running partitions' rows."""
        return self.inner.live_rows_after

    def started(self, key: str) -> None:
        self.inner.started(key)

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        self.inner.advanced(key, rows, nbytes)

    def finished(self, result: TaskResult) -> None:
        self.inner.finished(result)


class NullProgress:
    live_rows_after: float = 0.0

    def started(self, key: str) -> None:
        pass

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        pass

    def finished(self, result: TaskResult) -> None:
        pass


@dataclass(frozen=True)
class Task:
    """Everything one partition needs; plain data, pickled to wherever it runs."""

    source: Any
    sink: Any
    plan: SinkPlan
    partition: Partition


@dataclass(frozen=True)
class TaskResult:
    partition: str
    index: int
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    attempts: int = 1
    error: ConveyorError | None = None
    traceback: str | None = None
    #: stopped, or never started, because the run was cancelled or another partition failed
    cancelled: bool = False
    #: committed under this load id by an earlier attempt or run: nothing was written again
    already_committed: bool = False
    #: the rows the source said it sent for this partition (``WriteStats.source_rows``); None: not said
    source_rows: int | None = None
    #: where the task ran and what it retried ("attempt 1 failed: ...; retried after 0.5 s"): the
    #: worker's own account, carried back so the driver's log has it whatever process ran the task
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def resolve_degree(runtime: Any, degree: int) -> int:
    """The degree a job runs at, resolved once: N > 0 as given; N < 0 the runtime's CPUs / |N|
    (the cluster's for a runtime that knows them, else this machine's)."""
    if degree > 0:
        return degree
    return JobOptions.resolve_degree(degree, runtime.cpus() if runtime is not None else None)


class Runtime(Protocol):
    """Runs tasks, ``degree`` at once, and returns one result per task in any order; a failed
    partition cancels the ones not started (their results say ``cancelled``). Its other members are
    hooks the job calls on every runtime, whose defaults :class:`RuntimeBase` gives."""

    #: the plugin's config dataclass (its YAML node is merged into it, unknown keys refused)
    config_class: ClassVar[type]
    #: where the tasks ran, when the runtime chose other than its usual (for the report; "" otherwise)
    report_note: str

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]: ...

    def check(self, source: Any, sink: Any) -> None: ...

    def cpus(self) -> int: ...

    def start_early(self, degree: int, estimated_bytes: int | None = None) -> None: ...

    def runs_tasks_here(self) -> bool: ...

    def startup_seconds(self) -> float: ...

    def release(self) -> None: ...

    def held(self) -> AbstractContextManager[None]: ...

    def each(self, work: Callable[[Any], Any], items: Sequence[Any], degree: int, names: Sequence[str] = ()) -> list[Any]: ...


class RuntimeBase:
    """The defaults of a runtime's hooks: tasks run in this process, on this machine's CPUs, with
    nothing to start before them and nothing to refuse."""

    report_note: str = ""

    def check(self, source: Any, sink: Any) -> None:
        """Refuse, before anything moves, a pair this runtime cannot run (e.g. a sink every partition
        of which must be written from the driver's process, on workers elsewhere)."""

    def cpus(self) -> int:
        """The CPUs the tasks run on (a negative degree is a fraction of them)."""
        return os.cpu_count() or 1

    def start_early(self, degree: int, estimated_bytes: int | None = None) -> None:
        """Get ready in the background while the driver plans and prepares (once the source is described:
        ``estimated_bytes`` its size, None when unknown); ``run`` waits for it."""

    def runs_tasks_here(self) -> bool:
        """Whether the job's tasks will run in this process, as far as is known after ``start_early``: a
        source may then get ready for them meanwhile (``Source.warm_up``)."""
        return True

    def startup_seconds(self) -> float:
        """Seconds this job spent getting the runtime ready (reported apart from the transfer's)."""
        return 0.0

    def release(self) -> None:
        """Stop what ``start_early`` started and ``run`` did not use (a job that failed before its tasks)."""

    def each(self, work: Callable[[Any], Any], items: Sequence[Any], degree: int, names: Sequence[str] = ()) -> list[Any]:
        """``work(item)`` of every item, ``degree`` at once, where this runtime runs tasks (here: this process's threads),
        in order; what ``conveyor verify`` reads its partitions with. ``work`` is picklable where the runtime ships it."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, degree), thread_name_prefix="conveyor-each") as pool:
            return list(pool.map(work, items))

    def held(self) -> AbstractContextManager[None]:
        """Keep what the runtime starts for a job ready for every job this process runs inside the block (a sync's
        runs, each of which stages its changed rows by a job), stopping it on the way out; the jobs inside neither
        start nor stop it again."""
        return contextlib.nullcontext()


__all__ = [
    "ProgressRelay",
    "PlanRequest",
    "PartitionPlan",
    "Strategy",
    "Progress",
    "NullProgress",
    "Task",
    "TaskResult",
    "resolve_degree",
    "Runtime",
    "RuntimeBase",
]
