"""Delta Lake tables as the source and sink use them (deltalake on delta-rs), and how a staged load is made the
table's content at its end: truncate / create / replace commit the stage's files into the target in one commit,
merge merges the stage's rows into it in one commit; and what ``conveyor clean`` finds."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.lake.common import LOAD, PARTITION, failed, live_runs, secret_values
from conveyor.core import SinkPlan, WriteStats
from conveyor.errors import ConfigError, SchemaError, VerificationError
from conveyor.kit import fs as fs_util
from conveyor.kit.staged import check_taken
from conveyor.log import note, warn

STAGE = "conveyor-stage-"


@dataclass
class DeltaConnConfig:
    #: the table's folder: a local path or s3://bucket/path (a sink's: a template with {table} / {schema} for several tables)
    path: str = ""
    #: delta-rs storage options (AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, ...; credentials: the environment's)
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path: name the table's folder")
        if "://" not in self.path and "{" not in self.path:  # a local folder, absolute where the job is declared (a Ray worker runs elsewhere)
            self.path = os.path.abspath(self.path)

    def where(self) -> str:
        return f"delta table {self.path}"

    def storage(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.storage_options.items()}

    def fsspec_options(self) -> dict[str, Any]:
        """The storage options as fsspec (s3fs) takes them, for the files Conveyor itself reads and removes."""
        s = {k.upper(): v for k, v in self.storage().items()}
        names = (("AWS_ENDPOINT_URL", "endpoint_url"), ("AWS_ACCESS_KEY_ID", "key"), ("AWS_SECRET_ACCESS_KEY", "secret"))
        return {dst: s[src] for src, dst in names if src in s}


def deltalake() -> Any:
    try:
        import deltalake as dl
    except ImportError:
        raise ConfigError("the Delta Lake connector needs deltalake", hint="pip install 'conveyor[delta]'") from None
    return dl


def open_table(path: str, storage: dict[str, str], version: int | None = None) -> Any | None:
    """The table (None where the folder holds none)."""
    dl = deltalake()
    if not dl.DeltaTable.is_deltatable(path, storage):
        return None
    return dl.DeltaTable(path, version=version, storage_options=storage)


def commits_of(table: Any, load: str) -> dict[str, int]:
    """{partition: rows it added} of this load's commits, from the table's history (commitInfo)."""
    out = {}
    for entry in table.history():
        if entry.get(LOAD) == load and PARTITION in entry:
            out[entry[PARTITION]] = int((entry.get("operationMetrics") or {}).get("num_added_rows", 0))
    return out


def arrow_schema(schema: Any) -> Any:
    import pyarrow as pa

    return pa.schema(schema.to_arrow())


def _drop_log(conf: Any, stage: str) -> None:
    fs, base = fs_util.filesystem(f"{stage}/_delta_log", conf.fsspec_options())
    with contextlib.suppress(Exception):
        fs.rm(base, recursive=True)


def swap_in(conf: Any, plan: SinkPlan, load: str, results: Sequence[WriteStats]) -> None:
    """The stage's files become the target's content in one commit (the stage's own log is then removed)."""
    import pyarrow as pa
    from deltalake.transaction import AddAction, create_table_with_add_actions

    dl, where = deltalake(), conf.where()
    stage = open_table(plan.write_target, conf.storage())
    partition_by = plan.own.partition_by
    adds = pa.table(stage.get_add_actions(flatten=True)).to_pylist()
    check_taken(where, sum(int(a["num_records"] or 0) for a in adds), sum(r.rows for r in results))
    prefix = plan.write_target.rsplit("/", 1)[-1]
    actions = [AddAction(path=f"{prefix}/{a['path']}", size=a["size_bytes"], partition_values=_partition_values(a, partition_by),
                         modification_time=_millis(a["modification_time"]), data_change=True,
                         stats=json.dumps({"numRecords": int(a["num_records"] or 0)})) for a in adds]
    props = dl.CommitProperties(custom_metadata={LOAD: load, "conveyor.operation": plan.load_mode})
    target = open_table(conf.path, conf.storage())
    try:
        if target is None:
            create_table_with_add_actions(conf.path, stage.schema(), actions, mode="error", partition_by=partition_by or None,
                                          configuration={str(k): str(v) for k, v in conf.configuration.items()} or None,
                                          storage_options=conf.storage(), commit_properties=props)
        elif plan.load_mode == "create":
            raise SchemaError(f"{where} was created by someone else during the load", hint="use load_mode=replace")
        else:
            target.create_write_transaction(actions, mode="overwrite", schema=stage.schema(), partition_by=partition_by or None,
                                            commit_properties=props)
    except SchemaError:
        raise
    except Exception as exc:
        raise failed(f"{where}: making the load the table's content", exc, secret_values(conf.storage_options)) from None
    _drop_log(conf, plan.write_target)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def merge(conf: Any, plan: SinkPlan, load: str, results: Sequence[WriteStats]) -> None:
    """The stage's rows merged into the target by the keys in one commit (Delta's MERGE): a matched row takes the
    update columns, a new one is inserted, and rows the source lacks are deleted or marked where asked. What it
    did is read from the commit's own metrics: every staged row must have matched or been inserted."""
    import duckdb

    from conveyor.kit import merge as merging

    dl, where, spec = deltalake(), conf.where(), plan.own.merge
    stage = open_table(plan.write_target, conf.storage())
    dataset = stage.to_pyarrow_dataset()
    staged = dataset.count_rows()
    check_taken(where, staged, sum(r.rows for r in results))
    con = duckdb.connect()
    try:
        con.register("staged", dataset.to_table(columns=list(spec.keys)))
        merging.check_keys(con, spec, "staged", where, lambda c: '"' + c.replace('"', '""') + '"')
    finally:
        con.close()
    target = open_table(conf.path, conf.storage())
    props = dl.CommitProperties(custom_metadata={LOAD: load, "conveyor.operation": "merge"})
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in spec.keys)
    try:
        merger = target.merge(source=dataset.scanner().to_reader(), predicate=on, source_alias="s", target_alias="t",
                              commit_properties=props)
        sets = {_q(c): f"s.{_q(c)}" for c in spec.update}
        if spec.soft_column:
            sets[_q(spec.soft_column)] = "false"
        merger = merger.when_matched_update(updates=sets) if sets else merger
        inserts = {_q(c): f"s.{_q(c)}" for c in spec.columns} | ({_q(spec.soft_column): "false"} if spec.soft_column else {})
        merger = merger.when_not_matched_insert(updates=inserts)
        if spec.delete == "hard":
            merger = merger.when_not_matched_by_source_delete()
        elif spec.delete == "soft":
            merger = merger.when_not_matched_by_source_update(updates={_q(spec.soft_column): "true"})
        metrics = merger.execute()
    except Exception as exc:
        raise failed(f"load_mode=merge into {where}", exc, secret_values(conf.storage_options)) from None
    inserted, updated = int(metrics.get("num_target_rows_inserted", 0)), int(metrics.get("num_target_rows_updated", 0))
    if int(metrics.get("num_source_rows", staged)) != staged or inserted + updated != staged:
        raise VerificationError(f"verification failed for {where}: the merge's commit says it read {metrics.get('num_source_rows')} "
                                f"staged rows and inserted {inserted:,} and updated {updated:,}, of {staged:,}",
                                hint="the commit is in the table's history: check the table")
    deleted = int(metrics.get("num_target_rows_deleted", 0))
    note(f"{where}: merge: {inserted:,} rows inserted, {updated:,} updated" + (f", {deleted:,} deleted" if deleted else "")
         + " (the commit's own metrics)")
    fs, base = fs_util.filesystem(plan.write_target, conf.fsspec_options())
    with contextlib.suppress(Exception):
        fs.rm(base, recursive=True)  # the merge wrote its own files: the stage's are no longer needed


