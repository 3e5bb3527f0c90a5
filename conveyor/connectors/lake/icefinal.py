"""How an Iceberg load is made the table's content at its end, or discarded: truncate's branch becomes main's
content in one snapshot, merge's branch is upserted into main in one snapshot, create/replace's stage table is
renamed in; and what ``conveyor clean`` finds (stage tables, branches, data files no snapshot refers to)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from conveyor.connectors.lake import icecommon as ice
from conveyor.connectors.lake.common import LOAD, failed, live_runs
from conveyor.core import SinkPlan, WriteStats
from conveyor.errors import SchemaError, TransferError, VerificationError
from conveyor.kit.staged import check_taken
from conveyor.log import note, warn

STAGE = "__conveyor_"
BRANCH = "conveyor-"


def _staged_files(table: Any, load: str) -> list[Any]:
    marks = ice.markers(table, load)
    return ice.added_files(table, {sid for _, sid in marks.values()})


def _commit(table: Any, build: Any, where: str) -> Any:
    """``build(table)`` makes a transaction on the table as it is now; committed, retried after a conflict on
    the table read again (bounded)."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(50):
        txn, result = build(table)
        try:
            txn.commit_transaction()
            return result
        except CommitFailedException:
            time.sleep(0.1 * (attempt + 1))
            table = ice.no_retry(table.refresh())
    raise TransferError(f"{where}: the load's last snapshot kept meeting other commits", hint="run again")


def _drop_branch(table: Any, branch: str) -> None:
    with contextlib.suppress(Exception):
        table.refresh().manage_snapshots().remove_branch(branch).commit()


def overwrite(table: Any, plan: SinkPlan, load: str, results: Sequence[WriteStats], where: str) -> None:
    """The branch's files become main's whole content in one snapshot (main's files deleted in it)."""
    files = _staged_files(table, load)
    check_taken(where, sum(f.record_count for f in files), sum(r.rows for r in results))

    def build(t: Any) -> tuple[Any, None]:
        txn = t.transaction()
        with txn.update_snapshot(snapshot_properties={LOAD: load}).overwrite() as ow:
            for task in (t.scan().plan_files() if t.current_snapshot() else []):
                ow.delete_data_file(task.file)
            for f in files:
                ow.append_data_file(f)
        return txn, None

    _commit(table, build, where)
    _drop_branch(table, plan.own.branch)


def merge(table: Any, plan: SinkPlan, load: str, results: Sequence[WriteStats], where: str) -> None:
    """The branch's rows upserted into main by the keys, in one snapshot (pyiceberg's upsert: a matched row that
    differs is rewritten, a new one inserted). The rows it stored are read back from the snapshots' summaries."""
    import duckdb
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    from conveyor.kit import merge as merging

    files = _staged_files(table, load)
    staged = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([FileScanTask(f) for f in files])
    check_taken(where, staged.num_rows, sum(r.rows for r in results))
    keys = plan.own.merge.keys
    con = duckdb.connect()
    try:
        con.register("staged", staged.select(list(keys)))
        merging.check_keys(con, plan.own.merge, "staged", where, lambda c: '"' + c.replace('"', '""') + '"')
    finally:
        con.close()
    staged = staged.cast(pa.schema([f.remove_metadata() for f in table.schema().as_arrow()]))

    def total(t: Any) -> int:
        snap = t.current_snapshot()
        return int(snap.summary.additional_properties.get("total-records", 0)) if snap and snap.summary else 0

    before = {}

    def build(t: Any) -> tuple[Any, Any]:
        before["rows"] = total(t)
        txn = t.transaction()
        got = txn.upsert(staged, join_cols=list(keys), snapshot_properties={LOAD: load}) if staged.num_rows else None
        return txn, got

    try:
        result = _commit(table, build, where)
    except (SchemaError, TransferError):
        raise
    except Exception as exc:
        raise failed(f"load_mode=merge into {where}", exc) from None
    _drop_branch(table, plan.own.branch)
    inserted = result.rows_inserted if result else 0
    updated = result.rows_updated if result else 0
    grown = total(table.refresh()) - before["rows"]
    if grown != inserted:
        raise VerificationError(f"verification failed for {where}: the merge inserted {inserted:,} rows and the table grew by {grown:,}",
                                hint="another writer changed the table during the merge: check it")
    note(f"{where}: merge: {inserted:,} rows inserted, {updated:,} updated, {staged.num_rows - inserted - updated:,} unchanged "
         "(read back from the table's snapshot summaries)")


