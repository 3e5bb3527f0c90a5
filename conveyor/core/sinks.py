"""The sink side: ``Sink`` and its lifecycle data (``PrepareRequest``, ``SinkPlan``, ``WriteStats``),
its declared capabilities, and the optional capabilities a sink offers by having their methods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from conveyor.core.counting import Counting, Expected
from conveyor.core.cursor import CursorWindow
from conveyor.core.partitions import Partition
from conveyor.core.sources import ArrowSchemaField, ForeignKey, NativeStream, SourceInfo, column_names

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
    #: (set by the job from its :class:`Agreement`)
    native: str | None = None
    #: the data path the job agreed on (``Agreement.path``: what ``conveyor plan`` printed), and with
    #: the sink's own details of how it writes (its encoder, its bulk path) after it
    path: str = ""
    path_reason: str = ""
    #: a table this load creates: what of the source table's definition it carries, and what not (the report says it)
    definition: str = ""
    #: special values this sink writes exactly (``INFINITY``): the job asks the source to pass
    #: them on instead of refusing them (``Source.keeping``)
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
    #: still hold back): it compares each partition's rows with the source's (``expecting``) inside
    #: the partition's own transaction
    checks_before_commit: bool = False
    #: how the source's side of each partition is counted (set by the job, once)
    counting: Counting = Counting.AFTER
    #: {partition key: rows the source holds for it}, counted in the job's snapshot before the tasks
    #: (``Counting.BEFORE``; set by the job)
    expected_rows: Mapping[str, int] | None = None
    #: the source's count of the partition a task writes, for the sink's check before its commit (set
    #: by the task, from ``counting``; None: not checked there): ``check_partition_rows(..., plan.expecting, ...)``
    expecting: Expected | None = None


@dataclass(frozen=True)
class TargetInfo:
    """What a sink's target is and can take for this load: the mirror of :class:`SourceInfo`, read once
    while planning by ``Sink.describe_target`` (read-only). Facts, not decisions: the job agrees on the
    path from them and the source's (:class:`Agreement`) and hands that to ``prepare``."""

    #: where rows land, for messages and the report
    label: str = ""
    #: the target's range partitions a plan may align with (None: not partitioned by range on one
    #: column, or the load goes through a staging table, where alignment buys nothing)
    layout: TargetLayout | None = None
    #: the rows a partition's transaction should hold at least (a columnar table's stripe), and why
    min_partition_rows: int = 0
    min_partition_why: str = ""
    #: the native format (``NativeExport.format``) it takes from this source as it is (None: Arrow batches)
    native: str | None = None
    #: it computes ``Source.checksums``' sum over what the target stored (``Sink.checksum``): ``verify=checksum``
    checksums: bool = False
    #: each partition's commit is final (an append, a load in one transaction): it checks each
    #: partition's rows against the source's before it commits
    checks_before_commit: bool = False
    #: the load is one transaction into the target itself (a truncate of one partition, in place)
    in_place: bool = False
    #: the data path, as ``conveyor plan`` prints it and the run takes it
    path: str = ""
    #: the target as a plan of ONE partition would load it, where that differs (a truncate in place)
    one_partition: TargetInfo | None = None
    #: a plan of this many partitions cannot be loaded so: why ({partitions} is their number), the
    #: config key that asked for it, and a hint (the job refuses the plan with them)
    refused: str = ""
    refused_key: str = ""
    refused_hint: str = ""

    def for_partitions(self, count: int) -> TargetInfo:
        """The target as a plan of ``count`` partitions loads it."""
        return self.one_partition if count == 1 and self.one_partition is not None else self


