"""How a partition's rows are counted, and the checks a sink makes with the counts before it commits.

The job decides once how the source's side is counted (:class:`Counting`, on the sink's plan) and
the task hands the sink, for the partition it writes, what the source says it holds
(:class:`Expected`, ``SinkPlan.expecting``). Every sink then checks, inside the partition's
transaction, the rows the target says it stored against the rows it was sent (:func:`check_stored`)
and against the source's count (:func:`check_partition_rows`); a sink never needs to know which way
the source was counted.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any


class Counting(str, enum.Enum):
    """Where a partition's source count comes from."""

    #: not counted (verify=none)
    NONE = "none"
    #: counted at the source, in the job's snapshot, before the tasks (checked in each partition's transaction)
    BEFORE = "before"
    #: the source's native stream counts what it sends (the pass-through: its COPY's own count)
    STREAM = "stream"
    #: each read reports the rows its server's scan returned; a partition whose count is not the rows
    #: written is counted at the source, in the partition's transaction, before its commit
    READ = "read"
    #: counted at the source after the tasks (a sink whose commits are not final until it finalizes)
    AFTER = "after"

    def describe(self) -> str:
        return {
            Counting.NONE: "not counted (verify=none)",
            Counting.BEFORE: "the source counted in the job's snapshot before the load, each partition checked before its commit",
            Counting.STREAM: "the rows the source's COPY said it sent, each partition checked before its commit",
            Counting.READ: ("the rows the source's server said each partition's scan returned (counted again where that is not "
                            "the rows written), each partition checked before its commit"),
            Counting.AFTER: "the source counted in the job's snapshot after the load, before it is made visible",
        }[self]


class Expected:
    """What the source says one partition holds, resolved once its rows are written (``value``):
    a count taken before, a native stream's own count, or a read's scan count (where that is not the
    rows written, the partition is counted at the source instead, so a plan the source did not foresee
    costs a count, never a false verdict). ``said`` is the count that decided, once resolved."""

    def __init__(self, counted: int | None = None, stream: Any = None, reading: Any = None,
                 recount: Callable[[], int | None] | None = None) -> None:
        self.counted, self.stream, self.reading, self.recount = counted, stream, reading, recount
        self.said: int | None = None

    @classmethod
    def before(cls, rows: int) -> Expected:
        return cls(counted=rows)

    @classmethod
    def from_stream(cls, stream: Any) -> Expected:
        return cls(stream=stream)

    @classmethod
    def from_read(cls, reading: Any, recount: Callable[[], int | None]) -> Expected:
        return cls(reading=reading, recount=recount)

    def value(self, stored: int, key: str = "") -> int | None:
        """The source's count of the partition whose target stored ``stored`` rows (None: not known)."""
        if self.counted is not None:
            self.said = self.counted
        elif self.stream is not None:
            self.said = self._streamed(key)
        elif self.reading is not None:
            sent = getattr(self.reading, "sent", None)
            self.said = sent if sent is not None and sent == stored else (self.recount() if self.recount is not None else None)
        return self.said

    def _streamed(self, key: str) -> int:
        rows = getattr(self.stream, "rows", None)
        if rows is None:
            from conveyor.errors import TransferError

            raise TransferError(f"partition {key}: the source's COPY did not say how many rows it sent, so they cannot be "
                                "checked before the commit: rolled back", partition=key,
                                hint="use verify=none to load without the check, or sink.copy_path=arrow")
        return int(rows)


def check_partition_rows(target: str, partition: str, expected: Expected | None, rows: int) -> None:
    """A sink whose partition commits are final calls this inside the partition's transaction, before
    COMMIT: the rows the target stored must be the rows the source says the partition holds (None: not
    checked here), else nothing of the partition stays."""
    said = expected.value(rows, partition) if expected is not None else None
    if said is not None and rows != said:
        from conveyor.errors import VerificationError

        raise VerificationError(f"verification failed for {target}: partition {partition}: source {said:,} rows, "
                                f"written {rows:,}: rolled back", hint="the target was not changed by this partition; see the report")


def check_stored(target: str, partition: str, sent: int | None, stored: int | None) -> None:
    """Every sink calls this inside a partition's transaction, before COMMIT: the rows the target says
    it stored (its COPY or INSERT count, or a count in the transaction) must be the rows it was sent.
    A target can drop rows without an error (a BEFORE INSERT trigger returning NULL, a rule, a conflict
    clause): then nothing of the partition stays. None: not known (not checked)."""
    if sent is None or stored is None or stored == sent:
        return
    from conveyor.errors import VerificationError

    raise VerificationError(
        f"verification failed for {target}: partition {partition}: the target stored {stored:,} of the {sent:,} rows sent to it "
        f"(a trigger, rule or conflict clause on it dropped {sent - stored:,} without an error): rolled back",
        hint="the target was not changed by this partition; see the target's triggers and rules "
             "(or load into a table without them); verify=none loads without this check")


__all__ = ["Counting", "Expected", "check_partition_rows", "check_stored"]
