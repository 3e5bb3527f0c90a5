"""Sync jobs (``incremental.method=replication``): the two contracts a sync is made of.

A source that is a **change feed** (:class:`ChangeFeed`) opens a :class:`FeedSession` for a job: it
knows the job's tables as they are now, keeps a position that the changes after it are read from,
makes the first position together with a snapshot that the first load reads, and for each later run
fixes an end position with a snapshot of it (:class:`FeedRun`) and says, per table, which keys the
changes in between touched, as a source of those keys' rows in that snapshot.

A sink that is a **change applier** (:class:`ChangeApplier`) keeps, beside each target, the position
its rows are at (:class:`SyncState`), has a stage for a run's changed rows (loaded by the sink's own
write, as any load), and applies staged changes (:class:`Change`) so that the target's effect equals
the source's: an update arrives as an update, a delete as a delete, the position recorded in the
same transaction (or commit), a trigger or foreign key action that touched other rows refused.

``conveyor.pipelines.sync`` runs a sync through these contracts alone; ``conveyor.testing.suites``'s
``ChangeApplySuite`` is what a sink passes to be a sync target.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SyncState:
    """What a target holds of a sync: the source position its rows are at, and the source's columns then."""

    position: int
    signature: str
    source: str


@dataclass(frozen=True)
class SyncRecord:
    """A position to record for a target: the job's slot, the source table, where its rows are, its columns then."""

    slot: str
    source: str
    position: int
    signature: str


@dataclass(frozen=True)
class Applied:
    """What one apply did to its target, as the target holds it after (read in its transaction)."""

    keys: int
    #: rows written (the keys' rows that exist at the run's position)
    written: int
    #: target rows removed for good (their key's row is gone at the source)
    deleted: int
    #: the target was emptied first (the source's changes held a TRUNCATE)
    full: bool = False
    #: what else the apply did, as the target says it (ClickHouse: the partitions it rewrote)
    detail: str = ""

    def describe(self) -> str:
        more = f" ({self.detail})" if self.detail else ""
        if self.full:
            return f"loaded again (the source was truncated): {self.written:,} rows{more}"
        return f"{self.keys:,} changed keys: {self.written:,} rows written, {self.deleted:,} deleted{more}"


@dataclass
class Change:
    """One target table's part of a run: its stage, its keys, whether it is loaded again whole (a TRUNCATE at the
    source), the state to record, the position its state must hold when the apply begins (None: not checked),
    and whether another synced table's foreign key refers to it (its deletes then wait for every table's inserts)."""

    sink: Any
    #: None: no key of the table changed (its position is recorded, and that nothing else changed its rows checked)
    stage: str | None
    keys: tuple[str, ...]
    full: bool
    record: SyncRecord | None
    expect: int | None = None
    referenced: bool = False


@dataclass(frozen=True)
class FeedTable:
    """A source table as a sync sees it."""

    schema: str
    name: str
    #: its primary key's columns, in key order
    keys: tuple[str, ...]
    #: its columns, their types and its key as one line: a change of it stops the sync
    signature: str

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class TableChanges:
    """One table's changes in a run: loaded again whole (a TRUNCATE), or the keys touched (0: none)."""

    full: bool
    keys: int


class FeedRun(Protocol):
    """One run of a sync on the source: its end position ``upto`` and the snapshot of it, the changes decoded."""

    upto: int
    #: changes decoded (rows inserted, updated, deleted) between the targets' position and ``upto``
    changes: int

    def changed(self, table: FeedTable) -> TableChanges: ...

    def rows(self, table: FeedTable, parts: int, options: Any) -> Any:
        """A source of the rows the changed keys of ``table`` (a TRUNCATE: every row) hold in the run's snapshot, each with
        ``_conveyor_present`` (false where the key's row is gone), read by the usual readers; a source that splits itself
        (``SupportsNativePartitions``) into about ``parts`` plain partitions, which the job stages through the one job
        loop on its runtime (``strategy=native``)."""
        ...

    def advance(self) -> None:
        """Move the job's position on the source to ``upto`` (after every target committed)."""
        ...

    def lag(self) -> int:
        """How far the source has moved past ``upto`` (bytes of its log)."""
        ...