def leftovers(conf: Any, remove: bool) -> list[str]:
    """Stage tables of loads that did not finish, and data files no version of the log refers to (a killed task's);
    with ``remove``, removed once no load of the table beats (see common.Beat)."""
    fs, base = fs_util.filesystem(conf.path, conf.fsspec_options())
    found = []
    with contextlib.suppress(FileNotFoundError, OSError):
        for p in fs.ls(base, detail=False):
            name = p.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(STAGE) and fs.exists(f"{p}/_delta_log"):
                found.append((f"stage table {fs_util.display(fs, p)}", p, True))
    table = open_table(conf.path, conf.storage())
    if table is not None:
        used = every_file(table, conf.storage())
        root = base.rstrip("/")
        for p in fs.find(base):
            rel = p[len(root) + 1:]
            if rel.endswith(".parquet") and not rel.startswith(("_delta_log", STAGE)) and rel not in used:
                found.append((f"data file {fs_util.display(fs, p)} (no version of the log refers to it)", p, False))
    if not remove:
        return [what for what, _, _ in found]
    live = live_runs(conf.path, conf.fsspec_options())
    if live:
        warn(f"{conf.where()}: run(s) {', '.join(live)} still write to it: nothing removed")
        return [f"kept (in use) {what}" for what, _, _ in found]
    for _, p, folder in found:
        with contextlib.suppress(Exception):
            fs.rm(p, recursive=folder)
    return [f"removed {what}" for what, _, _ in found]


def every_file(table: Any, storage: dict[str, str]) -> set[str]:
    """Every data file (relative path) any version still in the log adds."""
    import pyarrow as pa

    out: set[str] = set()
    current = table.version()
    oldest = min((h.get("version", current) for h in table.history()), default=current)
    for v in range(oldest, current + 1):
        with contextlib.suppress(Exception):
            t = deltalake().DeltaTable(table.table_uri, version=v, storage_options=storage)
            out.update(pa.table(t.get_add_actions(flatten=True)).column("path").to_pylist())
    return out


def _millis(value: Any) -> int:
    return value if isinstance(value, int) else int(value.timestamp() * 1000)


def _partition_values(action: dict[str, Any], columns: list[str]) -> dict[str, str | None]:
    out = {}
    for c in columns:
        v = action.get(f"partition.{c}")
        out[c] = None if v is None else (v.isoformat() if hasattr(v, "isoformat") else str(v))
    return out


__all__ = ["DeltaConnConfig", "deltalake", "open_table", "commits_of", "arrow_schema", "swap_in", "merge", "leftovers", "STAGE"]
