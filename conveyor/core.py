"""The interfaces every plugin implements, and the plain data that crosses between them.

A job reads a :class:`Source`, a :class:`Strategy` splits it into :class:`Partition` s, a
:class:`Runtime` runs one task per partition and each task streams Arrow record batches
from the source into the :class:`Sink`. Everything here that crosses a process boundary
(partitions, plans, stats, plugin objects) is plain, picklable data: connections are opened
inside ``read`` and ``write`` and closed before they return.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up
    import pyarrow as pa

    from conveyor.errors import ConveyorError

LoadMode = Literal["truncate", "append", "create", "replace"]
MapMethod = Literal["name", "position"]
LOAD_MODES: tuple[str, ...] = ("truncate", "append", "create", "replace")
MAP_METHODS: tuple[str, ...] = ("name", "position")


@dataclass(frozen=True)
class JobOptions:
    """The job-wide settings every plugin may read (built from the top level of the config)."""

    load_mode: LoadMode = "append"
    map_method: MapMethod = "name"
    batch_size: int = 65536
    #: as configured: N > 0 tasks at once, N < 0 a fraction of the runtime's CPUs (the job resolves
    #: it once, against the runtime, see :func:`resolve_degree`; plugins get the resolved number)
    degree: int = 1
    run_id: str = "run"
    #: count | checksum | none
    verify: str = "count"
    #: what names this load's commits in the target (commit markers, file names): the run id, or,
    #: when resuming, the load id of the run being resumed, so its committed partitions are known
    load_id: str = ""

    @property
    def load(self) -> str:
        return self.load_id or self.run_id

    @staticmethod
    def resolve_degree(degree: int, cpus: int | None = None) -> int:
        """``N > 0`` runs N tasks at once; ``N < 0`` uses CPUs / ``|N|`` (at least one)."""
        if degree > 0:
            return degree
        if degree == 0:
            raise ValueError("degree must not be 0")
        cpus = cpus or os.cpu_count() or 1
        return max(1, cpus // -degree)


# --- cancellation (Ctrl-C / SIGTERM): every task in this process stops at its next batch ----------

_CANCEL = threading.Event()


def request_cancel() -> None:
    """Ask every running task in this process to stop at its next batch (and roll back)."""
    _CANCEL.set()


def cancel_requested() -> bool:
    return _CANCEL.is_set()


def reset_cancel() -> None:
    _CANCEL.clear()


# --- partitions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """One unit of work: a plain description of which rows of the source a task moves.

    Strategies build them, source connectors render them in their own dialect. ``index`` is
    stable for a given plan, so ``key`` identifies a partition across retries and resumes.
    """

    index: int
    count: int
    estimated_rows: int | None = field(default=None, compare=False)

    kind: ClassVar[str] = "partition"

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.index:05d}"

    def describe(self) -> str:
        """A short human description for ``conveyor plan``."""
        return self.kind


@dataclass(frozen=True)
class WholeSource(Partition):
    """The whole source in one partition."""

    kind: ClassVar[str] = "whole"

    def describe(self) -> str:
        return "all rows"


@dataclass(frozen=True)
class FileSet(Partition):
    """A set of files (for file sources, or any source that reads files)."""

    paths: tuple[str, ...] = ()
    kind: ClassVar[str] = "files"

    def describe(self) -> str:
        if len(self.paths) == 1:
            return self.paths[0]
        return f"{len(self.paths)} files: {self.paths[0]} .. {self.paths[-1]}" if self.paths else "no files"


@dataclass(frozen=True)
class RowGroupSet(Partition):
    """Some row groups of one Parquet file (to split one large file over several tasks)."""

    path: str = ""
    row_groups: tuple[int, ...] = ()
    kind: ClassVar[str] = "rowgroups"

    def describe(self) -> str:
        return f"{self.path} row groups {self.row_groups[0]}..{self.row_groups[-1]}" if self.row_groups else self.path


@dataclass(frozen=True)
class NativePartition(Partition):
    """A partition the source itself handed out (an ADBC partition descriptor, a Flight endpoint)."""

    token: bytes = b""
    locations: tuple[str, ...] = ()
    label: str = ""
    kind: ClassVar[str] = "native"

    def describe(self) -> str:
        return self.label or f"{len(self.token)}-byte descriptor"


@dataclass(frozen=True)
class PageRange(Partition):
    """Heap pages [start, stop) of a table (PostgreSQL ctid ranges); ``stop=None`` is open-ended."""

    start: int = 0
    stop: int | None = None
    kind: ClassVar[str] = "ctid"

    def describe(self) -> str:
        return f"pages [{self.start}, {'end' if self.stop is None else self.stop})"


@dataclass(frozen=True)
class KeyRange(Partition):
    """Rows whose ``column`` is in [lower, upper); ``None`` bounds are open; NULL keys if ``nulls``."""

    column: str = ""
    lower: Any = None
    upper: Any = None
    nulls: bool = False
    kind: ClassVar[str] = "range"

    def describe(self) -> str:
        lo = "-inf" if self.lower is None else repr(self.lower)
        hi = "+inf" if self.upper is None else repr(self.upper)
        return f"{self.column} in [{lo}, {hi})" + (" or NULL" if self.nulls else "")


@dataclass(frozen=True)
class ModuloBucket(Partition):
    """Rows whose integer ``column`` modulo ``buckets`` is ``bucket`` (NULL keys in bucket 0)."""

    column: str = ""
    buckets: int = 1
    bucket: int = 0
    kind: ClassVar[str] = "modulo"

    def describe(self) -> str:
        return f"abs({self.column} % {self.buckets}) = {self.bucket}" + (" or NULL" if self.bucket == 0 else "")


@dataclass(frozen=True)
class ValueSet(Partition):
    """Rows whose ``column`` equals one of ``values`` (``None`` in values: NULL keys).

    ``datadriven`` packs many distinct values into a bounded number of these, balanced by rows.
    """

    column: str = ""
    values: tuple[Any, ...] = ()
    kind: ClassVar[str] = "values"

    def describe(self) -> str:
        shown = ", ".join(repr(v) for v in self.values[:3]) + (", ..." if len(self.values) > 3 else "")
        return f"{self.column} in ({shown})"


# --- what a source says about itself --------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int | None = None
    rows: int | None = None
    #: rows in each row group (Parquet), when known
    row_groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class NativeExport:
    """What a database source says of itself beyond Arrow: its dialect's column types (a sink of
    the same database creates and checks columns with them) and the wire format, if any, it can
    stream a partition in (a sink that imports that format may take the pass-through)."""

    #: the database the columns come from ("postgres")
    dialect: str
    #: the dialect's own column records (``PgColumn`` for postgres), in the schema's order
    columns: tuple[Any, ...] = ()
    #: the format ``SupportsNativeExport.export_native`` streams (e.g. "pgcopy-binary"); None: none
    format: str | None = None
    #: why there is no format (e.g. "psql is not installed")
    why_not: str = ""


@dataclass(frozen=True)
class SourceInfo:
    """What planning knows of a source: its Arrow schema, size estimates, a human label."""

    schema: pa.Schema
    label: str
    estimated_rows: int | None = None
    estimated_bytes: int | None = None
    #: a database source's own column types and wire format (None: Arrow is all it speaks)
    native: NativeExport | None = None


@runtime_checkable
class SupportsFileListing(Protocol):
    """A source made of files; ``strategy=files`` needs it."""

    def list_files(self) -> list[FileEntry]: ...


@dataclass(frozen=True)
class KeyStats:
    """What a source knows of a distribute key: its kind, bounds and counts."""

    column: str
    #: integer | numeric | temporal | other
    kind: str
    min: Any = None
    max: Any = None
    rows: int | None = None
    nulls: int | None = None


@runtime_checkable
class SupportsCtid(Protocol):
    """A heap table read by page ranges; raises PlanningError, saying why, when it is not one."""

    def ctid_pages(self) -> int: ...


@runtime_checkable
class SupportsNativePartitions(Protocol):
    """A source that splits itself (ADBC execute_partitions, Flight endpoints): ``strategy=native``."""

    def native_partitions(self) -> list[NativePartition]: ...


@runtime_checkable
class SupportsKeys(Protocol):
    """A source that answers questions about a column (rangeid, ntile, random, datadriven)."""

    def key_stats(self, column: str) -> KeyStats: ...

    def key_quantiles(self, column: str, buckets: int, exact: bool) -> list[Any]: ...

    def key_values(self, column: str) -> list[tuple[Any, int]]:
        """Each distinct value of ``column`` (NULL first) with its row count."""
        ...

    def query_values(self, query: str) -> list[Any]: ...


# --- plugin interfaces ----------------------------------------------------------------------


class Source(Protocol):
    """Reads Arrow record batches. Built from its config dataclass and the job options."""

    def describe(self) -> SourceInfo: ...

    def read(self, part: Partition) -> Iterator[pa.RecordBatch]: ...


@dataclass(frozen=True)
class SinkPlan:
    """What ``Sink.prepare`` decided on the driver; shipped to every write task.

    ``target`` is the human name of where rows land, ``write_target`` the table or folder the
    tasks write into (a staging one for truncate/replace/create), ``columns`` the target
    column names in the order the source's columns map onto them.
    """

    target: str
    write_target: str
    load_mode: str
    columns: tuple[str, ...]
    source_columns: tuple[str, ...]
    schema: Any = None
    #: the native format both connectors agreed on (``NativeExport.format``, e.g. "pgcopy-binary"):
    #: the task streams ``source.export_native`` into ``sink.write_native``; None: Arrow batches
    native: str | None = None
    #: why this path was taken, for ``conveyor plan`` and the report
    path_reason: str = ""
    #: special values this sink writes exactly (``INFINITY``): the job asks the source to pass
    #: them on instead of refusing them (``SupportsSpecialValues``)
    keeps: tuple[str, ...] = ()
    #: rows the target held before an append (``verify=count`` compares what was added)
    rows_before: int = 0
    #: the partitions (indexes) this run writes, set by the job (a resumed run writes only the rest)
    to_write: tuple[int, ...] | None = None
    #: the sink's own decisions, as its own picklable dataclass (the PostgreSQL sink's writer and
    #: casts, ...): read only by the sink that made them
    own: Any = None


#: infinity and -infinity of dates and timestamps, carried in Arrow as DuckDB does: date32
#: +-(2**31 - 1) days, timestamp +-(2**63 - 1) (no real date or timestamp of PostgreSQL or DuckDB
#: is that far out). A source passes them on only to a sink that keeps them.
INFINITY = "infinity"
INFINITY_DAYS = 2**31 - 1
INFINITY_TICKS = 2**63 - 1


@runtime_checkable
class SupportsSpecialValues(Protocol):
    """A source that refuses special values by default and can pass them on to a sink that keeps them."""

    def keeping(self, kinds: tuple[str, ...]) -> Any: ...


@dataclass(frozen=True)
class PrepareRequest:
    """What a sink's ``prepare`` gets: the source's schema and description (``info.native``: what
    a database source offers beyond Arrow). Never the source itself."""

    schema: pa.Schema
    info: SourceInfo


@dataclass(frozen=True)
class WriteStats:
    """What one partition's write did."""

    partition: str
    rows: int
    bytes: int
    seconds: float
    #: the partition had been committed under this load id before (nothing was written again)
    already_committed: bool = False


