"""The interfaces every plugin implements, and the plain data that crosses between them.

A job reads a :class:`Source`, a :class:`Strategy` splits it into :class:`Partition` s, a
:class:`Runtime` runs one task per partition and each task streams Arrow record batches
from the source into the :class:`Sink`. Everything here that crosses a process boundary
(partitions, plans, stats, plugin objects) is plain, picklable data: connections are opened
inside ``read`` and ``write`` and closed before they return.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up
    import pyarrow as pa

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
    degree: int = 1
    run_id: str = "run"

    @staticmethod
    def resolve_degree(degree: int, cpus: int | None = None) -> int:
        """``N > 0`` runs N tasks at once; ``N < 0`` uses CPUs / ``|N|`` (at least one)."""
        if degree > 0:
            return degree
        if degree == 0:
            raise ValueError("degree must not be 0")
        cpus = cpus or os.cpu_count() or 1
        return max(1, cpus // -degree)


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


# --- what a source says about itself --------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int | None = None
    rows: int | None = None


@dataclass(frozen=True)
class SourceInfo:
    """What planning knows of a source: its Arrow schema, size estimates, a human label."""

    schema: pa.Schema
    label: str
    estimated_rows: int | None = None
    estimated_bytes: int | None = None


@runtime_checkable
class SupportsFileListing(Protocol):
    """A source made of files; ``strategy=files`` needs it."""

    def list_files(self) -> list[FileEntry]: ...


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
    details: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class WriteStats:
    """What one partition's write did."""

    partition: str
    rows: int
    bytes: int
    seconds: float


class Sink(Protocol):
    """Writes Arrow record batches with a lifecycle: prepare, write per partition, finalize or abort."""

    def prepare(self, schema: pa.Schema) -> SinkPlan: ...

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[pa.RecordBatch]) -> WriteStats: ...

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None: ...

    def abort(self, plan: SinkPlan) -> None: ...


@dataclass(frozen=True)
class PlanRequest:
    """Everything a strategy may use; new settings become new fields with defaults."""

    source: Any
    info: SourceInfo
    degree: int


class Strategy(Protocol):
    """Splits a source into partitions. Never writes SQL: connectors render partitions."""

    def plan(self, request: PlanRequest) -> list[Partition]: ...
