"""A sync job (``incremental.method=replication``) into a ClickHouse MergeTree table, exact for readers without
``FINAL``: no duplicate row and no tombstone is ever in the table.

Each run's changed rows are loaded into a stage (``_conveyor_sync_stage_<slot>``: the source's columns, Nullable,
and ``_conveyor_present``) by the sink's own write. The apply then rebuilds, on the server, every partition of the
target the changes touch (the partitions of the staged keys' current rows and of their new rows): into a table made
like the target (``_conveyor_sync_new_<slot>``) go the staged rows that exist at the source and the partitions' other
rows (their keys not staged); each partition is then swapped in whole with ``ALTER TABLE ... REPLACE PARTITION ...
FROM`` (a partition left with no row: ``DROP PARTITION``), which a reader sees before or after, never between. A
table without ``PARTITION BY`` is one partition: a run rewrites it whole, on the server. What the target holds is
read back after: each present staged key once, no gone key, every rebuilt partition as many rows as were built.
The position goes into ``_conveyor_sync`` after; a run killed before it is repeated, which rebuilds the same
partitions from what the target holds then and the same staged keys: the same rows (idempotent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.clickhouse.common import literal, qident
from conveyor.core.changes import Applied, SyncRecord, SyncState
from conveyor.errors import ConveyorError, SchemaError, VerificationError
from conveyor.kit.syncapply import PRESENT, ApplyPerTable, stale

STATE = "_conveyor_sync"
STAGE, NEW = "_conveyor_sync_stage_", "_conveyor_sync_new_"


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: the staged rows, those that exist, the target's rows removed, the partitions and rows swapped in."""

    staged: int
    present: int
    deleted: int
    partitions: int
    rows: int

    def describe(self) -> str:
        return f"{self.partitions} partition(s) rewritten, {self.rows:,} rows"