def rename_in(catalog: Any, conf: Any, stage: Any, plan: SinkPlan, options: Any, results: Sequence[WriteStats]) -> None:
    """create: the stage table renamed to the target; replace: the old table set aside, the stage renamed in, the
    old one dropped with its files (two catalog operations: a reader between them finds no table)."""
    where = conf.where()
    snap = stage.current_snapshot()
    held = int(snap.summary.additional_properties.get("total-records", 0)) if snap and snap.summary else 0
    check_taken(where, held, sum(r.rows for r in results))
    old = conf.load(catalog)
    if old is not None and plan.load_mode == "create":
        raise SchemaError(f"{where} was created by someone else during the load", hint="use load_mode=replace")
    ns, name = conf.identifier
    try:
        if old is not None:
            aside = f"{ns}.{name}{STAGE}old_{options.run_id}"
            catalog.rename_table(conf.table, aside)
            catalog.rename_table(plan.own.table, conf.table)
            with contextlib.suppress(Exception):
                catalog.purge_table(aside)
        else:
            catalog.rename_table(plan.own.table, conf.table)
    except Exception as exc:
        raise failed(f"{where}: renaming the stage in", exc, conf.secrets()) from None


def discard(catalog: Any, table: Any | None, plan: SinkPlan, load: str) -> None:
    """A failed load: its branch and the files on it, or its stage table with its files, are removed."""
    with contextlib.suppress(Exception):
        if table is not None:
            current = {t.file.file_path for t in table.scan().plan_files()} if table.current_snapshot() else set()
            paths = [f.file_path for f in _staged_files(table, load) if f.file_path not in current]  # (main's own stay)
            if plan.own.branch in table.metadata.refs:
                table.manage_snapshots().remove_branch(plan.own.branch).commit()
            ice.delete_quietly(table.io, paths)
        elif plan.load_mode in ("create", "replace"):
            catalog.purge_table(plan.own.table)


def leftovers(catalog: Any, conf: Any, remove: bool) -> list[str]:
    ns, name = conf.identifier
    table = conf.load(catalog)
    found: list[tuple[str, str, str]] = []
    for ident in catalog.list_tables(ns):
        if ident[-1].startswith(f"{name}{STAGE}"):
            found.append((f"stage table {ns}.{ident[-1]}", "table", f"{ns}.{ident[-1]}"))
    if table is not None:
        found += [(f"branch {ref} of {conf.table}", "branch", ref) for ref in table.metadata.refs if ref.startswith(BRANCH)]
        found += [(f"data file {p} (no snapshot refers to it)", "file", p) for p in orphans(table)]
    if not remove:
        return [what for what, _, _ in found]
    live = live_runs(table.location(), storage(table)) if table is not None else []
    if live:
        warn(f"{conf.where()}: run(s) {', '.join(live)} still write to it: nothing removed")
        return [f"kept (in use) {what}" for what, _, _ in found]
    for _, kind, item in found:
        with contextlib.suppress(Exception):
            if kind == "table":
                catalog.purge_table(item)
            elif kind == "branch":
                paths = [f.file_path for f in ice.added_files(table, _branch_snapshots(table, item))]
                table.manage_snapshots().remove_branch(item).commit()
                table = table.refresh()
                ice.delete_quietly(table.io, [p for p in paths if p not in ice.referenced(table)])
            else:
                table.io.delete(item)
    return [f"removed {what}" for what, _, _ in found]


def _branch_snapshots(table: Any, branch: str) -> set[int]:
    """The snapshots on a branch back to where it meets main's history."""
    main = set()
    snap = table.current_snapshot()
    while snap is not None:
        main.add(snap.snapshot_id)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    out = set()
    ref = table.metadata.refs.get(branch)
    snap = table.snapshot_by_id(ref.snapshot_id) if ref else None
    while snap is not None and snap.snapshot_id not in main:
        out.add(snap.snapshot_id)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return out


def orphans(table: Any) -> list[str]:
    """Data files under the table's data folder that no snapshot refers to (a killed task's)."""
    from conveyor.kit import fs as fs_util

    data = table.metadata.properties.get("write.data.path", f"{table.location().rstrip('/')}/data")
    fs, base = fs_util.filesystem(data, storage(table))
    try:
        paths = [p for p in fs.find(base) if p.endswith(".parquet")]
    except (FileNotFoundError, OSError):
        return []
    used = {fs._strip_protocol(p) for p in ice.referenced(table)}
    return [fs_util.display(fs, p) for p in paths if p not in used]


def storage(table: Any) -> dict[str, Any]:
    """fsspec options for the table's storage, from the FileIO's properties (s3.endpoint, s3.access-key-id, ...)."""
    props = getattr(table.io, "properties", {}) or {}
    out: dict[str, Any] = {}
    for src, dst in (("s3.endpoint", "endpoint_url"), ("s3.access-key-id", "key"), ("s3.secret-access-key", "secret")):
        if props.get(src):
            out[dst] = props[src]
    return out


__all__ = ["overwrite", "merge", "rename_in", "discard", "leftovers", "orphans", "storage"]
