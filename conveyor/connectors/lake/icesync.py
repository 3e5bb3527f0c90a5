"""A sync job (``incremental.method=replication``) into an Iceberg table: each run's changed rows are loaded into a
stage table, then applied in one snapshot transaction: the staged keys' rows deleted (pyiceberg rewrites the files
that hold them), the rows that exist at the source appended, and the sync's position set as a table property
(``conveyor.sync.<slot>``) in the same commit. After it, the table is read back for the staged keys: it must hold
exactly the staged rows that exist."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from conveyor.connectors.lake import icecommon as ice
from conveyor.connectors.lake.common import failed
from conveyor.core.changes import Applied, SyncRecord, SyncState
from conveyor.errors import SchemaError, TransferError, VerificationError
from conveyor.kit.syncapply import PRESENT, ApplyPerTable, stale

STATE = "conveyor.sync."
STAGE = "__conveyor_sync_"


class IcebergChangeApplier(ApplyPerTable):
    """The sync methods of the Iceberg sink (see the module's docstring)."""

    config: Any
    catalog: Any
    stage_load_mode = "replace"

    @property
    def _sync_target(self) -> str:
        return self.config.table

    def _target(self) -> Any:
        table = self.config.load(self.catalog)
        if table is None:
            raise SchemaError(f"{self.config.where()} does not exist", hint="run the sync's first load again (conveyor clean --drop, then run)")
        return ice.no_retry(table)

    def sync_state(self, slot: str) -> SyncState | None:
        table = self.config.load(self.catalog)
        value = table.metadata.properties.get(STATE + slot) if table is not None else None
        if not value:
            return None
        got = json.loads(value)
        return SyncState(int(got["position"]), got["signature"], got["source"])

    @staticmethod
    def _value(record: SyncRecord) -> str:
        return json.dumps({"position": record.position, "signature": record.signature, "source": record.source})

    def _sync_commit(self, build: Any) -> Any:
        """``build(table)`` makes a transaction on the table as it is now; committed, and after a conflict built again."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(50):
            txn, result = build(self._target())
            try:
                txn.commit_transaction()
                return result
            except CommitFailedException:
                time.sleep(0.1 * (attempt + 1))
            except Exception as exc:
                raise failed(f"{self.config.where()}: applying the sync's changes", exc, self.config.secrets()) from None
        raise TransferError(f"{self.config.where()}: the sync's commit kept meeting other commits", hint="run the sync again")

    def record_sync(self, record: SyncRecord) -> None:
        def build(table: Any) -> tuple[Any, None]:
            txn = table.transaction()
            txn.set_properties(**{STATE + record.slot: self._value(record)})
            return txn, None

        self._sync_commit(build)

    def forget_sync(self, slot: str) -> list[str]:
        out = []
        if self.sync_state(slot) is not None:
            def build(table: Any) -> tuple[Any, None]:
                txn = table.transaction()
                txn.remove_properties(STATE + slot)
                return txn, None

            self._sync_commit(build)
            out.append(f"sync state of {self._sync_target} ({slot})")
        self.drop_stage(self._stage_name(slot))
        return out

    def _stage_name(self, slot: str) -> str:
        ns, name = self.config.identifier
        return f"{ns}.{name}{STAGE}{slot[-16:]}"

    def sync_stage(self, slot: str) -> str:
        stage = self._stage_name(slot)
        self.drop_stage(stage)
        return stage

    def stage_sink(self, stage: str, options: Any) -> Any:
        """The sink the sync's stage is loaded with (an Iceberg table of its own)."""
        return type(self)(dataclasses.replace(self.config, table=stage, partition_by=[]), options)

    def drop_stage(self, stage: str) -> None:
        with contextlib.suppress(Exception):
            if self.catalog.table_exists(stage):
                self.catalog.purge_table(stage)

    def apply_sync(self, stage: str, keys: Sequence[str], full: bool, record: SyncRecord | None, expect: int | None = None) -> Applied:
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue

        where = self.config.where()
        staged_table = self.catalog.load_table(stage) if self.catalog.table_exists(stage) else None
        if staged_table is None:
            raise SchemaError(f"{where}: the sync's stage {stage} is gone", hint="run the sync again")
        rows = staged_table.scan().to_arrow()
        present = rows.filter(pc.field(PRESENT)).drop_columns([PRESENT])
        gone = rows.filter(pc.invert(pc.field(PRESENT))).select(list(keys))
        match = AlwaysTrue() if full else _key_filter(rows.select(list(keys)), keys)
        counts: dict[str, int] = {}

        def build(table: Any) -> tuple[Any, None]:
            if record is not None and expect is not None:  # the table as this commit will replace it (built again after a conflict)
                value = table.metadata.properties.get(STATE + record.slot)
                held = int(json.loads(value)["position"]) if value else None
                if held != expect:
                    raise stale(self.sync_target, held, expect, "this run applied nothing more to it")
            before = table.scan(row_filter=match, selected_fields=tuple(keys)).to_arrow() if table.current_snapshot() else None
            counts["deleted"] = (before.num_rows if full else before.join(gone, list(keys), join_type="inner").num_rows) if before else 0
            arrow = table.schema().as_arrow()
            txn = table.transaction()
            if before is not None and before.num_rows:
                txn.delete(delete_filter=match)
            if present.num_rows:
                txn.append(present.select(arrow.names).cast(arrow))
            if record is not None:
                txn.set_properties(**{STATE + record.slot: self._value(record)})
            return txn, None

        self._sync_commit(build)
        after = self._target().scan(row_filter=match, selected_fields=tuple(keys)).to_arrow()
        if after.num_rows != present.num_rows:
            raise VerificationError(f"verification failed for {where}: after the sync's commit it holds {after.num_rows:,} rows for the "
                                    f"staged keys, and {present.num_rows:,} exist at the source",
                                    hint="another writer changed the table during the apply: check it, then run the sync's first load again")
        return Applied(keys=rows.num_rows, written=present.num_rows, deleted=counts["deleted"], full=full)


def _key_filter(keys_table: Any, keys: Sequence[str]) -> Any:
    """A row filter matching the staged keys: ``k IN (...)`` for one key column, else for a composite key, per value of its
    first column, that value AND the rest's (an IN of the last column's values where the others are one row): an OR of them
    built as a balanced tree, so that binding and evaluating it recurses log2(keys) deep, not once per key."""
    from functools import reduce

    from pyiceberg.expressions import AlwaysFalse, And, EqualTo, In, Or

    if not keys_table.num_rows:
        return AlwaysFalse()
    if len(keys) == 1:
        return In(keys[0], set(keys_table.column(0).to_pylist()))
    groups: dict[tuple[Any, ...], set[Any]] = {}
    head, last = list(keys[:-1]), keys[-1]
    for row in keys_table.select([*head, last]).to_pylist():  # the changed keys (a fraction of the table), once per run
        groups.setdefault(tuple(row[k] for k in head), set()).add(row[last])
    terms = [reduce(And, [*(EqualTo(k, v) for k, v in zip(head, values)), In(last, tail) if len(tail) > 1 else EqualTo(last, next(iter(tail)))])
             for values, tail in groups.items()]
    return _balanced(Or, terms)


def _balanced(op: Any, terms: list[Any]) -> Any:
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return op(_balanced(op, terms[:mid]), _balanced(op, terms[mid:]))


__all__ = ["IcebergChangeApplier"]