@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink guarantees, declared as data (the runtimes and the job act on it).

    ``transactional``: a partition is written all or nothing (one transaction, or a temporary
    name renamed when whole), so a failed attempt leaves nothing and may be retried. A sink that
    is not (a Flight do_put stream) is never retried: a retry could duplicate rows.
    ``single_process``: every partition must be written from the driver's process.
    """

    transactional: bool = True
    single_process: bool = False


def sink_capabilities(sink: Any) -> SinkCapabilities:
    """A sink's declared capabilities (the defaults where it declares none)."""
    caps = getattr(type(sink), "capabilities", None)
    return caps if isinstance(caps, SinkCapabilities) else SinkCapabilities()


@runtime_checkable
class SupportsCommitMarkers(Protocol):
    """A sink that records each partition's commit in the same transaction as its rows.

    ``committed`` reads them back: {partition key: rows} for the plan's load id (None where this
    target keeps no markers, e.g. switched off by config). A write whose
    partition is already committed under that load id writes nothing (exactly once, whatever
    died when), and ``resume`` skips what the target says was committed.
    """

    def committed(self, plan: SinkPlan) -> dict[str, int] | None: ...


@runtime_checkable
class SupportsCleanup(Protocol):
    """A sink that can list, and remove, what runs that are gone left behind (staging tables)."""

    def leftovers(self, remove: bool) -> list[str]: ...


