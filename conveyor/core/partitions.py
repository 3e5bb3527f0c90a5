"""Partitions: plain descriptions of which rows a task moves. Strategies build them; source
connectors render them in their own dialect."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up

    pass


@dataclass(frozen=True)
class Partition:
    """One unit of work: a plain description of which rows of the source a task moves.

    Strategies build them, source connectors render them in their own dialect. ``index`` is
    stable for a given plan, so ``key`` identifies a partition across retries and resumes.
    """

    index: int
    count: int
    estimated_rows: int | None = field(default=None, compare=False)
    #: in a job over several tables (``source.tables``), the source table it reads (schema.table)
    table: str = ""

    kind: ClassVar[str] = "partition"

    @property
    def key(self) -> str:
        own = f"{self.kind}-{self.index:05d}"
        return f"{self.table}/{own}" if self.table else own

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


__all__ = [
    "Partition",
    "WholeSource",
    "FileSet",
    "RowGroupSet",
    "NativePartition",
    "PageRange",
    "KeyRange",
    "ModuloBucket",
    "ValueSet",
]