class FeedSession(Protocol):
    """A sync job's hold on its source for one process: its tables, its position, its runs. One session of a job at a
    time: a second is refused by name when it opens."""

    slot: str
    tables: Sequence[FeedTable]
    #: the source keeps the job's position (a PostgreSQL slot); false: it keeps none (a MySQL binlog), the targets'
    #: states are the position, and :meth:`position` is the oldest one the source can still read from
    held_on_source: bool
    #: the first load reads live rows, not a snapshot of the first position (a source that shares no snapshot between
    #: connections): a run follows it at once (it reads again the keys changed while the load read), and a whole table
    #: read live is not counted again at the source after
    live: bool

    def position(self) -> int | None:
        """The position the source keeps for the job (None: none yet, or it was lost)."""
        ...

    def retained(self) -> int:
        """What the job's position holds back on the source (bytes of its log)."""
        ...

    def first(self) -> AbstractContextManager[tuple[int, Any]]:
        """Begin the job (what a former first run left is dropped): yields (its position, a snapshot the first load reads
        through ``snapshot_source``); every change after the position is read by the runs after."""
        ...

    def snapshot_source(self, snapshot: Any) -> Any:
        """The job's source reading ``snapshot`` (the first load's)."""
        ...

    def check(self, states: Sequence[SyncState]) -> None:
        """Each run's preconditions (each table still the one the sync began with, as each state recorded it), refused by name."""
        ...

    def run(self, since: int) -> AbstractContextManager[FeedRun]:
        """A run of the changes after ``since`` (the targets' position) up to a position fixed now."""
        ...

    def order(self) -> tuple[list[int], set[int]]:
        """The tables' indexes, each after those its foreign keys refer to, and those another refers to."""
        ...

    def text(self, position: int) -> str:
        """A position as the source writes it."""
        ...

    def drop(self) -> list[str]:
        """Remove what the job keeps on the source (``conveyor clean --drop``); what was removed."""
        ...


@runtime_checkable
class ChangeFeed(Protocol):
    """A source whose changes a sync job reads (``incremental.method=replication``)."""

    def change_feed(self, slot: str, settings: Any, exclusive: bool = True) -> AbstractContextManager[FeedSession]:
        """The job's session on the source; ``exclusive``: holding the job's lock (a run, or a clean that drops; a plan
        or a listing reads beside a running one)."""
        ...

    def feed_slot(self, target_identity: str, settings: Any) -> str:
        """The job's name on the source (``incremental.slot``, else one made from the source and ``target_identity``)."""
        ...


@runtime_checkable
class ChangeApplier(Protocol):
    """A sink that can be a sync's target: see the module's docstring and ``conveyor.testing.suites.ChangeApplySuite``."""

    @property
    def sync_target(self) -> str: ...

    def sync_state(self, slot: str) -> SyncState | None: ...

    def record_sync(self, record: SyncRecord) -> None: ...

    def forget_sync(self, slot: str) -> list[str]: ...

    def sync_stage(self, slot: str) -> str:
        """A new, empty stage of ``slot``'s changed rows for this target (its name)."""
        ...

    def stage_sink(self, stage: str, options: Any) -> Any:
        """The sink the stage is loaded with (this sink aimed at the stage), in ``stage_load_mode``."""
        ...

    #: the load mode a run's first read loads the stage with (later reads of the same run append)
    stage_load_mode: str

    def drop_stage(self, stage: str) -> None: ...

    def apply_changes(self, changes: Sequence[Change]) -> list[Applied]:
        """Apply each target's staged changes, recording each one's position with them; ``changes`` are the targets of one
        job (this sink's ``for_target`` of each table), parents first. Raises, with each target as it was, where one did
        not take them, and where a state does not hold the position its change expects (another run applied meanwhile)."""
        ...


@runtime_checkable
class DescribesApply(Protocol):
    """A sync target that can say, before a run, what a run rewrites beyond the changed rows (``conveyor plan``)."""

    def apply_plan(self) -> list[str]:
        """Lines for ``conveyor plan`` (ClickHouse: the partitions a run's changes touch are rewritten whole)."""
        ...


__all__ = ["Applied", "Change", "ChangeApplier", "ChangeFeed", "DescribesApply", "FeedRun", "FeedSession", "FeedTable", "SyncRecord",
           "SyncState", "TableChanges"]
