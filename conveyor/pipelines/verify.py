"""Verification before the load is made visible: source and target must agree.

``verify=count`` (default): each partition's rows counted at the source (one scan, in the job's
snapshot, where the source can count) against the rows its task wrote, and the rows now in the
written table against the total. On the pass-through the source's count is its COPY's own (the
rows it sent, ``TaskResult.source_rows``), checked against the target's COPY count inside each
partition's transaction: no second scan of the source. Where a partition's read reports the rows its
server's scan returned (a PostgreSQL table on the Arrow path, :class:`conveyor.core.SentBatches`),
that count stands for the source's where it equals the rows written, and the partition is counted at
the source where it does not: after the tasks for a sink checked after them, inside the partition's
transaction for one that checks before its commits (:class:`conveyor.core.Expected`). ``verify=checksum``: in addition, an order-independent content
checksum computed by both databases (PostgreSQL on both sides: rows compared as PostgreSQL prints
them). It runs before ``finalize``, so a mismatch in truncate / create / replace leaves the old
target in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.core import Counting, SupportsPartitionCounts, SupportsTargetCount
from conveyor.errors import ConfigError, VerificationError

VERIFY_MODES = ("count", "checksum", "none")


@dataclass
class Verification:
    mode: str
    source_rows: int | None = None
    written_rows: int = 0
    target_rows: int | None = None
    #: a merge: the rows staged for it (counted against the source; the merge itself reads back what the
    #: target holds for every staged key before it commits)
    staged_rows: int | None = None
    source_checksum: str | None = None
    target_checksum: str | None = None
    mismatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatched

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "ok": self.ok, "source_rows": self.source_rows, "written_rows": self.written_rows,
                "target_rows": self.target_rows, "staged_rows": self.staged_rows, "source_checksum": self.source_checksum,
                "target_checksum": self.target_checksum, "mismatched": self.mismatched, "notes": self.notes}


def check_mode(mode: str) -> None:
    """Refuse, before anything connects, a verify mode there is not."""
    if mode not in VERIFY_MODES:
        raise ConfigError(f"verify: {mode!r} is not one of {', '.join(VERIFY_MODES)}", key="verify")


def check_checksums(mode: str, info: Any, target: Any, spec: Any = None) -> None:
    """Refuse, before anything moves, a checksum the two ends cannot compute: both databases compute it
    (PostgreSQL on both sides: the source's ``SourceInfo`` and the target's ``TargetInfo`` say so), or
    ``conveyor verify``'s comparison reads what a staged load wrote (create, replace, truncate through a
    stage) as a source of the target's engine, before it is made visible."""
    if mode != "checksum" or (info.checksums and target.checksums):
        return
    from conveyor import registry

    name = spec.names.get("sink", "") if spec is not None else ""
    if spec is None or spec.options.load_mode not in ("create", "replace", "truncate") or name not in registry.names("source"):
        raise ConfigError("verify=checksum: this pair computes no checksum alike, and only a staged load (create, replace, truncate) "
                          "of a target Conveyor can read back is compared row for row", key="verify",
                          hint="use verify=count (the default), or conveyor verify after the run")


