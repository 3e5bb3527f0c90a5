"""What strategies ask of a source to split it: its files (``strategy=files``), its heap pages
(``ctid``), the partitions it knows itself (``native``), and its keys' statistics, quantiles and
values (``rangeid``, ``ntile``, ``random``, ``datadriven``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from conveyor.core.partitions import NativePartition


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int | None = None
    rows: int | None = None
    #: rows in each row group (Parquet), when known
    row_groups: tuple[int, ...] | None = None


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
class SupportsCtidSample(Protocol):
    """A heap table that can also say where its live rows are: its pages (as ``ctid_pages``) and,
    where it has at least ``min_pages``, ``(page, live rows)`` of about ``target`` of them spread
    evenly over the table, by page, empty pages included (``[]`` where it takes none, e.g. a
    partitioned table, whose leaves' pages share one page range). The ctid strategy splits its
    ranges by these rows where its equal page ranges would hold them unevenly (a table whose first
    pages a DELETE and a VACUUM emptied)."""

    def ctid_pages_sampled(self, target: int, min_pages: int) -> tuple[int, list[tuple[int, int]]]: ...


@runtime_checkable
class SupportsNativePartitions(Protocol):
    """A source that splits itself (ADBC execute_partitions, Flight endpoints): ``strategy=native``."""

    def native_partitions(self) -> list[NativePartition]: ...


@runtime_checkable
class SupportsKeys(Protocol):
    """A source that answers questions about a column (rangeid, ntile, random, datadriven)."""

    def key_stats(self, column: str) -> KeyStats: ...

    def key_quantiles(self, column: str, buckets: int, exact: bool) -> list[Any]: ...

    def key_values(self, column: str, limit: int | None = None) -> list[tuple[Any, int]]:
        """Each distinct value of ``column`` (NULL first) with its row count; the first ``limit`` of them."""
        ...

    def key_runs(self, column: str, runs: int) -> list[Any]:
        """The sorted distinct values cut into ``runs`` contiguous runs of about equal rows: the value each
        run after the first starts at (computed where the data is: the driver never holds every value)."""
        ...

    def query_values(self, query: str) -> list[Any]: ...


@runtime_checkable
class SupportsPrimaryKey(Protocol):
    """A source that names its table's one-column primary key (``auto`` ranges on it when no key is set)."""

    def primary_key(self) -> str | None: ...


__all__ = [
    "FileEntry",
    "SupportsFileListing",
    "KeyStats",
    "SupportsCtid",
    "SupportsCtidSample",
    "SupportsNativePartitions",
    "SupportsKeys",
    "SupportsPrimaryKey",
]
