"""Strategies for database sources: ctid, rangeid, ntile, random, datadriven and auto.

They are generic: each asks the source through a capability protocol (``SupportsCtid``,
``SupportsKeys``) and returns plain partitions (page ranges, key ranges, modulo buckets,
value sets); the source renders them in its own SQL dialect. Key ranges are contiguous and
open at both ends, so every row lands in exactly one partition even if the key's minimum or
maximum moved since planning; NULL keys go to the first partition.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
from dataclasses import dataclass
from typing import Any

from conveyor.core import (
    JobOptions,
    KeyRange,
    KeyStats,
    ModuloBucket,
    Partition,
    PartitionPlan,
    PlanRequest,
    SupportsKeys,
    ValueSet,
)
from conveyor.errors import ConfigError, PlanningError
from conveyor.log import note, say, warn


@dataclass
class KeyedStrategyConfig:
    #: the column that splits the rows (FastTransfer: --distributeKeyColumn)
    distribute_key: str | None = None
    #: how many partitions; 0 = degree (ctid: a range per stream, more per stream for a table over 1 GiB a stream)
    partitions: int = 0

    def __post_init__(self) -> None:
        if self.partitions < 0:
            raise ValueError("partitions must be >= 0")


@dataclass
class RangeIdStrategyConfig(KeyedStrategyConfig):
    #: rows: ranges hold about the same number of rows (sampled quantiles), so a skewed key
    #: does not leave one worker with most rows; width: equal-width ranges from min to max
    balance: str = "rows"
    #: true: one range per partition of a target partitioned by range (pg_partman's, for one), each
    #: written straight into its partition (append); the target's partition key is the distribute key
    align: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.balance not in ("rows", "width"):
            raise ValueError(f"balance: {self.balance!r} is not one of rows, width")


@dataclass
class DataDrivenStrategyConfig(KeyedStrategyConfig):
    #: a query whose first column lists the distribute_key values, one partition each
    #: (FastTransfer: --datadrivenquery); without it, one partition per distinct value
    datadriven_query: str | None = None


# A partition costs a task, connections and a transaction: derived counts keep each partition at
# least this large, and no plan has more partitions than MAX_PARTITIONS.
MIN_PARTITION_BYTES = 4 << 20
MIN_PARTITION_ROWS = 20_000
MAX_PARTITIONS = 10_000
#: the size bound never goes below this many partitions (a small table alone still spreads over the workers;
#: in a job over several tables the tables do)
MIN_BOUND = 16
#: datadriven keeps one partition per value up to this many values
DATADRIVEN_ONE_EACH = 64


def partition_count(configured: int, request: PlanRequest, factor: int, method: str) -> int:
    """How many partitions: ``configured`` (capped at MAX_PARTITIONS), else degree x ``factor``
    bounded by the source's size, so a huge degree does not make thousands of tiny partitions."""
    info = request.info
    least, why = request.min_partition_rows
    if configured:
        if configured > MAX_PARTITIONS:
            warn(f"strategy={method}: partitions={configured} capped to {MAX_PARTITIONS}")
        if least and info.estimated_rows and info.estimated_rows // configured < least:
            warn(f"strategy={method}: partitions={configured} of about {info.estimated_rows // configured:,} rows each: "
                 f"{why} wants at least {least:,} per partition (leave strategy.partitions unset to size them so)")
        return min(configured, MAX_PARTITIONS)
    wanted = max(1, request.degree * factor)
    limits = [MAX_PARTITIONS]
    if least and info.estimated_rows:
        fit = max(1, info.estimated_rows // least)
        if fit < wanted:
            say(f"strategy={method}: {fit} partition(s) instead of {wanted}: {why} wants at least {least:,} rows per partition")
            return fit
    if info.estimated_bytes:
        limits.append(max(1, info.estimated_bytes // MIN_PARTITION_BYTES))
    elif info.estimated_rows:
        limits.append(max(1, info.estimated_rows // MIN_PARTITION_ROWS))
    bound = max(MIN_BOUND if request.tables <= 1 else 1, min(limits))
    if wanted > bound:
        if request.degree * factor > 4 * (os.cpu_count() or 1):  # worth a line only when the degree is far off
            size = f"{info.estimated_bytes / 1e6:,.0f} MB" if info.estimated_bytes else f"{info.estimated_rows or 0:,} rows"
            warn(f"strategy={method}: {bound} partitions instead of {wanted} (degree={request.degree}): {size} of data "
                 f"make no more partitions of at least {MIN_PARTITION_BYTES >> 20} MB; set strategy.partitions to choose")
        return bound
    return wanted


def _keys(request: PlanRequest, method: str) -> SupportsKeys:
    if not isinstance(request.source, SupportsKeys):
        raise PlanningError(f"strategy={method} needs a database source; {request.info.label} is not one", hint="use strategy=none or files")
    return request.source


def _key_column(config: KeyedStrategyConfig, method: str, request: PlanRequest | None = None) -> str:
    """``strategy.distribute_key``; unset, the first column of the source table's primary key (rangeid, ntile, random:
    a key splits into ranges or buckets of about equal rows; datadriven, one partition per value, needs a column named)."""
    if config.distribute_key:
        return config.distribute_key
    key = request.info.primary_key if request is not None else ()
    if key and method != "datadriven":
        note(f"strategy={method}: strategy.distribute_key not set: the primary key's {'first ' if len(key) > 1 else ''}column "
             f"{key[0]!r} is used")
        return key[0]
    raise ConfigError(f"strategy.distribute_key: strategy={method} needs a distribute key"
                      + ("" if method == "datadriven" else f" ({request.info.label if request else 'the source'} has no primary key)"),
                      key="strategy.distribute_key", hint="set strategy.distribute_key=<column>")


def ranges_from_bounds(column: str, bounds: list[Any]) -> list[Partition]:
    """Contiguous ranges split at ``bounds`` (inner boundaries, ascending in the source's own
    order, which for text is its collation: not re-sorted here), open at both ends."""
    inner: list[Any] = []
    for b in bounds:
        if b is not None and (not inner or b != inner[-1]):
            inner.append(b)
    edges: list[Any] = [None, *inner, None]
    n = len(edges) - 1
    return [KeyRange(index=i, count=n, column=column, lower=edges[i], upper=edges[i + 1], nulls=(i == 0)) for i in range(n)]


def width_bounds(stats: KeyStats, buckets: int) -> list[Any]:
    """Inner boundaries of equal-width ranges between min and max."""
    lo, hi = stats.min, stats.max
    if lo is None or hi is None or buckets <= 1 or lo == hi:
        return []
    if isinstance(lo, dt.datetime) or isinstance(lo, dt.date):
        step = (hi - lo) / buckets
        return [lo + step * i for i in range(1, buckets)]
    if isinstance(lo, int) and isinstance(hi, int):
        step = max(1, (hi - lo + 1) // buckets)
        return [lo + step * i for i in range(1, buckets) if lo + step * i <= hi]
    if isinstance(lo, decimal.Decimal):
        step = (hi - lo) / buckets
        return [lo + step * i for i in range(1, buckets)]
    step = (float(hi) - float(lo)) / buckets
    return [float(lo) + step * i for i in range(1, buckets)]


class _Base:
    config_class: type = KeyedStrategyConfig
    method = ""

    def __init__(self, config: Any, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def _count(self, request: PlanRequest, default_factor: int = 1) -> int:
        """``partitions`` as configured, else degree x factor, bounded by the data's size."""
        return partition_count(self.config.partitions, request, default_factor, self.method)


class RangeIdStrategy(_Base):
    """Ranges of a numeric or date key, balanced by row count (default) or by width."""

    config_class = RangeIdStrategyConfig
    method = "rangeid"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        if self.config.align:
            return self._aligned(request)
        source, column = _keys(request, self.method), _key_column(self.config, self.method, request)
        stats = source.key_stats(column)
        if stats.kind not in ("integer", "numeric", "temporal"):
            raise PlanningError(
                f"strategy=rangeid: distribute_key {column!r} is not numeric or a date/time",
                hint="use strategy=ntile or datadriven for this column, or pick a numeric key",
            )
        n = self._count(request)
        if self.config.balance == "width":
            bounds = width_bounds(stats, n)
        else:
            bounds = source.key_quantiles(column, n, exact=False)
        parts = ranges_from_bounds(column, bounds)
        return PartitionPlan(parts, f"{len(parts)} ranges of {column} balanced by {self.config.balance} (min {stats.min!r}, max {stats.max!r})")


    def _aligned(self, request: PlanRequest) -> PartitionPlan:
        """The target's own range boundaries as the plan: each inner range is one target partition."""
        layout = request.target
        if layout is None:
            raise PlanningError("strategy.align: the target is not a table partitioned by range on one column "
                                "(or load_mode is not append, whose partitions are written straight into the target)",
                                hint="set strategy.align=false to plan ranges of the source's own")
        column = self.config.distribute_key or layout.column
        if column != layout.column:
            raise ConfigError(f"strategy.align: the target is partitioned on {layout.column!r}, not on distribute_key {column!r}",
                              key="strategy.distribute_key", hint=f"set strategy.distribute_key={layout.column} (or leave it unset)")
        _keys(request, self.method)
        parts = ranges_from_bounds(column, list(layout.bounds))
        return PartitionPlan(parts, f"aligned with the target's {layout.partitions} range partitions on {column}: "
                                    f"{len(parts)} ranges, each written straight into its partition (the open ends and NULL keys "
                                    "through the parent)")

class NtileStrategy(_Base):
    """NTILE(n) over the key: exact quantile boundaries, computed once, as key ranges."""

    method = "ntile"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source, column = _keys(request, self.method), _key_column(self.config, self.method, request)
        source.key_stats(column)  # checks the column exists
        parts = ranges_from_bounds(column, source.key_quantiles(column, self._count(request), exact=True))
        return PartitionPlan(parts, f"{len(parts)} ntile ranges of {column}")


class RandomStrategy(_Base):
    """Modulo of an integer key: abs(key % n) = i (FastTransfer's Random method)."""

    method = "random"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source, column = _keys(request, self.method), _key_column(self.config, self.method, request)
        stats = source.key_stats(column)
        if stats.kind != "integer":
            raise PlanningError(f"strategy=random: distribute_key {column!r} is not an integer column",
                                hint="use strategy=ntile or rangeid")
        n = self._count(request)
        return PartitionPlan([ModuloBucket(index=i, count=n, column=column, buckets=n, bucket=i) for i in range(n)],
                             f"{n} buckets of abs({column} % {n})")


class DataDrivenStrategy(_Base):
    """Partitions by the key's distinct values (or the values ``datadriven_query`` lists).

    Few values: one partition per value. Many: a bounded number of partitions (``partitions``,
    else 4 x degree within the size bound), balanced by row count. Without a query, each holds a
    contiguous run of the sorted values (a key range, so no value list grows with the data);
    with one, the listed values are packed, largest first, into value sets.
    """

    config_class = DataDrivenStrategyConfig
    method = "datadriven"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source, column = _keys(request, self.method), _key_column(self.config, self.method, request)
        n = self._count(request, 4)
        # few values: one partition each (FastTransfer's meaning), unless partitions says otherwise
        one_each = n if self.config.partitions else max(n, DATADRIVEN_ONE_EACH)
        if self.config.datadriven_query:
            listed = source.query_values(self.config.datadriven_query)
            note = f"{len(listed)} values of {column} from datadriven_query (rows with other values are not read)"
            groups = _pack([(v, 1) for v in dict.fromkeys(listed)], one_each)
            parts = [ValueSet(index=i, count=len(groups), column=column, values=tuple(g)) for i, g in enumerate(groups)]
            return PartitionPlan(parts or [ValueSet(index=0, count=1, column=column, values=())], note)
        counted = source.key_values(column, limit=one_each + 1)  # no more than that: many values are cut into runs where they are
        if len(counted) <= one_each:
            parts = [ValueSet(index=i, count=len(counted), column=column, values=(v,), estimated_rows=rows)
                     for i, (v, rows) in enumerate(counted)]
            return PartitionPlan(parts or [ValueSet(index=0, count=1, column=column, values=())], f"{len(counted)} distinct values of {column}")
        parts = ranges_from_bounds(column, source.key_runs(column, n))
        return PartitionPlan(parts, f"more than {one_each} distinct values of {column}: {len(parts)} ranges of them balanced by rows")


def _pack(values: list[tuple[Any, int]], n: int) -> list[list[Any]]:
    """Values into at most ``n`` groups of about equal rows (largest first, into the lightest group)."""
    import heapq

    if len(values) <= n:
        return [[v] for v, _ in values]
    heap = [(0, i, []) for i in range(n)]  # (rows, index, values)
    for value, rows in sorted(values, key=lambda vr: -vr[1]):
        total, i, group = heapq.heappop(heap)
        group.append(value)
        heapq.heappush(heap, (total + rows, i, group))
    return [g for _, _, g in sorted(heap, key=lambda t: t[1]) if g]


