"""The source side: what a source says about itself (``SourceInfo``, ``NativeExport``), the
``Source`` interface with its defaults (``SourceBase``), and the capabilities strategies and the job
ask of several sources (``SupportsKeys``, ``SupportsPartitionCounts``, ...) by having their methods."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from conveyor.core.partitions import Partition

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up
    import pyarrow as pa



@dataclass(frozen=True)
class NativeExport:
    """What a database source says of itself beyond Arrow: its dialect's column types (a sink of
    the same database creates and checks columns with them) and the wire format, if any, it can
    stream a partition in (a sink that imports that format may take the pass-through)."""

    #: the database the columns come from ("postgres")
    dialect: str
    #: the dialect's own column records (``PgColumn`` for postgres), in the schema's order
    columns: tuple[Any, ...] = ()
    #: the format ``Source.export_native`` streams (e.g. "pgcopy-binary"); None: none
    format: str | None = None
    #: why there is no format (e.g. "psql is not installed")
    why_not: str = ""
    #: each stream says at its end how many rows the source sent (``NativeStream.rows``, counted
    #: by the source database, e.g. its COPY's count): ``verify=count`` checks the target's count
    #: against it and does not count the source again
    counts: bool = False


@dataclass(frozen=True)
class ForeignKey:
    """A source table's foreign key: its columns reference ``columns_referenced`` of ``schema.table``."""

    columns: tuple[str, ...]
    schema: str
    table: str
    columns_referenced: tuple[str, ...]
    #: what a delete or update of a referenced row does, in SQL ("ON DELETE CASCADE"; "": no action)
    actions: str = ""

    @property
    def referenced(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True)
class SequenceDef:
    """An identity or serial column of a source table and where its sequence stands."""

    column: str
    #: "always" / "by default" (an identity column), "" (a serial: a default taking its own sequence's next value)
    identity: str
    #: the sequence's options in SQL (START, INCREMENT, MINVALUE, MAXVALUE, CACHE, CYCLE)
    options: str
    #: the last value the source's sequence gave out (None: none yet)
    last_value: int | None


@dataclass(frozen=True)
class TableDefinition:
    """What a source table is beyond its columns' types and its keys (``SourceInfo.primary_key`` /
    ``foreign_keys``): a sink creating its target carries what it can and says what it did not. The
    expressions and definitions are SQL of ``dialect``'s engine."""

    dialect: str
    #: the source table's own name (an index named after it is named after the target)
    table: str = ""
    not_null: tuple[str, ...] = ()
    comment: str | None = None
    column_comments: tuple[tuple[str, str], ...] = ()
    #: (column, default expression), serial columns' aside (``sequences``)
    defaults: tuple[tuple[str, str], ...] = ()
    sequences: tuple[SequenceDef, ...] = ()
    #: (name, definition, its index after ``ON <table>`` for a UNIQUE constraint else "", "DEFERRABLE ..." or "")
    #: of CHECK, UNIQUE and EXCLUDE constraints
    constraints: tuple[tuple[str, str, str, str], ...] = ()
    #: (name, definition after ``ON <table>``: "USING btree (a, lower(b)) WHERE ...") of the other indexes
    indexes: tuple[tuple[str, str], ...] = ()
    #: what the table has that no sink carries (its triggers, row security, generated expressions, ...)
    not_carried: tuple[str, ...] = ()
    #: (column, its type as the table declares it, what kind of type that is: "an enum", "a domain", ...) for the
    #: columns whose declared type is not a built-in one: a sink that makes another type says so
    declared_types: tuple[tuple[str, str, str], ...] = ()
    #: (column, its collation, quoted) for the columns whose collation is not their type's default: a target of the same
    #: engine takes it, another one says it did not
    collations: tuple[tuple[str, str], ...] = ()

    @property
    def comments(self) -> int:
        """The table's and its columns' comments."""
        return len(self.column_comments) + (self.comment is not None)

    def beyond_keys(self) -> list[str]:
        """What a target that takes only NOT NULL, the key and comments leaves of it (another engine: its SQL for
        defaults, checks and indexes is not this dialect's)."""
        return ([f"{len(x)} {what}" for x, what in ((self.defaults, "default(s)"), (self.sequences, "identity/serial column(s)"),
                                                    (self.constraints, "CHECK/UNIQUE/EXCLUDE constraint(s)"), (self.indexes, "index(es)"))
                 if x] + list(self.not_carried)
                + [f"column {c}'s type {sql} ({kind}): made of its values as read" for c, sql, kind in self.declared_types]
                + [f"column {c}'s collation {collation}" for c, collation in self.collations])

    @staticmethod
    def said(carried: Sequence[tuple[int, str]], left: Sequence[str]) -> str:
        """The line a run says (and report.json keeps): ``carried`` as (how many, what), then what was ``left``."""
        parts = [f"{n} {what}" for n, what in carried if n]
        return "definition carried: " + (", ".join(parts) or "nothing beyond the columns") + (f"; not carried: {'; '.join(left)}" if left else "")