# --- optional capabilities: a plugin offers one by having its method; the job asks with isinstance --


@runtime_checkable
class SupportsSession(Protocol):
    """A source that holds something for the whole job (an exported snapshot): ``session()`` is a
    context manager yielding the source the tasks get."""

    def session(self) -> Any: ...


def open_session(source: Any) -> Any:
    """The source's job-long session where it has one (a context manager yielding the source the
    tasks get), else the source itself."""
    return source.session() if isinstance(source, SupportsSession) else contextlib.nullcontext(source)


@runtime_checkable
class SupportsSnapshot(Protocol):
    """A source whose partitions all read one snapshot; its id goes into the manifest."""

    snapshot_id: str | None


@runtime_checkable
class SupportsPartitionCounts(Protocol):
    """A source that counts the rows of its partitions (``verify=count``); None: it cannot."""

    def count_rows(self, parts: list[Partition]) -> list[int] | None: ...


@runtime_checkable
class SupportsChecksums(Protocol):
    """A source that sums a 64-bit hash of every row per partition (``verify=checksum``)."""

    def checksums(self, parts: list[Partition], columns: tuple[str, ...]) -> list[tuple[int, int]]: ...


@runtime_checkable
class SupportsTargetCount(Protocol):
    """A sink that counts the rows its target holds after the load (``verify=count``)."""

    def count_rows(self, plan: SinkPlan) -> int | None: ...


