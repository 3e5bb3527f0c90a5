"""A sync job (``incremental.method=replication``) into a Delta table: each run's changed rows are loaded into a
stage table in the target's folder, then applied in one Delta MERGE commit (a staged key whose row exists at the
source updates or inserts it, one whose row is gone deletes it), which also carries the sync's position in its
commit metadata (``conveyor.sync.<slot>``): the rows and the position move together. What the merge did is read
from the commit's own metrics: every staged row must have been written, and every gone key's row deleted or absent."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from conveyor.connectors.lake.common import failed, secret_values
from conveyor.connectors.lake.deltaops import deltalake, open_table
from conveyor.core.changes import Applied, SyncRecord, SyncState
from conveyor.errors import SchemaError, VerificationError
from conveyor.kit import fs as fs_util
from conveyor.kit.syncapply import PRESENT, ApplyPerTable

STATE = "conveyor.sync."
STAGE = "conveyor-sync-"


class DeltaChangeApplier(ApplyPerTable):
    """The sync methods of the Delta sink (see the module's docstring)."""

    config: Any
    options: Any
    #: the stage is created from the source's columns (and _conveyor_present), as the first load created the target
    stage_load_mode = "replace"

    @property
    def _sync_target(self) -> str:
        return self.config.path

    def _target(self) -> Any:
        table = open_table(self.config.path, self.config.storage())
        if table is None:
            raise SchemaError(f"{self.config.where()} does not exist", hint="run the sync's first load again (conveyor clean --drop, then run)")
        return table

    def sync_state(self, slot: str) -> SyncState | None:
        table = open_table(self.config.path, self.config.storage())
        if table is None:
            return None
        for entry in table.history():  # newest first: the last commit that moved the position
            if STATE + slot in entry:
                value = entry[STATE + slot]
                if not value:
                    return None
                got = json.loads(value)
                return SyncState(int(got["position"]), got["signature"], got["source"])
        return None

    def _props(self, record: SyncRecord | None, slot: str = "") -> Any:
        value = json.dumps({"position": record.position, "signature": record.signature, "source": record.source}) if record else ""
        return deltalake().CommitProperties(custom_metadata={STATE + (record.slot if record else slot): value})

    def record_sync(self, record: SyncRecord) -> None:
        """The position alone, in a commit that adds no file."""
        table = self._target()
        try:
            table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=self._props(record))
        except Exception as exc:
            raise failed(f"{self.config.where()}: recording the sync's position", exc, secret_values(self.config.storage_options)) from None

    def forget_sync(self, slot: str) -> list[str]:
        out = []
        if self.sync_state(slot) is not None:
            table = self._target()
            table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=self._props(None, slot))
            out.append(f"sync state of {self._sync_target} ({slot})")
        self.drop_stage(self._stage_path(slot))
        return out

    def _stage_path(self, slot: str) -> str:
        return f"{self.config.path.rstrip('/')}/{STAGE}{slot[-16:]}"

    def sync_stage(self, slot: str) -> str:
        stage = self._stage_path(slot)
        self.drop_stage(stage)
        return stage

    def stage_sink(self, stage: str, options: Any) -> Any:
        """The sink the sync's stage is loaded with (a Delta table of its own at ``stage``)."""
        return type(self)(dataclasses.replace(self.config, path=stage, partition_by=[]), options)

    def drop_stage(self, stage: str) -> None:
        fs, base = fs_util.filesystem(stage, self.config.fsspec_options())
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.rm(base, recursive=True)

    def apply_sync(self, stage: str, keys: Sequence[str], full: bool, record: SyncRecord | None, expect: int | None = None) -> Applied:
        import pyarrow.compute as pc

        conf, where = self.config, self.config.where()
        staged = open_table(stage, conf.storage())
        if staged is None:
            raise SchemaError(f"{where}: the sync's stage {stage} is gone", hint="run the sync again")
        rows = staged.to_pyarrow_dataset().to_table()
        present = rows.filter(pc.field(PRESENT))
        columns = [c for c in rows.column_names if c != PRESENT]
        target = self._target()
        props = self._props(record) if record else None
        try:
            if full:  # the source was truncated: the target becomes the present rows, in one commit
                deleted = target.count()
                deltalake().write_deltalake(target, present.select(columns), mode="overwrite", commit_properties=props)
                return Applied(keys=rows.num_rows, written=present.num_rows, deleted=deleted, full=True)
            q = _quote
            on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
            merger = target.merge(source=rows, predicate=on, source_alias="s", target_alias="t", commit_properties=props)
            sets = {q(c): f"s.{q(c)}" for c in columns}
            metrics = (merger.when_matched_delete(predicate=f"NOT s.{q(PRESENT)}")
                       .when_matched_update(updates=sets, predicate=f"s.{q(PRESENT)}")
                       .when_not_matched_insert(updates=sets, predicate=f"s.{q(PRESENT)}").execute())
        except Exception as exc:
            raise failed(f"{where}: applying the sync's changes", exc, secret_values(conf.storage_options)) from None
        if record is not None and (self.sync_state(record.slot) or SyncState(-1, "", "")).position != record.position:
            self.record_sync(record)  # a merge that changed nothing may commit nothing: the position on its own
        written = int(metrics.get("num_target_rows_updated", 0)) + int(metrics.get("num_target_rows_inserted", 0))
        deleted = int(metrics.get("num_target_rows_deleted", 0))
        if written != present.num_rows or deleted > rows.num_rows - present.num_rows:
            raise VerificationError(f"verification failed for {where}: the sync's merge commit wrote {written:,} of the "
                                    f"{present.num_rows:,} staged rows and deleted {deleted:,}",
                                    hint="the commit is in the table's history: check the table, then run the sync's first load again")
        return Applied(keys=rows.num_rows, written=written, deleted=deleted)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


__all__ = ["DeltaChangeApplier"]