def columns_only(info: SourceInfo, key_as: str = "") -> str:
    """The definition line of a new target that takes the source's columns and no more of its definition (a file, a lake
    table; ``key_as``: what it makes of the primary key, e.g. ClickHouse's sorting key): what it carried and what it left
    ("" where the source describes no definition and no key)."""
    d, key = info.definition, info.primary_key
    if d is None and not key:
        return ""
    left = [f"{len(d.not_null)} NOT NULL"] if d is not None and d.not_null else []
    if key and not key_as:
        left.append("primary key")
    if d is not None and d.comments:
        left.append(f"{d.comments} comment(s)")
    return TableDefinition.said(((1 if key and key_as else 0, f"primary key ({key_as})"),), left + (d.beyond_keys() if d is not None else []))


class DeferredSchema:
    """An Arrow schema made the first time something reads it, with its column names known before.

    A source whose schema costs an import (pyarrow with numpy: ~0.07 s of a job's start here) gives
    one for ``SourceInfo.schema``; a job that never handles Arrow (a PostgreSQL -> PostgreSQL
    pass-through) reads only the names (``column_names``), and pyarrow is never imported. Reading
    ``schema`` makes it (once; the result is kept). Pickled, it stays deferred until made (its maker
    goes along: a task that reads no Arrow never makes it), and once made it is the schema."""

    def __init__(self, make: Callable[[], pa.Schema], names: Sequence[str]) -> None:
        self._make: Callable[[], pa.Schema] | None = make
        self._schema: pa.Schema | None = None
        self._lock = threading.Lock()
        self.names = list(names)

    def get(self) -> pa.Schema:
        with self._lock:
            if self._make is not None:
                self._schema, self._make = self._make(), None
        return self._schema

    def __reduce__(self) -> tuple[Any, ...]:
        with self._lock:
            if self._make is not None:
                return DeferredSchema, (self._make, self.names)
        return _identity, (self._schema,)


def _identity(value: Any) -> Any:
    return value


class ArrowSchemaField:
    """A dataclass field holding an Arrow schema that may be given as a :class:`DeferredSchema`:
    reading the field always gives the schema (a deferred one is made then, and kept)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_as_given"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:  # the field has no default
            raise AttributeError(self.slot)
        given = obj.__dict__[self.slot]
        if isinstance(given, DeferredSchema):
            given = given.get()
            obj.__dict__[self.slot] = given
        return given

    def __set__(self, obj: Any, value: Any) -> None:  # the dataclass's __init__ (frozen: object.__setattr__)
        obj.__dict__[self.slot] = value


def column_names(schema: Any) -> list[str]:
    """The names of an Arrow schema's columns, or of a deferred one's without making it."""
    return list(schema.names)


@dataclass(frozen=True)
class SourceInfo:
    """What planning knows of a source: its Arrow schema, size estimates, a human label."""

    #: the Arrow schema of the batches the source reads (given as a DeferredSchema by a source that
    #: makes it only when something reads it)
    schema: pa.Schema = ArrowSchemaField()  # type: ignore[assignment]
    label: str
    estimated_rows: int | None = None
    estimated_bytes: int | None = None
    #: a database source's own column types and wire format (None: Arrow is all it speaks)
    native: NativeExport | None = None
    #: how the source reads Arrow batches, where it has a choice (the job's log says it)
    reader: str = ""
    #: the source table's primary key columns (a sink creating its target may make the same key)
    primary_key: tuple[str, ...] = ()
    #: the source table's foreign keys (a job over several tables may make them between its targets)
    foreign_keys: tuple[ForeignKey, ...] = ()
    #: the rest of the source table's definition (defaults, sequences, constraints, indexes, comments)
    definition: TableDefinition | None = None
    #: the kinds of partition (``Partition.kind``) whose reads report the rows the source's server sent for
    #: them (:class:`SentBatches`: ``sent``), over the whole table (not within an incremental window):
    #: a sink that checks each partition before its commit checks against that count, and the job does not
    #: count the source apart (``Counting.READ``)
    reads_count: tuple[str, ...] = ()
    #: the source sums a 64-bit hash of every row per partition in its database (``Source.checksums``), as
    #: a sink whose target says the same computes it over what it stored (``verify=checksum``)
    checksums: bool = False

    @property
    def column_names(self) -> list[str]:
        """The columns' names, without making a deferred schema."""
        return column_names(self.__dict__["_schema_as_given"])

    @property
    def schema_as_given(self) -> pa.Schema | DeferredSchema:
        """The schema as the source gave it (deferred or not): what the job's PrepareRequests carry."""
        return self.__dict__["_schema_as_given"]


