"""The sink side: ``Sink`` and its lifecycle data (``PrepareRequest``, ``SinkPlan``, ``WriteStats``),
its declared capabilities, and the optional capabilities a sink offers by having their methods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from conveyor.core.partitions import Partition
from conveyor.core.sources import ArrowSchemaField, CursorWindow, ForeignKey, NativeStream, SourceInfo, column_names

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up
    import pyarrow as pa



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
    #: rows the target held before an append (``verify=count`` compares what was added); None: not
    #: counted (a sink that checks each partition's rows before its commit need not scan its target)
    rows_before: int | None = 0
    #: the partitions (indexes) this run writes, set by the job (a resumed run writes only the rest)
    to_write: tuple[int, ...] | None = None
    #: the sink's own decisions, as its own picklable dataclass (the PostgreSQL sink's writer and
    #: casts, ...): read only by the sink that made them
    own: Any = None
    #: the sink's partition commits are final (no staging swapped in later that a failed check could
    #: still hold back): it compares each partition's rows with ``expected_rows`` inside the
    #: partition's own transaction, and the job counts the source before the tasks run to fill it
    checks_before_commit: bool = False
    #: {partition key: rows the source holds for it}, counted in the job's snapshot (set by the job)
    expected_rows: Mapping[str, int | ReadCount] | None = None
    #: set by the job instead of ``expected_rows`` on a native path whose source counts what it
    #: streams (``NativeExport.counts``) when the job verifies: the sink checks each partition's
    #: rows against the stream's count (``NativeStream.rows``) inside the partition's transaction,
    #: and reports it (``WriteStats.source_rows``); the source is not counted apart
    counts_from_stream: bool = False
    #: set by the job instead of ``expected_rows`` where the source's reads count what they send
    #: (``SupportsReadCounts``) and the sink checks before its commits: each task gives the sink a
    #: :class:`ReadCount` for its partition in ``expected_rows``, and the source is not counted before
    #: the tasks
    counts_from_read: bool = False


@dataclass(frozen=True)
class PrepareRequest:
    """What a sink's ``prepare`` gets: the source's schema and description (``info.native``: what
    a database source offers beyond Arrow). Never the source itself."""

    #: the source's Arrow schema (a DeferredSchema is made the first time this is read: a sink that
    #: needs only the columns' names reads ``column_names``)
    schema: pa.Schema = ArrowSchemaField()  # type: ignore[assignment]
    info: SourceInfo
    #: how many partitions the plan has (0: not known); a sink may load a one-partition plan in a
    #: single transaction instead of through a staging table
    partitions: int = 0
    #: an incremental load's window: the sink records it as pending in prepare and makes its upper
    #: end the committed cursor when the load is made visible
    window: CursorWindow | None = None

    @property
    def column_names(self) -> list[str]:
        """The source's column names, without making a deferred schema."""
        return column_names(self.__dict__["_schema_as_given"])


@dataclass(frozen=True)
class TargetLayout:
    """How a target is split into range partitions on one column: the boundaries (ascending, each a
    value of that column) a source plan can align with, so each source partition holds one target
    partition's rows and is written straight into it instead of routed through the parent."""

    column: str
    bounds: tuple[Any, ...]
    #: the target partitions, for plans and messages
    partitions: int = 0


@runtime_checkable
class SupportsTargetLayout(Protocol):
    """A sink that can say how its target is partitioned (None: not by range on one column, or
    the load goes through a staging table, where alignment buys nothing)."""

    def target_layout(self, request: PrepareRequest) -> TargetLayout | None: ...


@runtime_checkable
class WantsPartitionRows(Protocol):
    """A sink whose target stores each partition's transaction best in whole units of some rows
    (a columnar table's stripe: one transaction's rows or ``stripe_row_limit``, whichever is less):
    the rows a partition should hold at least (0: no wish). Strategies that choose the partition
    count keep to it unless ``strategy.partitions`` is set."""

    def partition_rows(self, request: PrepareRequest) -> tuple[int, str]: ...


@dataclass(frozen=True)
class WriteStats:
    """What one partition's write did."""

    partition: str
    rows: int
    bytes: int
    seconds: float
    #: the partition had been committed under this load id before (nothing was written again)
    already_committed: bool = False
    #: the rows the source said it sent (a native stream's own count, ``NativeStream.rows``); None: not said
    source_rows: int | None = None