@runtime_checkable
class SupportsTargetChecksum(Protocol):
    """A sink that computes the same checksum as ``SupportsChecksums`` over what it wrote."""

    def checksum(self, plan: SinkPlan) -> str: ...


class NativeStream(Protocol):
    """A partition in a source's wire format: ``read`` returns up to ``size`` bytes, b"" at the end,
    and raises the source's error there if the export failed (a sink must not commit then)."""

    def read(self, size: int) -> bytes: ...


@runtime_checkable
class SupportsNativeExport(Protocol):
    """A source that streams a partition in its wire format (``info.native.format``), reading the
    job's snapshot with its own credentials: a context manager yielding a :class:`NativeStream`."""

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[NativeStream]: ...


@runtime_checkable
class SupportsNativeWrite(Protocol):
    """A sink that imports a wire format it agreed on in ``prepare`` (``plan.native``): the task
    streams the source's export into ``write_native`` instead of Arrow batches."""

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats: ...


@runtime_checkable
class ExplainsPath(Protocol):
    """A sink that tells ``conveyor plan`` which path a run would take, changing nothing."""

    def explain_path(self, request: PrepareRequest) -> str: ...


@runtime_checkable
class ChecksBeforeRun(Protocol):
    """A runtime that refuses, before anything moves, a pair it cannot run (e.g. a single-process sink)."""

    def check(self, source: Any, sink: Any) -> None: ...


class Sink(Protocol):
    """Writes Arrow record batches with a lifecycle: prepare, write per partition, finalize or abort.

    Optional: ``SupportsNativeWrite``, ``SupportsTargetCount``, ``SupportsTargetChecksum``,
    ``SupportsCommitMarkers``, ``SupportsCleanup``, ``ExplainsPath``.
    """

    def prepare(self, request: PrepareRequest) -> SinkPlan: ...

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[pa.RecordBatch]) -> WriteStats: ...

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None: ...

    def abort(self, plan: SinkPlan) -> None: ...

    #: what the sink guarantees; see :class:`SinkCapabilities`
    capabilities: ClassVar[SinkCapabilities]


@dataclass(frozen=True)
class PlanRequest:
    """Everything a strategy may use; new settings become new fields with defaults."""

    source: Any
    info: SourceInfo
    degree: int


@dataclass(frozen=True)
class PartitionPlan:
    """What a strategy decided: the partitions, and a note saying how it chose them (for
    ``conveyor plan`` and the report)."""

    partitions: Sequence[Partition]
    note: str = ""


class Strategy(Protocol):
    """Splits a source into partitions. Never writes SQL: connectors render partitions."""

    def plan(self, request: PlanRequest) -> PartitionPlan: ...


# --- tasks: what a runtime runs, and what it reports -------------------------------------------


class Progress(Protocol):
    """Receives what tasks do, per batch (never per row)."""

    def started(self, key: str) -> None: ...

    def advanced(self, key: str, rows: int, nbytes: int) -> None: ...

    def finished(self, result: TaskResult) -> None: ...


class NullProgress:
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

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class KnowsCpus(Protocol):
    """A runtime whose tasks run on other CPUs than the driver's (a Ray cluster): how many."""

    def cpus(self) -> int: ...


def resolve_degree(runtime: Any, degree: int) -> int:
    """The degree a job runs at, resolved once: N > 0 as given; N < 0 the runtime's CPUs / |N|
    (the cluster's for a runtime that knows them, else this machine's)."""
    if degree > 0:
        return degree
    return JobOptions.resolve_degree(degree, runtime.cpus() if isinstance(runtime, KnowsCpus) else None)


class Runtime(Protocol):
    """Runs tasks, ``degree`` at once, and returns one result per task in any order; a failed
    partition cancels the ones not started (their results say ``cancelled``)."""

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]: ...
