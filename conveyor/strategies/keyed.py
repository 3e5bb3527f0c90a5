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
    PageRange,
    Partition,
    PartitionPlan,
    PlanRequest,
    SupportsCtid,
    SupportsCtidSample,
    SupportsKeys,
    SupportsPrimaryKey,
    ValueSet,
    WholeSource,
)
from conveyor.errors import ConfigError, PlanningError
from conveyor.log import say, warn


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
#: the size bound never goes below this many partitions (small tables still spread over workers)
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
    bound = max(MIN_BOUND, min(limits))
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


def _key_column(config: KeyedStrategyConfig, method: str) -> str:
    if not config.distribute_key:
        raise ConfigError(f"strategy.distribute_key: strategy={method} needs a distribute key", key="strategy.distribute_key",
                          hint="set strategy.distribute_key=<column>")
    return config.distribute_key


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


#: a stream's share of a table, in bytes, for each of its ctid ranges (at most CTID_MAX_RANGES_PER_STREAM)
CTID_RANGE_BYTES = 1 << 30
CTID_MAX_RANGES_PER_STREAM = 4


def ctid_ranges_per_stream(request: PlanRequest) -> int:
    """How many page ranges each stream reads when ``strategy.partitions`` is not set: one while a
    stream's share of the table is under ``CTID_RANGE_BYTES``, one more per further GiB, at most 4.

    Each range costs its stream a start (a connection in the job's snapshot, the first batch) and an
    end (the last batch written, a Parquet sink's last row group) that nothing overlaps, and the
    streams' same-sized ranges start and end together. With 4 ranges per stream whatever the size,
    TPC-H SF1 at degree 2 took 20% longer to Parquet than with one (lineitem, 3 alternating runs:
    13.5-16.3 s against 11.5-12.5 s; orders 4.3-4.9 against 3.1-4.4 s) and 5-10% longer into
    PostgreSQL (lineitem: 18.1-19.6 against 17.4-17.6 s). A larger table gets more ranges per stream,
    which even out the streams' rows where pages hold unequal rows (a deleted stretch), at a smaller
    share of its time."""
    if request.degree <= 1:
        return 1
    share = (request.info.estimated_bytes or 0) // request.degree
    return max(1, min(CTID_MAX_RANGES_PER_STREAM, share // CTID_RANGE_BYTES))


#: a plan of several ctid ranges over a table of at least CTID_SAMPLE_MIN_PAGES pages (32 MiB) counts
#: the live rows of about CTID_SAMPLE_PAGES of them (8 per range where there are more ranges), every
#: k-th page, and splits by rows where the equal page ranges' fullest would hold more than CTID_UNEVEN
#: times an equal share. The sample's query: 1-2 ms here on TPC-H lineitem SF1 (107k pages, JIT off)
CTID_SAMPLE_PAGES = 256
CTID_SAMPLE_MIN_PAGES = 4096
CTID_UNEVEN = 1.10


def rows_in_ranges(sample: list[tuple[int, int]], starts: list[int]) -> list[int]:
    """The sampled rows in each range that starts at ``starts[i]`` (the last open-ended)."""
    out = [0] * len(starts)
    i = 0
    for page, rows in sample:  # by page
        while i + 1 < len(starts) and page >= starts[i + 1]:
            i += 1
        out[i] += rows
    return out


def row_balanced_starts(sample: list[tuple[int, int]], n: int) -> list[int]:
    """Starts of ``n`` page ranges that each hold about as many of the sample's rows: each range
    after the first starts at the sampled page where the rows before it reach its share (fewer
    ranges where several shares end on one page)."""
    total = sum(rows for _, rows in sample)
    starts, seen, k = [0], 0, 1
    for page, rows in sample:
        while k < n and seen + rows > total * k / n:
            if page > starts[-1]:
                starts.append(page)
            k += 1
        seen += rows
    return starts


class CtidStrategy(_Base):
    """Heap page ranges (PostgreSQL ctid): no key needed, every page read once. Equal page ranges,
    unless a sample of the pages finds their live rows unevenly spread: then ranges of about equal
    rows (a table whose first pages a DELETE and VACUUM emptied gave its last stream every row)."""

    method = "ctid"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        if not isinstance(request.source, SupportsCtid):
            raise PlanningError(f"strategy=ctid needs a PostgreSQL table; {request.info.label} is not one", hint="use strategy=none")
        wanted = self._count(request, ctid_ranges_per_stream(request))
        sample: list[tuple[int, int]] = []
        if wanted > 1 and isinstance(request.source, SupportsCtidSample):  # one connection for both
            pages, sample = request.source.ctid_pages_sampled(max(CTID_SAMPLE_PAGES, 8 * wanted), CTID_SAMPLE_MIN_PAGES)
        else:
            pages = request.source.ctid_pages()
        n = max(1, min(wanted, pages or 1))
        step = -(-max(pages, 1) // n)
        starts = list(range(0, max(pages, 1), step))
        note = f"{pages} pages in {len(starts)} ranges; the last is open-ended"
        if len(starts) > 1 and sample:
            total = sum(rows for _, rows in sample)
            if total and len(sample) >= 4 * len(starts):
                uneven = max(rows_in_ranges(sample, starts)) * len(starts) / total
                if uneven > CTID_UNEVEN:
                    balanced = row_balanced_starts(sample, len(starts))
                    note = (f"{pages} pages in {len(balanced)} ranges of about equal rows (a sample of {len(sample)} pages: equal "
                            f"page ranges would give the fullest {uneven:.2f}x its share); the last is open-ended")
                    starts = balanced
        parts: list[Partition] = []
        for i, start in enumerate(starts):
            stop = None if i == len(starts) - 1 else starts[i + 1]
            parts.append(PageRange(index=i, count=len(starts), start=start, stop=stop))
        return PartitionPlan(parts, note)


class RangeIdStrategy(_Base):
    """Ranges of a numeric or date key, balanced by row count (default) or by width."""

    config_class = RangeIdStrategyConfig
    method = "rangeid"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        if self.config.align:
            return self._aligned(request)
        source, column = _keys(request, self.method), _key_column(self.config, self.method)
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
        source, column = _keys(request, self.method), _key_column(self.config, self.method)
        source.key_stats(column)  # checks the column exists
        parts = ranges_from_bounds(column, source.key_quantiles(column, self._count(request), exact=True))
        return PartitionPlan(parts, f"{len(parts)} ntile ranges of {column}")


class RandomStrategy(_Base):
    """Modulo of an integer key: abs(key % n) = i (FastTransfer's Random method)."""

    method = "random"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source, column = _keys(request, self.method), _key_column(self.config, self.method)
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
        source, column = _keys(request, self.method), _key_column(self.config, self.method)
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


class AutoStrategy(_Base):
    """ctid for a heap table; else rangeid on a numeric distribute_key; else none."""

    method = "auto"

    def plan(self, request: PlanRequest) -> PartitionPlan:
        source = request.source
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
