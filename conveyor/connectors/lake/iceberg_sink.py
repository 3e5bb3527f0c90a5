"""The Iceberg sink (``sink=iceberg``): each task writes its partition's data files and commits them as one snapshot
carrying the partition's marker; truncate collects them on a branch and create/replace in a stage table, made the
target's in one commit at the end. See docs/iceberg.md."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.files import cursors
from conveyor.connectors.lake import icecommon as ice
from conveyor.connectors.lake import icefinal
from conveyor.connectors.lake.common import LOAD, PARTITION, Beat, Counted, failed
from conveyor.connectors.lake.icefinal import BRANCH, STAGE
from conveyor.connectors.lake.icesync import IcebergChangeApplier
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
from conveyor.errors import ConfigError, SchemaError, TransferError
from conveyor.kit import merge as merging
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.staged import check_mode
from conveyor.log import say

#: a chunk of a partitioned table's rows written at once (pyiceberg splits a table, not a stream, by partition)
CHUNK_BYTES = 256 << 20


@dataclass
class IcebergSinkConfig(ice.IcebergConnConfig, merging.MergeOptions):
    #: create / replace: the partition spec, e.g. [day(l_shipdate)], [bucket(16, id)], [region]
    partition_by: list[str] = field(default_factory=list)
    #: create / replace: table properties (write.parquet.compression-codec, format-version, ...)
    properties: dict[str, Any] = field(default_factory=dict)
    #: source columns whose values may change type by Arrow's safe cast (the cast policy's overrides)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_merge_options()


@dataclass(frozen=True)
class IcePlan:
    #: the table partitions commit into (the target, or the stage of a create / replace) and the branch (truncate)
    table: str
    branch: str | None
    schema: Any
    merge: merging.MergePlan | None = None
    window: Any = None


class IcebergSink(IcebergChangeApplier, SinkBase):
    """Data files written by the tasks, committed with a marker per partition (append) or in one snapshot at the end."""

    #: what verify=count says of the checks this sink makes (conveyor/pipelines/verify.py)
    commit_check = ("the rows each partition's data files hold (their own footers, "
                    "as written) checked against the source's before its snapshot commits")
    merge_check = ("the staged keys are checked (no NULL, none twice) before the merge; "
                   "after it, the table's growth must be the rows pyiceberg says it inserted")
    config_class = IcebergSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"), read_back=True)

    def __init__(self, config: IcebergSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._catalog: Any = None
        self._beat: Beat | None = None

    def __getstate__(self) -> dict[str, Any]:  # the catalog's connections and the driver's beat stay where they were made
        return {**self.__dict__, "_beat": None} | ({"_catalog": None} if "_catalog" in self.__dict__ else {})

    def for_target(self, schema: str, table: str, options: JobOptions) -> IcebergSink:
        return IcebergSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = self.config.load_catalog()
        return self._catalog

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        mode = self.options.load_mode
        how = "data files written by each task"
        path = {"append": f"{how}, committed as one snapshot per partition (its marker in the snapshot's summary)",
                "truncate": f"{how} onto a branch, made the table's content in one snapshot at the end",
                "merge": f"{how} onto a branch, upserted into the table by its keys in one snapshot at the end"}.get(
            mode, f"{how} into a stage table, renamed to the target at the end")
        return TargetInfo(label=self.config.where(), checks_before_commit=mode == "append", path=path)

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        conf, mode, where = self.config, self.options.load_mode, self.config.where()
        ns, name = conf.identifier
        existing = conf.load(self.catalog)
        check_mode(mode, existing is not None, where)
        schema = request.schema
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            arrow = written_schema(schema, "iceberg")
            arrow = arrow.with_metadata({}) if arrow.metadata else arrow
            stage_name = f"{name}{STAGE}{self.options.load}"
            with contextlib.suppress(Exception):
                self.catalog.create_namespace_if_not_exists(ns)
            stage = conf.load(self.catalog, stage_name)
            if stage is None:
                isch = ice.iceberg_schema(arrow)
                spec = ice.partition_spec(isch, conf.partition_by)
                try:
                    stage = self.catalog.create_table(f"{ns}.{stage_name}", schema=isch, partition_spec=spec,
                                                      properties={str(k): str(v) for k, v in conf.properties.items()})
                except Exception as exc:
                    raise failed(f"{where}: creating its stage table", exc, conf.secrets()) from None
            table, branch, arrow = f"{ns}.{stage_name}", None, stage.schema().as_arrow()
        else:
            fields = existing.schema().as_arrow()
            target = [TargetColumn(f.name, str(f.type), f.nullable) for f in fields]
            pairs = map_columns(schema.names, target, self.options.map_method, where, self.options.schema_drift)
            self._check_casts(pairs, schema, fields)
            arrow = fields
            table, branch = conf.table, (f"{BRANCH}{self.options.load}" if mode in ("truncate", "merge") else None)
            stage = existing
        merge = None
        if mode == "merge":
            ids = existing.schema().identifier_field_names()  # the table's own key (identifier fields), else the source's
            merge = merging.plan(conf, sorted(ids) if ids else request.info.primary_key, [t for _, t in pairs], arrow.names, where)
            if merge.delete != "none" or set(merge.update) != {t for _, t in pairs} - set(merge.keys):
                raise ConfigError(f"load_mode=merge into {where}: pyiceberg's upsert updates every column of a matched row and "
                                  "deletes nothing", key="sink.merge_delete" if merge.delete != "none" else "sink.merge_update",
                                  hint="leave sink.merge_update and sink.merge_delete unset (or merge into a Delta or database table)")
        if request.window is not None:  # before any file of the load: a run that stops half way is known to the next
            fs, root = self._cursor_root(stage)
            cursors.record_pending(fs, root, request.window, self.options.load, mode, self.options.run_id)
        self._beat = Beat(stage.location(), self.options.run_id, icefinal.storage(stage))
        target_schema = _schema_for(arrow, [t for _, t in pairs])
        said = columns_only(request.info) if mode in ("create", "replace") else ""
        if said:
            say(f"{where}: {said}")
        return SinkPlan(definition=said, target=where, write_target=table if branch is None else f"{table}@{branch}", load_mode=mode,
                        columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        rows_before=None if mode == "append" else 0, checks_before_commit=mode == "append",
                        own=IcePlan(table, branch, target_schema, merge, request.window))

    def _check_casts(self, pairs: list[tuple[str, str]], schema: Any, fields: Any) -> None:
        from conveyor.kit.casts import ColumnType, check_casts

        sources, targets = [], []
        for s, t in pairs:
            src = schema.field(s)
            written = written_type(src.type, "iceberg", s)
            sources.append(ColumnType(written))
            targets.append(ColumnType(fields.field(t).type, sql=str(fields.field(t).type)))
        check_casts(pairs, sources, targets, self.config.where(), self.config.allow_cast, engine="Arrow")

    # --- the tasks -------------------------------------------------------------------------------

    def _table(self, plan: SinkPlan) -> Any:
        ns, name = plan.own.table.rsplit(".", 1)
        table = self.config.load(self.catalog, name) if ns == self.config.identifier[0] else None
        if table is None:
            raise TransferError(f"{self.config.where()}: {plan.own.table} is gone", hint="run again without resume")
        return ice.no_retry(table)

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        return {k: rows for k, (rows, _) in ice.markers(self._table(plan), self.options.load).items()}

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        start, key, own = time.perf_counter(), part.key, plan.own
        table = self._table(plan)
        done = ice.markers(table, self.options.load).get(key)
        if done is not None:
            return WriteStats(key, done[0], 0, time.perf_counter() - start, already_committed=True)
        where = self.config.where()
        sent = Counted(batches, lambda b: conform(b.select(list(plan.source_columns)), own.schema, where), None)
        files: list[Any] = []
        try:
            files = self._write_files(table, own.schema, sent)
            stored = sum(f.record_count for f in files)  # each file's count, from its own footer as written
            check_stored(where, key, sent.rows, stored)
            check_partition_rows(where, key, plan.expecting, stored)
        except BaseException:  # nothing of the partition was committed: its files go
            ice.delete_quietly(table.io, [f.file_path for f in files])
            raise
        committed = self._commit(table, plan, key, files)
        if committed is None:  # another attempt of this partition committed first: its rows are there once
            done = ice.markers(self._table(plan), self.options.load)[key]
            return WriteStats(key, done[0], 0, time.perf_counter() - start, already_committed=True)
        check_stored(where, key, stored, committed)  # the snapshot's own added-records
        return WriteStats(key, committed, sent.bytes, time.perf_counter() - start)

    def _write_files(self, table: Any, schema: Any, sent: Counted) -> list[Any]:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        write_uuid = uuid.uuid4()
        try:
            if table.metadata.spec().is_unpartitioned():
                reader = pa.RecordBatchReader.from_batches(schema, iter(sent))
                return list(_dataframe_to_data_files(table.metadata, reader, table.io, write_uuid=write_uuid))
            files: list[Any] = []
            chunk: list[Any] = []
            counter = itertools.count(0)
            for batch in [*sent, None]:
                if batch is not None:
                    chunk.append(batch)
                if chunk and (batch is None or sum(b.nbytes for b in chunk) >= CHUNK_BYTES):
                    files += _dataframe_to_data_files(table.metadata, pa.Table.from_batches(chunk, schema), table.io,
                                                      write_uuid=write_uuid, counter=counter)
                    chunk = []
            return files
        except Exception as exc:
            raise failed(f"{self.config.where()}: writing data files", exc, self.config.secrets()) from None

    def _commit(self, table: Any, plan: SinkPlan, key: str, files: list[Any]) -> int | None:
        """Commit the files as one snapshot with the partition's marker, unless the marker is there already (None: the
        files are deleted). pyiceberg's own retry is off (``no_retry``): after a conflict the table is read again and
        the marker looked for first. Returns the rows the snapshot added, as its summary says. The files are deleted
        only where the commit surely did not land (a conflict, or an error after which the marker is not there)."""
        from pyiceberg.exceptions import CommitFailedException

        where, props = self.config.where(), {LOAD: self.options.load, PARTITION: key}
        deadline = time.monotonic() + 300
        for attempt in range(200):
            if key in ice.markers(table, self.options.load):
                ice.delete_quietly(table.io, [f.file_path for f in files])
                return None
            txn = table.transaction()
            with txn.update_snapshot(snapshot_properties=props, branch=plan.own.branch or "main").fast_append() as append:
                for f in files:
                    append.append_data_file(f)
            try:
                txn.commit_transaction()
            except CommitFailedException:
                if time.monotonic() > deadline:
                    ice.delete_quietly(table.io, [f.file_path for f in files])
                    raise TransferError(f"{where}: partition {key}: its commit kept meeting other commits for 300 s",
                                        partition=key, hint="run again with resume (it is not committed)") from None
                time.sleep(min(2.0, 0.05 * (attempt + 1)) * (1 + random.random()))
                table = ice.no_retry(table.refresh())
                continue
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    table = ice.no_retry(table.refresh())
                got = ice.markers(table, self.options.load).get(key)
                if got is not None:  # it landed after all
                    return got[0]
                ice.delete_quietly(table.io, [f.file_path for f in files])
                if not isinstance(exc, Exception):  # a stop (Ctrl-C, a cancelled task) goes on as it is
                    raise
                raise failed(f"{where}: committing partition {key}", exc, self.config.secrets(), partition=key) from None
            got = ice.markers(table, self.options.load).get(key)
            if got is None:
                raise TransferError(f"{where}: partition {key}: its snapshot is not in the table after its commit", partition=key)
            return got[0]
        raise TransferError(f"{where}: partition {key}: no commit after 200 tries", partition=key)

    def target_rows(self, plan: SinkPlan) -> int:
        table = self._table(plan)
        if plan.own.branch:
            return sum(rows for rows, _ in ice.markers(table, self.options.load).values())
        snap = table.current_snapshot()
        return int(snap.summary.additional_properties.get("total-records", 0)) if snap and snap.summary else 0

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        try:
            conf, load = self.config, self.options.load
            if plan.load_mode == "truncate":
                icefinal.overwrite(self._table(plan), plan, load, results, conf.where())
            elif plan.load_mode == "merge":
                icefinal.merge(self._table(plan), plan, load, results, conf.where())
            elif plan.load_mode in ("create", "replace"):
                icefinal.rename_in(self.catalog, conf, self._table(plan), plan, self.options, results)
            if plan.own.window is not None:  # the load is visible: the window's end becomes the cursor
                fs, root = self._cursor_root()
                cursors.commit(fs, root, plan.own.window, load, self.options.run_id)
        finally:
            self._stop()

    def abort(self, plan: SinkPlan) -> None:
        try:
            icefinal.discard(self.catalog, self._table(plan) if plan.own.branch else None, plan, self.options.load)
        finally:
            self._stop()

    def _stop(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None

    def leftovers(self, remove: bool) -> list[str]:
        """Stage tables, branches and data files no snapshot refers to, of the target's loads; with ``remove``,
        removed once no load of the table beats (see common.Beat)."""
        return icefinal.leftovers(self.catalog, self.config, remove)

    # --- incremental cursors, kept beside the table (as a file sink keeps them: conveyor/connectors/files/cursors.py)

    def _cursor_root(self, table: Any = None) -> tuple[Any, str]:
        from conveyor.kit import fs as fs_util

        table = table or self.config.load(self.catalog)
        if table is None:
            raise SchemaError(f"{self.config.where()} does not exist")
        return fs_util.filesystem(table.location(), icefinal.storage(table))

    def cursor_state(self, column: str) -> CursorState:
        table = self.config.load(self.catalog)
        if table is None:
            return CursorState()
        fs, root = self._cursor_root(table)
        return cursors.state(fs, root, column, lambda load: len(ice.markers(table, load)))


def _schema_for(arrow: Any, names: list[str]) -> Any:
    import pyarrow as pa

    return pa.schema([arrow.field(n) for n in names])


__all__ = ["IcebergSink", "IcebergSinkConfig"]
