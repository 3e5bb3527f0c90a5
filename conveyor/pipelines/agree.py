"""What the two ends of a load agree on, decided once, from what each says of itself.

The source's :class:`~conveyor.core.SourceInfo` (its native format, whether its reads count), the
target's :class:`~conveyor.core.TargetInfo` (the format it takes as it is, whether its commits are
final, the path) and the job's options make one :class:`~conveyor.core.Agreement`: the native
pass-through or Arrow batches, one transaction into the target or not, how each partition's source
rows are counted, and the path ``conveyor plan`` prints. ``prepare`` is handed it, and the run takes
that path: plan and run cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.core import Agreement, Counting, CursorWindow, JobOptions, Partition, SourceInfo, SupportsPartitionCounts, TargetInfo
from conveyor.errors import ConfigError


def agree(info: SourceInfo, target: TargetInfo, options: JobOptions, partitions: Sequence[Partition], source: Any,
          window: CursorWindow | None = None) -> Agreement:
    """The load's agreement for a plan of ``partitions`` (the target as a one-partition plan loads it, where
    that differs)."""
    chosen = target.for_partitions(len(partitions))
    if chosen.refused:
        raise ConfigError(chosen.refused.format(partitions=len(partitions)), key=chosen.refused_key or None, hint=chosen.refused_hint or None)
    native = chosen.native if info.native is not None and chosen.native == info.native.format else None
    counting = _counting(info, chosen, options, native, partitions, source, window)
    return Agreement(native=native, in_place=chosen.in_place, checks_before_commit=chosen.checks_before_commit,
                     counting=counting, path=chosen.path)


def _counting(info: SourceInfo, target: TargetInfo, options: JobOptions, native: str | None, partitions: Sequence[Partition],
              source: Any, window: CursorWindow | None) -> Counting:
    """How each partition's source rows are counted. Where the target checks each partition before its
    commit, the count it checks against comes from the native stream (the pass-through's COPY count), or
    from each read (the rows its server's scan returned: ``SourceInfo.reads_count``, not within an
    incremental window), or is taken at the source before the tasks (and serves the verification after
    them, not counted twice); elsewhere the source is counted after the tasks."""
    if options.verify == "none":
        return Counting.NONE
    if native is not None and info.native is not None and info.native.counts:
        return Counting.STREAM
    if not target.checks_before_commit or not isinstance(source, SupportsPartitionCounts):
        return Counting.AFTER
    if native is None and window is None and partitions and all(p.kind in info.reads_count for p in partitions):
        return Counting.READ
    return Counting.BEFORE


__all__ = ["agree"]