class Source(Protocol):
    """Reads Arrow record batches. Built from its config dataclass and the job options.

    ``describe`` and ``read`` are the source; every other member is a hook the job calls on every
    source, whose default :class:`SourceBase` gives (a source subclasses it and overrides what it
    does): its job-long ``session`` (one snapshot; ``snapshot_id`` names it), ``warm_up`` before its
    reads in this process, ``keeping`` the special values a sink keeps, the tables of a job over
    several (``many``, ``tables``, ``for_table``), and what its ``SourceInfo`` offers: ``checksums``
    (``info.checksums``) and ``export_native`` (``info.native.format``)."""

    #: the plugin's config dataclass (its YAML node is merged into it, unknown keys refused)
    config_class: ClassVar[type]
    #: the snapshot every partition of the job reads, once the session is open (kept in the run's
    #: manifest); None: none
    snapshot_id: str | None

    def describe(self) -> SourceInfo: ...

    def read(self, part: Partition) -> Iterator[pa.RecordBatch]: ...

    def session(self) -> contextlib.AbstractContextManager[Any]: ...

    def warm_up(self) -> None: ...

    def keeping(self, kinds: tuple[str, ...]) -> Any: ...

    def many(self) -> bool: ...

    def tables(self) -> list[SourceTable]: ...

    def for_table(self, table: SourceTable, options: Any) -> Any: ...

    def checksums(self, parts: list[Partition], columns: tuple[str, ...]) -> list[tuple[int, int]]: ...

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[NativeStream]: ...


class SourceBase:
    """The defaults of a source's hooks: no session of its own (its tasks get the source itself), no
    snapshot, nothing to warm up, no special values to pass on, one table, neither checksums nor a
    native format (its ``SourceInfo`` offers none, so the job never asks for them)."""

    snapshot_id: str | None = None

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """A context manager held for the whole job (e.g. an exported snapshot), yielding the source
        the tasks get."""
        return contextlib.nullcontext(self)

    def warm_up(self) -> None:
        """Begin, in a thread of this process, what the first read of Arrow batches pays for (DuckDB's
        postgres extension loaded and the server attached), and return at once. The job calls it once
        the source is described, where the source will be read as Arrow batches in this process, so
        that it overlaps planning and preparing; what fails there is left for the read to meet."""

    def keeping(self, kinds: tuple[str, ...]) -> Any:
        """This source passing on the special values (``INFINITY``) a sink keeps, which it refuses by default."""
        return self

    def comparing(self, other: Any) -> Any:
        """This source as ``conveyor verify`` reads it beside ``other`` (the other end, read as a source): where both are
        one engine, values Arrow cannot hold may be read as the text both print alike."""
        return self

    def many(self) -> bool:
        """Whether this source is configured with several tables, read in one snapshot (no connection made)."""
        return False

    def tables(self) -> list[SourceTable]:
        """The tables its patterns match (asked of the session's source: the tables of its snapshot)."""
        return []

    def for_table(self, table: SourceTable, options: Any) -> Any:
        """A source of that one table, from this one's settings (its own ``options``: each table's load has
        its own run id), reading in this source's snapshot."""
        raise _not_offered(self, "several tables")

    def checksums(self, parts: list[Partition], columns: tuple[str, ...]) -> list[tuple[int, int]]:
        """(rows, sum of a 64-bit hash of every row) per partition, where ``describe`` says ``checksums``."""
        raise _not_offered(self, "checksums")

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[NativeStream]:
        """A partition in the wire format ``describe`` offers (``info.native.format``), reading the job's
        snapshot with its own credentials: a context manager yielding a :class:`NativeStream`."""
        raise _not_offered(self, "a native format")


