"""The Iceberg sink (``sink=iceberg``): each task writes its partition's data files and commits them as one snapshot
carrying the partition's marker; truncate collects them on a branch and create/replace in a stage table, made the
target's in one commit at the end. See docs/iceberg.md."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.lake import icecommon as ice
from conveyor.connectors.lake.common import LOAD, PARTITION, Beat, Counted, failed, live_runs
from conveyor.connectors.lake.types import conform, written_schema, written_type
from conveyor.core import (
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
    target_for,
)
from conveyor.errors import SchemaError, TransferError
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.staged import check_mode, check_taken
from conveyor.log import warn

STAGE = "__conveyor_"
BRANCH = "conveyor-"
#: a chunk of a partitioned table's rows written at once (pyiceberg splits a table, not a stream, by partition)
CHUNK_BYTES = 256 << 20


@dataclass
class IcebergSinkConfig(ice.IcebergConnConfig):
    #: create / replace: the partition spec, e.g. [day(l_shipdate)], [bucket(16, id)], [region]
    partition_by: list[str] = field(default_factory=list)
    #: create / replace: table properties (write.parquet.compression-codec, format-version, ...)
    properties: dict[str, Any] = field(default_factory=dict)
    #: source columns whose values may change type by Arrow's safe cast (the cast policy's overrides)
    allow_cast: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IcePlan:
    #: the table partitions commit into (the target, or the stage of a create / replace) and the branch (truncate)
    table: str
    branch: str | None
    schema: Any


class IcebergSink(SinkBase):
    """Data files written by the tasks, committed with a marker per partition (append) or in one snapshot at the end."""

    config_class = IcebergSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace"))

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
                "truncate": f"{how} onto a branch, made the table's content in one snapshot at the end"}.get(
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
            table, branch = conf.table, (f"{BRANCH}{self.options.load}" if mode == "truncate" else None)
            stage = existing
        self._beat = Beat(stage.location(), self.options.run_id, _storage(stage))
        target_schema = _schema_for(arrow, [t for _, t in pairs])
        return SinkPlan(target=where, write_target=table if branch is None else f"{table}@{branch}", load_mode=mode,
                        columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        rows_before=None if mode == "append" else 0, checks_before_commit=mode == "append",
                        own=IcePlan(table, branch, target_schema))

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
        names = own.schema.names
        sent = Counted(batches, lambda b: conform(b.select(list(plan.source_columns)), own.schema, where), None)
        files: list[Any] = []
        try:
            files = self._write_files(table, own.schema, sent, names)
            stored = sum(f.record_count for f in files)  # each file's count, from its own footer as written
            check_stored(where, key, sent.rows, stored)
            check_partition_rows(where, key, plan.expecting, stored)
            committed = self._commit(table, plan, key, files, stored)
        except BaseException:
            ice.delete_quietly(table.io, [f.file_path for f in files])
            raise
        if committed is None:  # another attempt of this partition committed first: its rows are there once
            ice.delete_quietly(table.io, [f.file_path for f in files])
            done = ice.markers(self._table(plan), self.options.load)[key]
            return WriteStats(key, done[0], 0, time.perf_counter() - start, already_committed=True)
        return WriteStats(key, committed, sent.bytes, time.perf_counter() - start)

    def _write_files(self, table: Any, schema: Any, sent: Counted, names: list[str]) -> list[Any]:
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        write_uuid = uuid.uuid4()
        try:
            if table.metadata.spec().is_unpartitioned():
                reader = pa.RecordBatchReader.from_batches(schema, iter(sent))
                return list(_dataframe_to_data_files(table.metadata, reader, table.io, write_uuid=write_uuid))
            files: list[Any] = []
            chunk: list[Any] = []
            counter = __import__("itertools").count(0)
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

    def _commit(self, table: Any, plan: SinkPlan, key: str, files: list[Any], rows: int) -> int | None:
        """Commit the files as one snapshot with the partition's marker, unless the marker is there already
        (None); pyiceberg's own retry is off (``no_retry``): after a conflict the table is read again and the
        marker looked for first. Returns the rows the snapshot added, as its summary says."""
        from pyiceberg.exceptions import CommitFailedException

        props = {LOAD: self.options.load, PARTITION: key}
        deadline = time.monotonic() + 300
        for attempt in range(200):
            if key in ice.markers(table, self.options.load):
                return None
            txn = table.transaction()
            with txn.update_snapshot(snapshot_properties=props, branch=plan.own.branch or "main").fast_append() as append:
                for f in files:
                    append.append_data_file(f)
            try:
                txn.commit_transaction()
            except CommitFailedException:
                if time.monotonic() > deadline:
                    raise TransferError(f"{self.config.where()}: partition {key}: its commit kept meeting other commits for 300 s",
                                        partition=key, hint="run again with resume (it is not committed)") from None
                time.sleep(min(2.0, 0.05 * (attempt + 1)) * (1 + random.random()))
                table = ice.no_retry(table.refresh())
                continue
            except Exception as exc:
                raise failed(f"{self.config.where()}: committing partition {key}", exc, self.config.secrets(), partition=key) from None
            got = ice.markers(table, self.options.load).get(key)
            if got is None:
                raise TransferError(f"{self.config.where()}: partition {key}: its snapshot is not in the table after its commit",
                                    partition=key)
            check_stored(self.config.where(), key, rows, got[0])
            return got[0]
        raise TransferError(f"{self.config.where()}: partition {key}: no commit after 200 tries", partition=key)

    def target_rows(self, plan: SinkPlan) -> int:
        table = self._table(plan)
        if plan.own.branch:
            return sum(rows for rows, _ in ice.markers(table, self.options.load).values())
        snap = table.current_snapshot()
        return int(snap.summary.additional_properties.get("total-records", 0)) if snap and snap.summary else 0

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        try:
            if plan.load_mode == "truncate":
                self._overwrite(plan, results)
            elif plan.load_mode in ("create", "replace"):
                self._rename_in(plan, results)
        finally:
            self._stop()

    def _overwrite(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        """The branch's files become main's whole content in one snapshot (main's files deleted in it)."""
        from pyiceberg.exceptions import CommitFailedException

        table = self._table(plan)
        marks = ice.markers(table, self.options.load)
        files = ice.added_files(table, {sid for _, sid in marks.values()})
        check_taken(self.config.where(), sum(f.record_count for f in files), sum(r.rows for r in results))
        for attempt in range(50):
            txn = table.transaction()
            with txn.update_snapshot(snapshot_properties={LOAD: self.options.load}).overwrite() as ow:
                for task in (table.scan().plan_files() if table.current_snapshot() else []):
                    ow.delete_data_file(task.file)
                for f in files:
                    ow.append_data_file(f)
            try:
                txn.commit_transaction()
                break
            except CommitFailedException:
                time.sleep(0.1 * (attempt + 1))
                table = ice.no_retry(table.refresh())
        else:
            raise TransferError(f"{self.config.where()}: the truncate's snapshot kept meeting other commits", hint="run again")
        with contextlib.suppress(Exception):
            table.refresh().manage_snapshots().remove_branch(plan.own.branch).commit()

    def _rename_in(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        conf, where = self.config, self.config.where()
        stage = self._table(plan)
        held = int(stage.current_snapshot().summary.additional_properties.get("total-records", 0)) if stage.current_snapshot() else 0
        check_taken(where, held, sum(r.rows for r in results))
        old = conf.load(self.catalog)
        if old is not None and plan.load_mode == "create":
            raise SchemaError(f"{where} was created by someone else during the load", hint="use load_mode=replace")
        ns, name = conf.identifier
        try:
            if old is not None:  # replace: the old table aside, the stage in, the old one dropped with its files
                aside = f"{ns}.{name}{STAGE}old_{self.options.run_id}"
                self.catalog.rename_table(conf.table, aside)
                self.catalog.rename_table(plan.own.table, conf.table)
                with contextlib.suppress(Exception):
                    self.catalog.purge_table(aside)
            else:
                self.catalog.rename_table(plan.own.table, conf.table)
        except Exception as exc:
            raise failed(f"{where}: renaming the stage in", exc, conf.secrets()) from None

    def abort(self, plan: SinkPlan) -> None:
        try:
            with contextlib.suppress(Exception):
                if plan.load_mode == "truncate":
                    table = self._table(plan)
                    marks = ice.markers(table, self.options.load)
                    paths = [f.file_path for f in ice.added_files(table, {sid for _, sid in marks.values()})]
                    table.manage_snapshots().remove_branch(plan.own.branch).commit()
                    ice.delete_quietly(table.io, paths)
                elif plan.load_mode in ("create", "replace"):
                    self.catalog.purge_table(plan.own.table)
        finally:
            self._stop()

    def _stop(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None

    def leftovers(self, remove: bool) -> list[str]:
        """Stage tables, branches and data files no snapshot refers to, of the target's loads; with ``remove``,
        removed once no load of the table beats (see common.Beat)."""
        conf = self.config
        ns, name = conf.identifier
        table = conf.load(self.catalog)
        found: list[tuple[str, Any]] = []
        for ident in self.catalog.list_tables(ns):
            if ident[-1].startswith(f"{name}{STAGE}"):
                found.append((f"stage table {ns}.{ident[-1]}", ("table", f"{ns}.{ident[-1]}")))
        if table is not None:
            for ref in table.metadata.refs:
                if ref.startswith(BRANCH):
                    found.append((f"branch {ref} of {conf.table}", ("branch", ref)))
            found += [(f"data file {p} (no snapshot refers to it)", ("file", p)) for p in _orphans(table)]
        live = live_runs(table.location(), _storage(table)) if table is not None else []
        if not remove:
            return [what for what, _ in found]
        if live:
            warn(f"{conf.where()}: run(s) {', '.join(live)} still write to it: nothing removed")
            return [f"kept (in use) {what}" for what, _ in found]
        for _, (kind, name_) in found:
            with contextlib.suppress(Exception):
                if kind == "table":
                    self.catalog.purge_table(name_)
                elif kind == "branch":
                    table.manage_snapshots().remove_branch(name_).commit()
                    table = table.refresh()
                else:
                    table.io.delete(name_)
        return [f"removed {what}" for what, _ in found]


def _orphans(table: Any) -> list[str]:
    """Data files under the table's data folder that no snapshot refers to (a killed task's)."""
    from conveyor.kit import fs as fs_util

    data = table.metadata.properties.get("write.data.path", f"{table.location().rstrip('/')}/data")
    fs, base = fs_util.filesystem(data, _storage(table))
    try:
        paths = [p for p in fs.find(base) if p.endswith(".parquet")]
    except (FileNotFoundError, OSError):
        return []
    used = {fs_util.filesystem(p, _storage(table))[1] for p in ice.referenced(table)}
    return [fs_util.display(fs, p) for p in paths if p not in used]


def _storage(table: Any) -> dict[str, Any]:
    """fsspec options for the table's storage, from the FileIO's properties (s3.endpoint, s3.access-key-id, ...)."""
    props = getattr(table.io, "properties", {}) or {}
    out: dict[str, Any] = {}
    if props.get("s3.endpoint"):
        out["endpoint_url"] = props["s3.endpoint"]
    if props.get("s3.access-key-id"):
        out["key"] = props["s3.access-key-id"]
    if props.get("s3.secret-access-key"):
        out["secret"] = props["s3.secret-access-key"]
    return out


def _schema_for(arrow: Any, names: list[str]) -> Any:
    import pyarrow as pa

    return pa.schema([arrow.field(n) for n in names])


__all__ = ["IcebergSink", "IcebergSinkConfig"]