@dataclass(frozen=True)
class Agreement:
    """What the two ends agreed on for a load, decided once by the job from :class:`SourceInfo`,
    :class:`TargetInfo` and its options (``conveyor.pipelines.agree``), and handed to ``prepare``: so
    ``conveyor plan`` and ``conveyor run`` take one path by construction."""

    #: the native format both speak, streamed as it is (None: Arrow batches)
    native: str | None = None
    #: the load is one transaction into the target itself
    in_place: bool = False
    #: each partition's commit is final and checked against the source's count before it
    checks_before_commit: bool = False
    #: how the source's side of each partition is counted
    counting: Counting = Counting.AFTER
    #: the data path, as ``conveyor plan`` prints it
    path: str = ""


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
    #: what the job agreed on with the two ends (prepare follows it; None in ``describe_target``)
    agreement: Agreement | None = None

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
    #: the sources' wire formats (``NativeExport.format``) its ``write_native`` can import, into a target
    #: that takes them (``TargetInfo.native`` says whether this one does)
    native_formats: tuple[str, ...] = ()
    #: a source of the sink's type reads its target back exactly (``conveyor verify``, ``verify=checksum``): with the
    #: sink's own keys that source shares and those ``read_back`` adds
    read_back: bool = False


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
    ``for_target(schema, table, options)`` is this sink aimed at the target for that source table
    (its table or path setting taken as a template: ``{table}`` and ``{schema}`` are replaced)."""

    def for_target(self, schema: str, table: str, options: Any) -> Any: ...


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

    def target_rows(self, plan: SinkPlan) -> int | None: ...


class Sink(Protocol):
    """Writes Arrow record batches with a lifecycle: describe the target (planning), prepare, write
    per partition, finalize or abort. Its other members are hooks whose defaults :class:`SinkBase`
    gives: ``write_native`` (where its ``TargetInfo.native`` takes the source's wire format),
    ``checksum`` (where ``TargetInfo.checksums``), ``add_foreign_keys`` (a job over several tables).

    Optional capabilities (more than one sink has them): ``SupportsTargetCount``,
    ``SupportsCommitMarkers``, ``SupportsCleanup``, ``SupportsManyTargets``, ``SupportsCursorState``.
    """

    #: the plugin's config dataclass (its YAML node is merged into it, unknown keys refused)
    config_class: ClassVar[type]

    def describe_target(self, request: PrepareRequest) -> TargetInfo: ...

    def prepare(self, request: PrepareRequest) -> SinkPlan: ...

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[pa.RecordBatch]) -> WriteStats: ...

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None: ...

    def abort(self, plan: SinkPlan) -> None: ...

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats: ...

    def checksum(self, plan: SinkPlan) -> str: ...

    def add_foreign_keys(self, plan: SinkPlan, keys: Sequence[tuple[ForeignKey, Any]]) -> list[str]: ...

    #: what the sink guarantees; see :class:`SinkCapabilities`
    capabilities: ClassVar[SinkCapabilities]


class SinkBase:
    """Defaults for what the job reads off a sink: its capabilities (transactional, the usual load
    modes) and a target description that says only where rows land (no layout, no native format, no
    check before each commit, no checksum). A sink whose commits are final, or that takes a native
    stream, says so in its own ``describe_target``."""

    capabilities: ClassVar[SinkCapabilities] = SinkCapabilities()

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        return TargetInfo(label=type(self).__name__)

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats:
        """Import one partition in the wire format agreed on (``plan.native``), streamed from the source's export."""
        raise _not_offered(self, f"the native format {plan.native}")

    def checksum(self, plan: SinkPlan) -> str:
        """The same checksum as ``Source.checksums``, over what the target stored."""
        raise _not_offered(self, "a checksum")

    def add_foreign_keys(self, plan: SinkPlan, keys: Sequence[tuple[ForeignKey, Any]]) -> list[str]:
        """Make a source's foreign keys between the targets of one job over several tables, once every table
        is loaded: ``keys`` pairs each foreign key of this target's source table with the sink of the table
        it references. Returns what it made (the default: nothing)."""
        return []

    def read_back(self, like: pa.Schema) -> dict[str, Any]:
        """How its target is read back, where it declares it can be (``SinkCapabilities.read_back``): a source of the
        sink's type reads it, with the sink's own config keys that source shares (its connection, table or path) and
        these keys besides, so that it returns what the sink wrote for rows of schema ``like`` exactly (the default:
        none besides). The suite rule ``SinkSuite.test_its_read_back_returns_what_it_wrote`` holds a sink to it."""
        return {}


def _not_offered(plugin: Any, what: str) -> Exception:
    from conveyor.errors import PluginError

    return PluginError(f"{type(plugin).__name__} was asked for {what}, which its target does not offer")


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
    "CursorState",
    "SupportsCursorState",
    "SinkPlan",
    "PrepareRequest",
    "TargetInfo",
    "Agreement",
    "SinkBase",
    "TargetLayout",
    "WriteStats",
    "SinkCapabilities",
    "sink_capabilities",
    "SupportsCommitMarkers",
    "SupportsManyTargets",
    "target_for",
    "SupportsCleanup",
    "SupportsTargetCount",
    "Sink",
]
