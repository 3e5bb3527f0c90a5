"""The strategies every source can serve, or that need only a file listing."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.core import (
    FileEntry,
    FileSet,
    JobOptions,
    PartitionPlan,
    PlanRequest,
    RowGroupSet,
    SupportsFileListing,
    SupportsNativePartitions,
    WholeSource,
)
from conveyor.errors import PlanningError


@dataclass
class NoneStrategyConfig:
    pass


class NoneStrategy:
    """One partition: the whole source, read by one task."""

    config_class = NoneStrategyConfig

    def __init__(self, config: NoneStrategyConfig, options: JobOptions) -> None:
        self.config = config

    def plan(self, request: PlanRequest) -> PartitionPlan:
        return PartitionPlan([WholeSource(index=0, count=1, estimated_rows=request.info.estimated_rows)], "the whole source in one partition")


@dataclass
class FilesStrategyConfig:
    #: files per partition; 0 spreads the files evenly over ``degree`` partitions
    files_per_partition: int = 1
    #: > 0: split Parquet files into partitions of this many row groups (one large file over
    #: several tasks); 0: whole files
    row_groups_per_partition: int = 0

    def __post_init__(self) -> None:
        if self.files_per_partition < 0:
            raise ValueError("files_per_partition must be >= 0")
        if self.row_groups_per_partition < 0:
            raise ValueError("row_groups_per_partition must be >= 0")


class FilesStrategy:
    """One partition per input file (or per group of ``files_per_partition`` files)."""

    config_class = FilesStrategyConfig

    def __init__(self, config: FilesStrategyConfig, options: JobOptions) -> None:
        self.config = config

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source = request.source
        if not isinstance(source, SupportsFileListing):
            raise PlanningError(
                f"strategy=files needs a source made of files; {request.info.label} is not",
                hint="use strategy=none",
            )
        entries = source.list_files()
        if self.config.row_groups_per_partition:
            return self._row_groups(entries, request)
        per = self.config.files_per_partition or max(1, -(-len(entries) // request.degree))
        groups = [entries[i : i + per] for i in range(0, len(entries), per)]
        parts = [FileSet(index=i, count=len(groups), paths=tuple(e.path for e in g), estimated_rows=_rows(g))
                 for i, g in enumerate(groups)]
        return PartitionPlan(parts, f"{len(entries)} files in {len(parts)} partitions of up to {per}")


    def _row_groups(self, entries: list[FileEntry], request: PlanRequest) -> PartitionPlan:
        if any(e.row_groups is None for e in entries):
            raise PlanningError(f"row_groups_per_partition needs Parquet files; {request.info.label} has none",
                                hint="set strategy.row_groups_per_partition=0")
        per = self.config.row_groups_per_partition
        spans = [(e.path, tuple(range(i, min(i + per, len(e.row_groups or ())))), e.row_groups or ())
                 for e in entries for i in range(0, max(len(e.row_groups or ()), 1), per)]
        parts = [RowGroupSet(index=i, count=len(spans), path=path, row_groups=groups, estimated_rows=sum(sizes[g] for g in groups))
                 for i, (path, groups, sizes) in enumerate(spans)]
        return PartitionPlan(parts, f"{len(entries)} files in {len(parts)} spans of up to {per} row groups")


def _rows(entries: list[FileEntry]) -> int | None:
    counts = [e.rows for e in entries]
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


@dataclass
class NativeStrategyConfig:
    pass


class NativeStrategy:
    """The source's own partitions: ADBC partitioned execution, or a Flight service's endpoints."""

    config_class = NativeStrategyConfig

    def __init__(self, config: NativeStrategyConfig, options: JobOptions) -> None:
        self.config = config

    def plan(self, request: PlanRequest) -> PartitionPlan:
        if not isinstance(request.source, SupportsNativePartitions):
            raise PlanningError(f"strategy=native needs a source that splits itself; {request.info.label} does not",
                                hint="use strategy=none, or a keyed strategy")
        parts = list(request.source.native_partitions())
        return PartitionPlan(parts, f"{len(parts)} partitions handed out by the source")
