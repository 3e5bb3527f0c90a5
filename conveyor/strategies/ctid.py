"""``strategy=ctid``: a heap table split into page ranges, each read by a TID range scan; ranges sized
by bytes and balanced by a sample of the live rows per page, so deleted or updated space does not make
one range much fuller than another."""

from __future__ import annotations

from conveyor.core import (
    PageRange,
    Partition,
    PartitionPlan,
    PlanRequest,
    SupportsCtid,
    SupportsCtidSample,
)
from conveyor.errors import PlanningError
from conveyor.strategies.keyed import _Base

#: a stream's share of a table, in bytes, for each of its ctid ranges (at most CTID_MAX_RANGES_PER_STREAM)
CTID_RANGE_BYTES = 1 << 30


CTID_MAX_RANGES_PER_STREAM = 4


def ctid_ranges_per_stream(request: PlanRequest) -> int:
    """How many page ranges each stream reads when ``strategy.partitions`` is not set: one while a
    stream's share of the table is under ``CTID_RANGE_BYTES``, one more per further GiB, at most 4.

    Each range costs its stream a start (a connection in the job's snapshot, the first batch) and an
    end (the last batch written, a Parquet sink's last row group) that nothing overlaps, and the
    streams' same-sized ranges start and end together: 4 ranges per stream whatever the size made
    TPC-H SF1 slower than one (benchmarks/results/design-measurements.md, "ctid ranges per stream"). A larger table gets more ranges per stream,
    which even out the streams' rows where pages hold unequal rows (a deleted stretch), at a smaller
    share of its time."""
    if request.degree <= 1:
        return 1
    share = (request.info.estimated_bytes or 0) // request.degree
    return max(1, min(CTID_MAX_RANGES_PER_STREAM, share // CTID_RANGE_BYTES))


#: a plan of several ctid ranges over a table of at least CTID_SAMPLE_MIN_PAGES pages (32 MiB) counts
#: the live rows of about CTID_SAMPLE_PAGES of them (8 per range where there are more ranges), every
#: k-th page, and splits by rows where the equal page ranges' fullest would hold more than CTID_UNEVEN
#: times an equal share (the sample's cost: benchmarks/results/design-measurements.md, "ctid ranges per stream")
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