def _not_offered(plugin: Any, what: str) -> Exception:
    from conveyor.errors import PluginError

    return PluginError(f"{type(plugin).__name__} was asked for {what}, which it does not offer")


class SentBatches:
    """A partition's batches, as ``Source.read`` may return them when its database counts what it
    sends: ``sent`` is that count (the rows the server's scan returned), set once every batch has
    been read; None where it did not count. ``verify=count`` takes it for the partition's source
    count where it equals the rows written (the count the rows are checked against, taken in the same
    read instead of by a second scan), and counts the partition again where it does not.

    ``read`` makes the batches, given this object to set ``sent`` on."""

    def __init__(self, read: Callable[[SentBatches], Iterator[Any]]) -> None:
        self.sent: int | None = None
        self._batches = read(self)

    def __iter__(self) -> SentBatches:
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


#: infinity and -infinity of dates and timestamps, carried in Arrow as DuckDB does: date32
#: +-(2**31 - 1) days, timestamp +-(2**63 - 1) (no real date or timestamp of PostgreSQL or DuckDB
#: is that far out). A source passes them on only to a sink that keeps them.
INFINITY = "infinity"


INFINITY_DAYS = 2**31 - 1


INFINITY_TICKS = 2**63 - 1


@dataclass(frozen=True)
class SourceTable:
    """One table of a job over several tables (``source.tables``): its schema, its name, and its size
    (bytes; the largest tables start first)."""

    schema: str
    name: str
    bytes: int = 0

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@runtime_checkable
class SupportsPartitionCounts(Protocol):
    """A source that counts the rows of its partitions (``verify=count``); None: it cannot."""

    def count_rows(self, parts: list[Partition]) -> list[int] | None: ...


@runtime_checkable
class SupportsChangeCheck(Protocol):
    """A source that can tell whether partitions a stopped run finished still hold exactly the rows
    that run read, so that ``resume`` reads only the rest (or refuses). ``change_mark`` is taken in the
    job's session and kept in the run's manifest (what identifies the snapshot or files it read; None:
    nothing to keep); ``changed_since``, in a resumed run's session, names each partition of ``parts``
    that no longer holds the ``rows`` it held under ``mark`` (empty: every one unchanged; None: this
    source cannot tell for them, and the job compares counts instead)."""

    def change_mark(self) -> dict[str, Any] | None: ...

    def changed_since(self, mark: Mapping[str, Any], parts: Sequence[Partition], rows: Sequence[int]) -> list[str] | None: ...


class NativeStream(Protocol):
    """A partition in a source's wire format: ``read`` returns up to ``size`` bytes, b"" at the end,
    and raises the source's error there if the export failed (a sink must not commit then).
    A source whose export ``counts`` (``NativeExport.counts``) sets ``rows`` once ``read`` has
    returned b"": the rows it sent, as the source database counted them (None: it did not say)."""

    rows: int | None

    def read(self, size: int) -> bytes: ...


__all__ = [
    "SupportsChangeCheck",
    "ForeignKey",
    "SequenceDef",
    "TableDefinition",
    "columns_only",
    "SourceTable",
    "NativeExport",
    "SourceInfo",
    "DeferredSchema",
    "ArrowSchemaField",
    "column_names",
    "Source",
    "SourceBase",
    "SentBatches",
    "INFINITY",
    "INFINITY_DAYS",
    "INFINITY_TICKS",
    "SupportsPartitionCounts",
    "NativeStream",
]
