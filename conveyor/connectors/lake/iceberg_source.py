"""The Iceberg source (``source=iceberg``): a table at its current snapshot, or at a snapshot, a branch or tag, or
a time (time travel); one partition per data file or group of them (``strategy=files``), read with the
snapshot's delete files applied, the row filter and the columns pushed down to the scan."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.lake import icecommon as ice
from conveyor.connectors.lake.common import failed
from conveyor.core import FileEntry, FileSet, JobOptions, Partition, SourceBase, SourceInfo
from conveyor.errors import ConfigError, SchemaError


@dataclass
class IcebergSourceConfig(ice.IcebergConnConfig):
    #: read this snapshot (time travel); or ``ref`` / ``as_of``; none: the current snapshot
    snapshot_id: int | None = None
    #: a branch or tag
    ref: str | None = None
    #: the snapshot current at this time (ISO 8601, e.g. 2026-11-27T12:00:00+00:00)
    as_of: str | None = None
    #: the columns read (pushed down: other columns are not read from the files); empty: all
    columns: list[str] = field(default_factory=list)
    #: a row filter in pyiceberg's syntax, e.g. "l_shipdate >= '1995-01-01' and l_quantity < 10": files whose
    #: statistics rule it out are not read
    row_filter: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if sum(x is not None for x in (self.snapshot_id, self.ref, self.as_of)) > 1:
            raise ValueError("set at most one of snapshot_id, ref and as_of")


class IcebergSource(SourceBase):
    """Rows of an Iceberg table's snapshot, by data file."""

    config_class = IcebergSourceConfig

    def __init__(self, config: IcebergSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._snapshot: int | None = None
        self._table: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None, "_catalog": None} if "_catalog" in self.__dict__ else {**self.__dict__, "_table": None}

    def table(self) -> Any:
        if self._table is None:
            table = self.config.load(self.config.load_catalog())
            if table is None:
                raise SchemaError(f"{self.config.where()} does not exist", hint="check source.table and source.catalog")
            self._table = table
        return self._table

    def _pick_snapshot(self) -> int | None:
        conf, table = self.config, self.table()
        if conf.snapshot_id is not None:
            if table.snapshot_by_id(conf.snapshot_id) is None:
                raise ConfigError(f"{conf.where()} has no snapshot {conf.snapshot_id}", key="source.snapshot_id",
                                  hint="its snapshots: " + ", ".join(str(s.snapshot_id) for s in table.metadata.snapshots[-5:]))
            return conf.snapshot_id
        if conf.ref is not None:
            ref = table.metadata.refs.get(conf.ref)
            if ref is None:
                raise ConfigError(f"{conf.where()} has no branch or tag {conf.ref}", key="source.ref",
                                  hint="its refs: " + ", ".join(table.metadata.refs))
            return ref.snapshot_id
        if conf.as_of is not None:
            try:
                when = dt.datetime.fromisoformat(conf.as_of)
            except ValueError:
                raise ConfigError(f"source.as_of={conf.as_of!r} is not an ISO 8601 time", key="source.as_of") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.timezone.utc)
            ms = int(when.timestamp() * 1000)
            before = [s for s in table.metadata.snapshot_log if s.timestamp_ms <= ms]
            if not before:
                raise ConfigError(f"{conf.where()} has no snapshot at or before {conf.as_of}", key="source.as_of")
            return before[-1].snapshot_id
        snap = table.current_snapshot()
        return snap.snapshot_id if snap else None

    @contextlib.contextmanager
    def session(self) -> Iterator[IcebergSource]:
        if self._snapshot is None:
            self._snapshot = self._pick_snapshot()
        self.snapshot_id = None if self._snapshot is None else str(self._snapshot)
        yield self

    def _scan(self) -> Any:
        if self._snapshot is None:
            self._snapshot = self._pick_snapshot()
        conf = self.config
        kwargs: dict[str, Any] = {"snapshot_id": self._snapshot}
        if conf.columns:
            kwargs["selected_fields"] = tuple(conf.columns)
        if conf.row_filter:
            kwargs["row_filter"] = conf.row_filter
        try:
            return self.table().scan(**kwargs)
        except Exception as exc:
            raise failed(f"{conf.where()}: source.row_filter / source.columns", exc, conf.secrets(),
                         hint="columns must be the table's; row_filter in pyiceberg's syntax: \"a > 1 and b = 'x'\"") from None

    def describe(self) -> SourceInfo:
        schema = _schema(self._scan(), self.config)
        snap = self.table().snapshot_by_id(self._snapshot) if self._snapshot is not None else None
        summary = snap.summary.additional_properties if snap and snap.summary else {}
        rows = int(summary.get("total-records", 0))
        at = f" at snapshot {self._snapshot}" if self._snapshot is not None else " (no snapshot: empty)"
        # the data files' bytes: what runtime=auto weighs (a small table is read in the driver, not on a Ray instance it would start)
        return SourceInfo(schema=schema, label=f"{self.config.where()}{at}", estimated_rows=None if self.config.row_filter else rows,
                          estimated_bytes=int(summary.get("total-files-size", 0)))

    def _tasks(self, scan: Any = None) -> list[Any]:
        if self._snapshot is None:
            return []
        try:
            return list((scan or self._scan()).plan_files())
        except Exception as exc:
            raise failed(f"{self.config.where()}: planning the scan", exc, self.config.secrets()) from None

    def list_files(self) -> list[FileEntry]:
        """The snapshot's data files the filter does not rule out, with their rows (None where delete files apply)."""
        return [FileEntry(t.file.file_path, t.file.file_size_in_bytes,
                          None if (t.delete_files or self.config.row_filter) else t.file.record_count) for t in self._tasks()]

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        """From the data files' own counts, where no delete file and no filter applies (else None: counted by reading)."""
        entries = {e.path: e.rows for e in self.list_files()}
        if any(r is None for r in entries.values()):
            return None
        return [sum(entries[p] for p in part.paths) if isinstance(part, FileSet) else sum(entries.values()) for part in parts]  # type: ignore[misc]

    def read(self, part: Partition) -> Iterator[Any]:
        from pyiceberg.io.pyarrow import ArrowScan

        scan = self._scan()
        tasks = self._tasks(scan)
        if isinstance(part, FileSet):
            wanted = set(part.paths)
            tasks = [t for t in tasks if t.file.file_path in wanted]
            if len(tasks) != len(wanted):
                raise SchemaError(f"{self.config.where()}: snapshot {self._snapshot} no longer lists the partition's files",
                                  hint="the table's snapshot was expired during the run: run again")
        if not tasks:
            return
        table = self.table()
        arrow = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
        schema = _schema(scan, self.config)
        try:
            for batch in arrow.to_record_batches(tasks):
                yield batch.cast(schema) if not batch.schema.equals(schema, check_metadata=False) else batch
        except Exception as exc:
            raise failed(f"{self.config.where()}: reading {part.key}", exc, self.config.secrets(), partition=part.key) from None


def _schema(scan: Any, conf: IcebergSourceConfig) -> Any:
    """The Arrow schema of a scan's columns (without the field ids), the one every batch is read as."""
    import pyarrow as pa

    try:
        return pa.schema([pa.field(f.name, f.type, f.nullable) for f in scan.projection().as_arrow()])
    except Exception as exc:
        raise failed(f"{conf.where()}: source.columns", exc, conf.secrets()) from None


__all__ = ["IcebergSource", "IcebergSourceConfig"]
