"""``strategy=auto``: files for a source made of files, the source's own partitions where it splits itself (ClickHouse,
ADBC, Flight), ctid for a heap table; else rangeid on a numeric distribute_key (or the primary key); else none. The
plan's note says which it chose and why."""

from __future__ import annotations

from conveyor.core import (
    PartitionPlan,
    PlanRequest,
    SupportsCtid,
    SupportsFileListing,
    SupportsKeys,
    SupportsNativePartitions,
    SupportsPrimaryKey,
    WholeSource,
)
from conveyor.errors import PlanningError
from conveyor.strategies.ctid import CtidStrategy
from conveyor.strategies.keyed import RangeIdStrategy, RangeIdStrategyConfig, _Base


class AutoStrategy(_Base):
    """files, or the source's own partitions, or ctid for a heap table; else rangeid on a numeric distribute_key; else none."""

    method = "auto"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        from conveyor.strategies.basic import FilesStrategy, FilesStrategyConfig, NativeStrategy, NativeStrategyConfig

        source = request.source
        if isinstance(source, SupportsFileListing):
            chosen = FilesStrategy(FilesStrategyConfig(), self.options).plan(request)
            return PartitionPlan(chosen.partitions, f"chose files: {request.info.label} is made of files; {chosen.note}")
        if isinstance(source, SupportsNativePartitions):
            try:
                chosen = NativeStrategy(NativeStrategyConfig(), self.options).plan(request)
                return PartitionPlan(chosen.partitions, f"chose native: {request.info.label} splits itself; {chosen.note}")
            except PlanningError:  # a driver without partitioned execution: the keyed methods below
                pass
        if isinstance(source, SupportsCtid):
            try:
                parts = CtidStrategy(self.config, self.options).plan(request).partitions
                return PartitionPlan(parts, f"chose ctid: {request.info.label} is a heap table ({len(parts)} page ranges)")
            except PlanningError as exc:
                why = exc.message
        else:
            why = "the source has no ctid"
        key, whose = self.config.distribute_key, ""
        if not key and isinstance(source, SupportsPrimaryKey) and isinstance(source, SupportsKeys):
            key, whose = source.primary_key(), " (the primary key)"
        if key and isinstance(source, SupportsKeys):
            stats = source.key_stats(key)
            if stats.kind in ("integer", "numeric", "temporal"):
                cfg = RangeIdStrategyConfig(distribute_key=key, partitions=self.config.partitions)
                chosen = RangeIdStrategy(cfg, self.options).plan(request)
                return PartitionPlan(chosen.partitions, f"chose rangeid on {key}{whose}: {why}; {chosen.note}")
            why += f"; {key} is not numeric"
        note = f"chose none: {why}" + ("" if key else "; no distribute_key set")
        return PartitionPlan([WholeSource(index=0, count=1, estimated_rows=request.info.estimated_rows)], note)