class ChChangeApplier(ApplyPerTable):
    """The sync methods of the ClickHouse sink (see the module's docstring)."""

    config: Any
    options: Any
    #: the stage is created from the source's columns (Nullable: a gone key's row has none) and _conveyor_present
    stage_load_mode = "replace"

    @property
    def _sync_target(self) -> str:
        return f"{self.config.database}.{self.config.table}"

    def _state(self) -> str:
        state = self._q(STATE)
        self.config.run(f"CREATE TABLE IF NOT EXISTS {state} (slot String, target String, source String, position Int64, "
                        "signature String, at UInt64) ENGINE = MergeTree ORDER BY (slot, target, at)", doing=f"creating {STATE}")
        return state

    def sync_state(self, slot: str) -> SyncState | None:
        if not self._exists(STATE, "reading the sync state"):
            return None
        rows = self.config.run(f"SELECT position, signature, source FROM {self._q(STATE)} WHERE slot = {literal(slot)} "
                               f"AND target = {literal(self._sync_target)} ORDER BY at DESC LIMIT 1", doing="reading the sync state")
        if not rows or int(rows[0][0]) < 0:
            return None
        return SyncState(int(rows[0][0]), rows[0][1], rows[0][2])

    def _write_state(self, slot: str, source: str, position: int, signature: str) -> None:
        at = max(time.time_ns(), int(self.config.run(f"SELECT max(at) + 1 FROM {self._state()}", doing="recording the sync state")[0][0]))
        self.config.run(f"INSERT INTO {self._q(STATE)} (slot, target, source, position, signature, at) VALUES ({literal(slot)}, "
                        f"{literal(self._sync_target)}, {literal(source)}, {int(position)}, {literal(signature)}, {at})",
                        doing="recording the sync state")

    def record_sync(self, record: SyncRecord) -> None:
        self._write_state(record.slot, record.source, record.position, record.signature)

    def forget_sync(self, slot: str) -> list[str]:
        out = []
        if self.sync_state(slot) is not None:
            self._write_state(slot, "", -1, "")
            out.append(f"sync state of {self._sync_target} ({slot})")
        for name in (self._stage_name(slot), self._new_name(slot)):
            self.config.run(f"DROP TABLE IF EXISTS {self._q(name)}", doing="dropping the sync's stage")
        return out

    def _stage_name(self, slot: str) -> str:
        return f"{STAGE}{slot[-16:]}_{self.config.table}"[:200]

    def _new_name(self, slot: str) -> str:
        return f"{NEW}{slot[-16:]}_{self.config.table}"[:200]

    def sync_stage(self, slot: str) -> str:
        """The run's stage; a killed run's tables of the slot dropped (a run holds the job's lock: none other is applying)."""
        stage = self._stage_name(slot)
        self.drop_stage(stage)
        self.drop_stage(self._new_name(slot))
        return stage

    def stage_sink(self, stage: str, options: Any) -> Any:
        """The sink the stage is loaded with: a table of its own, unpartitioned and unsorted (its columns Nullable)."""
        return type(self)(dataclasses.replace(self.config, table=stage, partition_by=None, order_by=[]), options)  # type: ignore[call-arg]

    def drop_stage(self, stage: str) -> None:
        self.config.run(f"DROP TABLE IF EXISTS {self._q(stage)}", doing="dropping the sync's stage")

    def apply_sync(self, stage: str, keys: Sequence[str], full: bool, record: SyncRecord | None, expect: int | None = None) -> Applied:
        where = f"clickhouse table {self._sync_target}"
        made = self._new_name(record.slot if record else stage)
        self._claim(self._q(made), self._q(), where, record, expect)
        try:
            done = self.rebuild(stage, made, keys, PRESENT, full, where)
            if record is not None:
                self.record_sync(record)
        finally:
            with contextlib.suppress(Exception):
                self.config.run(f"DROP TABLE IF EXISTS {self._q(made)}")
        return Applied(keys=done.staged, written=done.present, deleted=done.deleted, full=full, detail=done.describe())

    def rebuild(self, stage: str, made: str, keys: Sequence[str], present: str | None, full: bool, where: str) -> Rebuilt:
        """The target with the rows of ``stage`` in place of its rows of the same keys (``present``: the stage's column that
        says a key's row exists, else every staged row does; ``full``: the target's other rows dropped too): the
        partitions touched rebuilt in ``made`` (an empty table made like the target), swapped in one by one, read back."""
        conf, run = self.config, self.config.run
        target, staged = self._q(), self._q(stage)
        cols = [r[0] for r in run(f"SELECT name FROM system.columns WHERE database = {literal(conf.database)} "
                                  f"AND table = {literal(conf.table)}", doing="reading the target")]
        if not cols:
            raise SchemaError(f"{where} does not exist", hint="run the sync's first load again (conveyor clean --drop, then run)")
        key = f"({', '.join(qident(k) for k in keys)})"
        staged_keys = f"(SELECT {', '.join(f'assumeNotNull({qident(k)})' for k in keys)} FROM {staged})"
        live = f" WHERE {qident(present)}" if present else ""
        gone_keys = staged_keys[:-1] + f" WHERE NOT {qident(present)})" if present else None
        listed = ", ".join(qident(c) for c in cols)
        pkey = run(f"SELECT partition_key FROM system.tables WHERE database = {literal(conf.database)} AND name = {literal(conf.table)}",
                   doing="reading the target")[0][0]
        new = self._q(made)
        kept = int(run(f"SELECT count() FROM {staged}", doing="counting the stage")[0][0])
        rows = int(run(f"SELECT count() FROM {staged}{live}", doing="counting the stage")[0][0])
        deleted = 0
        if full or gone_keys:
            deleted = int(run(f"SELECT count() FROM {target}" + ("" if full else f" WHERE {key} IN {gone_keys}"),
                              doing="reading the target")[0][0])
        run(f"INSERT INTO {new} ({listed}) SELECT {listed} FROM {staged}{live}", doing="staging the new rows")
        # the partitions touched: the new rows' (in the new table), and those of the staged keys' rows now (or every one)
        touched = set(self._partitions(made))
        if full:
            touched |= set(self._partitions(conf.table))
        else:
            probe = self._q(made + "_old")
            run(f"DROP TABLE IF EXISTS {probe}", f"CREATE TABLE {probe} AS {target}",
                f"INSERT INTO {probe} SELECT * FROM {target} WHERE {key} IN {staged_keys}", doing="finding the partitions")
            try:
                touched |= set(self._partitions(made + "_old"))
            finally:
                run(f"DROP TABLE IF EXISTS {probe}")
        ordered = sorted(touched)
        if not full and ordered:
            within = "" if not pkey else f" AND ({pkey}) IN ({', '.join(ordered)})"
            run(f"INSERT INTO {new} SELECT * FROM {target} WHERE {key} NOT IN {staged_keys}{within}", doing="rebuilding the partitions")
        built = self._partition_rows(made, "counting the partitions")
        for part in ordered:
            if part in built:
                run(f"ALTER TABLE {target} REPLACE PARTITION {part} FROM {new}", doing=f"swapping in partition {part}")
            else:
                run(f"ALTER TABLE {target} DROP PARTITION {part}", doing=f"emptying partition {part}")
        self._check(where, target, key, staged_keys[:-1] + live + ")", gone_keys, built, [p for p in ordered if p not in built], rows)
        return Rebuilt(kept, rows, deleted, len(ordered), sum(built.values()))

    def apply_plan(self) -> list[str]:
        """What a run rewrites (``conveyor plan``): the partitions its changes touch, of those the table has now."""
        conf = self.config
        found = conf.run(f"SELECT partition_key FROM system.tables WHERE database = {literal(conf.database)} AND name = {literal(conf.table)}",
                         doing="reading the target")
        if not found:
            return []
        parts = self._partition_rows(conf.table, "reading the target")
        rows = sum(parts.values())
        if not found[0][0]:
            return [f"sync: a run rewrites {self._sync_target} whole on the server ({rows:,} rows now; no PARTITION BY), "
                    "swapped in with REPLACE PARTITION"]
        return [f"sync: a run rewrites the partitions of {self._sync_target} its changes touch (PARTITION BY {found[0][0]}: "
                f"{len(parts):,} partitions now, {rows:,} rows, the largest {max(parts.values(), default=0):,}), each swapped in "
                "with REPLACE PARTITION"]

    def _claim(self, new: str, target: str, where: str, record: SyncRecord | None, expect: int | None) -> None:
        """The apply's own table, made without IF NOT EXISTS: a second apply of the sync at once finds it and is refused by
        name (a run of the job holds the job's lock on the source, and its stage drops a killed run's); then the state
        is read again: an apply that committed meanwhile is not repeated over."""
        try:
            self.config.run(f"CREATE TABLE {new} AS {target}", doing="making the partitions' table")
        except Exception as exc:
            if "already exists" not in str(exc):
                raise
            raise ConveyorError(f"{where}: another apply of this sync is running (its table {new} exists)",
                                hint="wait for it; a killed run's table is dropped by the job's next run") from None
        if record is not None and expect is not None:
            held = self.sync_state(record.slot)
            if held is None or held.position != expect:
                with contextlib.suppress(Exception):
                    self.config.run(f"DROP TABLE IF EXISTS {new}")
                raise stale(self._sync_target, None if held is None else held.position, expect, "this run applied nothing to it")

    def _partition_rows(self, table: str, doing: str) -> dict[str, int]:
        """A table's partitions (each as the expression ``PARTITION`` takes) and the rows of each, as its active parts hold them."""
        return {p: int(n) for p, n in self.config.run(f"SELECT partition, toString(sum(rows)) FROM system.parts WHERE active AND "
                                                      f"database = {literal(self.config.database)} AND table = {literal(table)} "
                                                      "GROUP BY partition", doing=doing)}

    def _partitions(self, table: str) -> list[str]:
        return list(self._partition_rows(table, "listing partitions"))

    def _check(self, where: str, target: str, key: str, live: str, gone_keys: str | None, built: dict[str, int],
               emptied: list[str], present: int) -> None:
        """What the target holds now: each present staged key once, no gone key, each rebuilt partition its built rows."""
        run = self.config.run
        found, distinct = (int(v) for v in run(f"SELECT count(), uniqExact({key}) FROM {target} WHERE {key} IN {live}",
                                               doing="reading the target back")[0])
        gone = 0 if gone_keys is None else int(run(f"SELECT count() FROM {target} WHERE {key} IN {gone_keys}",
                                                   doing="reading the target back")[0][0])
        held = self._partition_rows(self.config.table, "reading the target back")
        wrong = [p for p, n in built.items() if held.get(p) != n] + [p for p in emptied if p in held]
        if found != present or distinct != present or gone or wrong:
            raise VerificationError(f"verification failed for {where}: after the sync's apply it holds {found:,} rows of the "
                                    f"{present:,} present staged keys ({distinct:,} distinct), {gone:,} of the gone keys, and "
                                    f"{len(wrong)} rebuilt partition(s) with other than the rows built",
                                    hint="another writer changed the table during the apply? run the sync again (it rebuilds the "
                                         "same partitions), or its first load (conveyor clean --drop, then run)")


__all__ = ["ChChangeApplier"]