@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink guarantees, declared as data (the runtimes and the job act on it).

    ``transactional``: a partition is written all or nothing (one transaction, or a temporary
    name renamed when whole), so a failed attempt leaves nothing and may be retried. A sink that
    is not (a Flight do_put stream) is never retried: a retry could duplicate rows.
    ``single_process``: every partition must be written from the driver's process.
    ``load_modes``: what ``load_mode`` may be (``merge`` only where the sink upserts by key).
    """

    transactional: bool = True
    single_process: bool = False
    #: the load modes it implements; the job refuses any other before anything connects
    load_modes: tuple[str, ...] = ("truncate", "append", "create", "replace")


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
class SupportsManyTargets(Protocol):
    """A sink that can load each table of a job over several tables into a target of its own:
    ``for_table(schema, table, options)`` is this sink aimed at the target for that source table
    (its table or path setting taken as a template: ``{table}`` and ``{schema}`` are replaced)."""

    def for_table(self, schema: str, table: str, options: Any) -> Any: ...


@runtime_checkable
class SupportsForeignKeys(Protocol):
    """A sink that can make a source's foreign keys between the targets of one job over several
    tables, once every table is loaded: ``keys`` pairs each foreign key of this target's source
    table with the sink of the table it references. Returns what it made (empty: nothing, e.g.
    switched off by config)."""

    def add_foreign_keys(self, plan: SinkPlan, keys: Sequence[tuple[ForeignKey, Any]]) -> list[str]: ...


class ReadCount:
    """One partition's source count, taken by its read (``SentBatches.sent``: the rows the source's
    server said its scan returned), for a sink that checks the partition before its commit
    (``SinkPlan.counts_from_read``). Where that count is the rows written, it stands; where it is
    not, or missing, the partition is counted at the source in the job's snapshot and that count
    decides: a plan the source did not foresee costs a count, never a false verdict, and rows a
    decoder lost are still caught. ``value``: the count that decided, once resolved."""

    def __init__(self, reading: Any, source: Any, part: Partition) -> None:
        self.reading, self.source, self.part = reading, source, part
        self.value: int | None = None

    def resolve(self, rows: int) -> int | None:
        sent = getattr(self.reading, "sent", None)
        if sent is not None and sent == rows:
            self.value = sent
        else:
            counted = self.source.count_rows([self.part])
            self.value = None if counted is None else counted[0]
        return self.value


def check_partition_rows(target: str, partition: str, expected: int | ReadCount | None, rows: int) -> None:
    """A sink whose partition commits are final (``SinkPlan.checks_before_commit``) calls this inside
    the partition's transaction, before COMMIT: rows written must be the rows the source counted
    (``expected``; None: not counted; a :class:`ReadCount`: the read's count, resolved here), else
    nothing of the partition stays."""
    if isinstance(expected, ReadCount):
        expected = expected.resolve(rows)
    if expected is not None and rows != expected:
        from conveyor.errors import VerificationError

        raise VerificationError(f"verification failed for {target}: partition {partition}: source {expected:,} rows, "
                                f"written {rows:,}: rolled back", hint="the target was not changed by this partition; see the report")


def check_stored(target: str, partition: str, sent: int | None, stored: int | None) -> None:
    """Every sink calls this inside a partition's transaction, before COMMIT: the rows the target says
    it stored (its COPY or INSERT count, or a count in the transaction) must be the rows it was sent.
    A target can drop rows without an error (a BEFORE INSERT trigger returning NULL, a rule, a conflict
    clause): then nothing of the partition stays. None: not known (not checked)."""
    if sent is None or stored is None or stored == sent:
        return
    from conveyor.errors import VerificationError

    raise VerificationError(
        f"verification failed for {target}: partition {partition}: the target stored {stored:,} of the {sent:,} rows sent to it "
        f"(a trigger, rule or conflict clause on it dropped {sent - stored:,} without an error): rolled back",
        hint="the target was not changed by this partition; see the target's triggers and rules "
             "(or load into a table without them); verify=none loads without this check")


def target_for(template: str, schema: str, table: str, what: str) -> str:
    """A table's target from a sink setting: ``{table}`` / ``{schema}`` replaced; a setting without
    them names one target, which several tables cannot share."""
    if "{table}" not in template:
        from conveyor.errors import ConfigError

        raise ConfigError(f"{what}={template!r} names one target, and source.tables names several tables",
                          key=what, hint=f"use a template such as {what}='{{table}}' (or leave it unset): each table gets its own")
    return template.replace("{schema}", schema).replace("{table}", table)


@runtime_checkable
class SupportsCleanup(Protocol):
    """A sink that can list, and remove, what runs that are gone left behind (staging tables)."""

    def leftovers(self, remove: bool) -> list[str]: ...


@runtime_checkable
class SupportsTargetCount(Protocol):
    """A sink that counts the rows its target holds after the load (``verify=count``)."""

    def count_rows(self, plan: SinkPlan) -> int | None: ...


@runtime_checkable
class SupportsTargetChecksum(Protocol):
    """A sink that computes the same checksum as ``SupportsChecksums`` over what it wrote."""

    def checksum(self, plan: SinkPlan) -> str: ...


@runtime_checkable
class SupportsNativeWrite(Protocol):
    """A sink that imports a wire format it agreed on in ``prepare`` (``plan.native``): the task
    streams the source's export into ``write_native`` instead of Arrow batches."""

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats: ...


@runtime_checkable
class ExplainsPath(Protocol):
    """A sink that tells ``conveyor plan`` which path a run would take, changing nothing."""

    def explain_path(self, request: PrepareRequest) -> str: ...


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
class CursorState:
    """What a target keeps of an incremental load: the last committed cursor value, and the window
    of a run that started and has not finished (its load id, mode, and partitions it committed)."""

    value: Any = None
    pending: CursorWindow | None = None
    pending_load: str = ""
    pending_mode: str = ""
    pending_committed: int = 0


@runtime_checkable
class SupportsCursorState(Protocol):
    """A sink that keeps incremental cursors where its loads commit."""

    def cursor_state(self, column: str) -> CursorState: ...


__all__ = [
    "ReadCount",
    "CursorState",
    "SupportsCursorState",
    "SinkPlan",
    "PrepareRequest",
    "TargetLayout",
    "SupportsTargetLayout",
    "WantsPartitionRows",
    "WriteStats",
    "SinkCapabilities",
    "sink_capabilities",
    "SupportsCommitMarkers",
    "SupportsManyTargets",
    "SupportsForeignKeys",
    "target_for",
    "check_partition_rows",
    "check_stored",
    "SupportsCleanup",
    "SupportsTargetCount",
    "SupportsTargetChecksum",
    "SupportsNativeWrite",
    "ExplainsPath",
    "Sink",
]