def verify(mode: str, partitions: Sequence[Any], results: Sequence[Any], source: Any, sink: Any, plan: Any,
           across: Any = None) -> Verification:
    """The job's verification after its tasks, before the load is made visible: the source's counts
    as ``plan.counting`` took them (before the tasks, from the streams, from the reads, or now), the
    target's, and with ``mode=checksum`` the content (``across``: the job's spec where the two databases
    compute no checksum alike: compared row for row by conveyor verify's comparison instead)."""
    out = Verification(mode, written_rows=sum(r.rows for r in results))
    if mode == "none":
        out.notes.append("not verified (verify=none)")
        return out
    by_key = {r.partition: r.rows for r in results}
    counting = plan.counting
    if counting == Counting.BEFORE and plan.expected_rows is not None:
        counts: Sequence[int] | None = [plan.expected_rows[p.key] for p in partitions]
        out.notes.append("source counted before the load")
    elif counting == Counting.STREAM:
        counts, _ = _sent(partitions, results, source)
        out.notes.append("source rows as the source counted them while sending (its COPY's count), per partition in the job's snapshot")
    elif any(r.source_rows is not None for r in results):
        counts, again = _sent(partitions, results, source, written=by_key)
        out.notes.append("source rows as the source's server counted them while sending (the rows its scan of each partition "
                         "returned, in the job's snapshot)" + (f"; counted again where that was not the rows written: {again}"
                                                               if again else ""))
    else:
        counts = source.count_rows(partitions) if isinstance(source, SupportsPartitionCounts) else None
    if counts is None:
        out.notes.append("the source cannot count its partitions: the writers' counts stand in")
    else:
        out.source_rows = sum(counts)
        out.mismatched += [f"{p.key}: source {n:,} rows, written {by_key.get(p.key, 0):,}"
                           for p, n in zip(partitions, counts) if n != by_key.get(p.key, 0)]
    expected = out.source_rows if out.source_rows is not None else out.written_rows
    if counting in (Counting.BEFORE, Counting.STREAM, Counting.READ) and plan.checks_before_commit:
        # the target's COPY count met the source's in each partition's transaction: no table scan
        out.notes.append(getattr(sink, "commit_check", "the target's rows per partition (its COPY count) checked against the source's "
                                                       "before each commit"))
    elif plan.rows_before is None:  # an append whose target was not counted before it: its count tells nothing
        out.notes.append("the target's rows before the append were not counted: the rows each partition's COPY wrote stand in")
    elif not isinstance(sink, SupportsTargetCount):
        out.notes.append("the sink cannot count what it holds")
    elif plan.load_mode == "merge":
        out.staged_rows = sink.target_rows(plan)
        if out.staged_rows != expected:
            out.mismatched.append(f"staged for the merge: {out.staged_rows:,} rows, source {expected:,}")
        out.notes.append(getattr(sink, "merge_check", "the merge reads back, before it commits, that the target holds every staged key"
                                 + (" with the staged values" if mode == "checksum" else "")))
    else:
        out.target_rows = sink.target_rows(plan) - plan.rows_before
        if out.target_rows != expected:
            out.mismatched.append(f"target: {out.target_rows:,} new rows, source {expected:,}")
    if mode == "checksum" and across is not None:
        _compared(out, across, source, partitions, plan)
    elif mode == "checksum":
        out.source_checksum = _combine(source.checksums(partitions, plan.source_columns))
        out.target_checksum = sink.checksum(plan)
        if out.source_checksum != out.target_checksum:
            out.mismatched.append(f"checksum: source {out.source_checksum}, target {out.target_checksum}")
    return out


def _compared(out: Verification, spec: Any, source: Any, partitions: Sequence[Any], plan: Any) -> None:
    """verify=checksum across engines: conveyor verify's comparison of the job's source (its snapshot, its
    partitions) with what the staged load wrote, read back as a source of the target's engine."""
    from conveyor.pipelines.compare import compare

    result = compare(spec, opened=source, partitions=list(partitions), written=plan.write_target, max_keys=5)
    out.source_checksum = f"{result.source.rows}:{sum(result.source.sums) % 2**64}"
    out.target_checksum = f"{result.target.rows}:{sum(result.target.sums) % 2**64}"
    out.notes.append("checksum: each row hashed over canonical Arrow values on both sides by conveyor verify's comparison"
                     + (f", by key ({', '.join(result.key)})" if result.key else ""))
    if not result.equal:
        out.mismatched.append(f"checksum: source {out.source_checksum}, target {out.target_checksum}"
                              + (f"; {', '.join(f'key {k[0] if len(k) == 1 else k}: {how}' for k, how in result.keys)}" if result.keys else "")
                              + (f"; {', '.join(result.unmatched)}" if result.unmatched else ""))


def _sent(partitions: Sequence[Any], results: Sequence[Any], source: Any,
          written: Mapping[str, int] | None = None) -> tuple[list[int] | None, str]:
    """Each partition's rows as its source counted them while sending (``TaskResult.source_rows``); a
    partition that reports none (its rows were committed by an earlier attempt, or its task stopped
    after the commit) is counted at the source instead. With ``written`` (the count is the server's
    scan count, a witness rather than the stream's own count), so is a partition whose count is not
    the rows written: that count decides, so a scan count that is not the partition's rows (a plan
    the source did not foresee) costs a count, never a false verdict. Returns the counts (None: the
    source cannot count) and which partitions were counted at the source."""
    sent = {r.partition: r.source_rows for r in results if r.source_rows is not None}
    again = [p for p in partitions if p.key not in sent or (written is not None and sent[p.key] != written.get(p.key, 0))]
    if again:
        counted = source.count_rows(again) if isinstance(source, SupportsPartitionCounts) else None
        if counted is None:
            return None, ""
        sent.update({p.key: n for p, n in zip(again, counted)})
    return [sent[p.key] for p in partitions], ", ".join(p.key for p in again)


def _combine(parts: Sequence[tuple[int, int]]) -> str:
    return f"{sum(n for n, _ in parts)}:{sum(h for _, h in parts)}"


def raise_if_failed(result: Verification, target: str) -> None:
    if not result.ok:
        raise VerificationError(
            f"verification failed for {target}: " + "; ".join(result.mismatched[:5])
            + (f" (+{len(result.mismatched) - 5} more)" if len(result.mismatched) > 5 else ""),
            hint="the target was not changed (staged loads) or holds only whole partitions (append); see the report",
        )
