"""The Delta Lake sink (``sink=delta``): each task writes its partition with ``write_deltalake`` as one commit
carrying an application transaction id (``txn``) of the load and partition, so a retried or resumed partition
is never committed twice; truncate / create / replace write into a stage table inside the target's folder,
whose files are made the target's content in one commit at the end. See docs/delta.md."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.files import cursors
from conveyor.connectors.lake import deltaops
from conveyor.connectors.lake.common import LOAD, PARTITION, Beat, Counted, app_id, failed, secret_values
from conveyor.connectors.lake.deltaops import STAGE, DeltaConnConfig, arrow_schema, commits_of, open_table
from conveyor.connectors.lake.deltasync import DeltaChangeApplier
from conveyor.connectors.lake.types import conform, written_schema, written_type
from conveyor.core import (
    CursorState,
    JobOptions,
    Partition,
    PrepareRequest,
    SinkBase,
    SinkCapabilities,
    SinkPlan,
    TargetInfo,
    WriteStats,
    check_partition_rows,
    check_stored,
    columns_only,
    target_for,
)
from conveyor.errors import ConfigError, TransferError
from conveyor.kit import fs as fs_util
from conveyor.kit import merge as merging
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.staged import check_mode
from conveyor.log import say


@dataclass
class DeltaSinkConfig(DeltaConnConfig, merging.MergeOptions):
    #: create / replace: partition columns
    partition_by: list[str] = field(default_factory=list)
    #: create / replace: table configuration (delta.* properties)
    configuration: dict[str, Any] = field(default_factory=dict)
    #: source columns whose values may change type by Arrow's safe cast (the cast policy's overrides)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_merge_options()


@dataclass(frozen=True)
class DeltaPlan:
    schema: Any
    partition_by: list[str]
    merge: merging.MergePlan | None = None
    window: Any = None


class DeltaSink(DeltaChangeApplier, SinkBase):
    """A commit per partition with its transaction id (append), or a stage table swapped in at the end."""

    #: what verify=count says of the checks this sink makes (conveyor/pipelines/verify.py)
    commit_check = ("the rows each partition sent checked against the source's before its "
                    "commit, and the rows its commit added (its metrics) against those sent")
    merge_check = ("the staged keys are checked (no NULL, none twice) before the "
                   "merge; its commit's metrics must show every staged row updated or inserted")
    config_class = DeltaSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"), read_back=True)

    def __init__(self, config: DeltaSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._beat: Beat | None = None

    def __getstate__(self) -> dict[str, Any]:  # the driver's beat stays where it was made
        return {**self.__dict__, "_beat": None}

    def for_target(self, schema: str, table: str, options: JobOptions) -> DeltaSink:
        return DeltaSink(dataclasses.replace(self.config, path=target_for(self.config.path, schema, table, "sink.path")), options)

    def _stage(self) -> str:
        return f"{self.config.path.rstrip('/')}/{STAGE}{self.options.load}"

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        mode = self.options.load_mode
        last = "merged into the target by its keys" if mode == "merge" else "its files made the target's"
        path = ("one commit per partition (write_deltalake, with the partition's transaction id)" if mode == "append" else
                f"each partition committed into a stage table in the target's folder, {last} in one commit at the end")
        return TargetInfo(label=self.config.where(), checks_before_commit=mode == "append", path=path)

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        conf, mode, where = self.config, self.options.load_mode, self.config.where()
        existing = open_table(conf.path, conf.storage())
        check_mode(mode, existing is not None, where)
        schema = request.schema
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            arrow = written_schema(schema, "delta")
            unknown = [c for c in conf.partition_by if c not in schema.names]
            if unknown:
                raise ConfigError(f"sink.partition_by: {', '.join(unknown)} is not a column of the source", key="sink.partition_by")
            partition_by = list(conf.partition_by)
        else:
            arrow = arrow_schema(existing.schema())
            target = [TargetColumn(f.name, str(f.type), f.nullable) for f in arrow]
            pairs = map_columns(schema.names, target, self.options.map_method, where, self.options.schema_drift)
            self._check_casts(pairs, schema, arrow)
            partition_by = list(existing.metadata().partition_columns)
        import pyarrow as pa

        merge = merging.plan(self.config, request.info.primary_key, [t for _, t in pairs], arrow.names, where) if mode == "merge" else None
        arrow = pa.schema([arrow.field(t) for _, t in pairs])
        write_target = conf.path
        if mode != "append":
            write_target = self._stage()
            if open_table(write_target, conf.storage()) is None:
                try:
                    deltaops.deltalake().DeltaTable.create(write_target, schema=arrow, partition_by=partition_by or None, mode="error",
                                                   storage_options=conf.storage())
                except Exception as exc:
                    raise failed(f"{where}: creating its stage table", exc, secret_values(conf.storage_options)) from None
        if request.window is not None:  # before any file of the load: a run that stops half way is known to the next
            fs, root = self._cursor_root()
            cursors.record_pending(fs, root, request.window, self.options.load, mode, self.options.run_id)
        self._beat = Beat(conf.path, self.options.run_id, conf.fsspec_options())
        said = columns_only(request.info) if mode in ("create", "replace") else ""
        if said:
            say(f"{where}: {said}")
        return SinkPlan(definition=said, target=where, write_target=write_target, load_mode=mode, columns=tuple(t for _, t in pairs),
                        source_columns=tuple(s for s, _ in pairs), schema=schema, rows_before=None if mode == "append" else 0,
                        checks_before_commit=mode == "append", own=DeltaPlan(arrow, partition_by, merge, request.window))

    def _check_casts(self, pairs: list[tuple[str, str]], schema: Any, fields: Any) -> None:
        from conveyor.kit.casts import ColumnType, check_casts

        sources = [ColumnType(written_type(schema.field(s).type, "delta", s)) for s, _ in pairs]
        targets = [ColumnType(fields.field(t).type, sql=str(fields.field(t).type)) for _, t in pairs]
        check_casts(pairs, sources, targets, self.config.where(), self.config.allow_cast, engine="Arrow")

    # --- the tasks -------------------------------------------------------------------------------

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        table = open_table(plan.write_target, self.config.storage())
        return {} if table is None else commits_of(table, self.options.load)

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        dl = deltaops.deltalake()
        start, key, conf = time.perf_counter(), part.key, self.config
        arrow = plan.own.schema
        where, txn = conf.where(), app_id(self.options.load, key)
        table = open_table(plan.write_target, conf.storage())
        if table is None:
            raise TransferError(f"{where}: {plan.write_target} is gone", partition=key, hint="run again without resume")
        if table.transaction_version(txn) is not None:
            return WriteStats(key, commits_of(table, self.options.load).get(key, 0), 0, time.perf_counter() - start, already_committed=True)

        def before_commit(rows: int) -> None:  # raised inside the stream: write_deltalake commits nothing then
            check_partition_rows(where, key, plan.expecting, rows)

        sent = Counted(batches, lambda b: conform(b.select(list(plan.source_columns)), arrow, where), before_commit)
        props = dl.CommitProperties(custom_metadata={LOAD: self.options.load, PARTITION: key},
                                    app_transactions=[dl.Transaction(txn, 1)])
        try:
            dl.write_deltalake(table, pa.RecordBatchReader.from_batches(arrow, iter(sent)), mode="append", commit_properties=props)
        except Exception as exc:
            if sent.error is not None:  # the source's error, or a check of ours, raised inside the stream
                raise sent.error from None
            table.update_incremental()
            if table.transaction_version(txn) is not None:  # another attempt of this partition committed first (delta-rs
                # refuses a second commit of one transaction id): its rows are there once; the files this one wrote are
                # referenced by no version (conveyor clean removes them)
                return WriteStats(key, commits_of(table, self.options.load).get(key, 0), 0, time.perf_counter() - start,
                                  already_committed=True)
            raise failed(f"{where}: writing partition {key}", exc, secret_values(conf.storage_options), partition=key) from None
        table.update_incremental()
        stored = commits_of(table, self.options.load).get(key)
        check_stored(where, key, sent.rows, stored)
        return WriteStats(key, stored or 0, sent.bytes, time.perf_counter() - start)

    def target_rows(self, plan: SinkPlan) -> int:
        table = open_table(plan.write_target, self.config.storage())
        return 0 if table is None else int(table.count())

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        try:
            if plan.load_mode == "merge":
                deltaops.merge(self.config, plan, self.options.load, results)
            elif plan.load_mode != "append":
                deltaops.swap_in(self.config, plan, self.options.load, results)
            if plan.own.window is not None:  # the load is visible: the window's end becomes the cursor
                fs, root = self._cursor_root()
                cursors.commit(fs, root, plan.own.window, self.options.load, self.options.run_id)
        finally:
            self._stop()

    def abort(self, plan: SinkPlan) -> None:
        try:
            if plan.load_mode != "append":
                fs, base = fs_util.filesystem(plan.write_target, self.config.fsspec_options())
                if self._stage_in_use(plan):  # the load was made the table's content before the failure: its files stay
                    base = f"{base}/_delta_log"
                with contextlib.suppress(Exception):
                    fs.rm(base, recursive=True)
        finally:
            self._stop()

    def _stage_in_use(self, plan: SinkPlan) -> bool:
        """Whether the target's current version refers to files of the load's stage."""
        import pyarrow as pa

        with contextlib.suppress(Exception):
            target = open_table(self.config.path, self.config.storage())
            prefix = plan.write_target.rstrip("/").rsplit("/", 1)[-1] + "/"
            if target is not None:
                return any(p.startswith(prefix) for p in pa.table(target.get_add_actions(flatten=True)).column("path").to_pylist())
        return False

    def _stop(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None

    def leftovers(self, remove: bool) -> list[str]:
        """Stage tables of loads that did not finish, and data files no version of the log refers to (a killed
        task's); with ``remove``, removed once no load of the table beats (see common.Beat)."""
        return deltaops.leftovers(self.config, remove)

    # --- incremental cursors, kept beside the table (as a file sink keeps them: conveyor/connectors/files/cursors.py)

    def _cursor_root(self) -> tuple[Any, str]:
        return fs_util.filesystem(self.config.path, self.config.fsspec_options())

    def cursor_state(self, column: str) -> CursorState:
        table = open_table(self.config.path, self.config.storage())
        if table is None:
            return CursorState()
        fs, root = self._cursor_root()
        return cursors.state(fs, root, column, lambda load: len(commits_of(table, load)))


__all__ = ["DeltaSink", "DeltaSinkConfig"]
