"""The Delta Lake source (``source=delta``): a table at its latest version, or at a version or a time (time
travel); one partition per data file or group of them (``strategy=files``), read through pyarrow's dataset with
the filters and the columns pushed down (files whose partition values or statistics rule a filter out are not read)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.lake.common import failed, secret_values
from conveyor.connectors.lake.deltaops import DeltaConnConfig, arrow_schema, open_table
from conveyor.core import FileEntry, FileSet, JobOptions, Partition, SourceBase, SourceInfo
from conveyor.errors import ConfigError, SchemaError


@dataclass
class DeltaSourceConfig(DeltaConnConfig):
    #: read this version (time travel); or ``as_of``; none: the latest
    version: int | None = None
    #: the version current at this time (ISO 8601)
    as_of: str | None = None
    #: the columns read (pushed down); empty: all
    columns: list[str] = field(default_factory=list)
    #: rows kept, in the DNF form pyarrow and deltalake take: [[column, op, value], ...] (ANDed), or a list of such
    #: lists (ORed); op is one of = != < <= > >= in "not in"
    filters: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.version is not None and self.as_of is not None:
            raise ValueError("set at most one of version and as_of")


class DeltaSource(SourceBase):
    """Rows of a Delta table's version, by data file."""

    config_class = DeltaSourceConfig

    def __init__(self, config: DeltaSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._version: int | None = None
        self._table: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None}

    def table(self) -> Any:
        if self._table is None:
            conf = self.config
            try:
                table = open_table(conf.path, conf.storage())
                if table is None:
                    raise SchemaError(f"{conf.where()} does not exist (no _delta_log)", hint="check source.path and storage_options")
                if self._version is None:
                    if conf.version is not None:
                        table.load_as_version(conf.version)
                    elif conf.as_of is not None:
                        try:
                            when = dt.datetime.fromisoformat(conf.as_of)
                        except ValueError:
                            raise ConfigError(f"source.as_of={conf.as_of!r} is not an ISO 8601 time", key="source.as_of") from None
                        table.load_as_version(when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc))
                    self._version = table.version()
                elif table.version() != self._version:
                    table.load_as_version(self._version)
            except (SchemaError, ConfigError):
                raise
            except Exception as exc:
                raise failed(conf.where(), exc, secret_values(conf.storage_options), hint="check source.version / source.as_of") from None
            self._table = table
        return self._table

    @contextlib.contextmanager
    def session(self) -> Iterator[DeltaSource]:
        self.table()
        self.snapshot_id = str(self._version)
        yield self

    def _dataset(self) -> Any:
        try:
            return self.table().to_pyarrow_dataset()
        except Exception as exc:
            raise failed(f"{self.config.where()} version {self._version}", exc, secret_values(self.config.storage_options),
                         hint="a table with deletion vectors cannot be read here: read it with its own engine") from None

    def _filter(self) -> Any:
        if not self.config.filters:
            return None
        import pyarrow.parquet as pq

        filters = self.config.filters
        try:
            return pq.filters_to_expression([tuple(f) for f in filters] if not isinstance(filters[0][0], (list, tuple))
                                            else [[tuple(f) for f in conj] for conj in filters])
        except (TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"source.filters: {exc}", key="source.filters", hint="e.g. [[l_shipdate, '>=', '1995-01-01']]") from None

    def describe(self) -> SourceInfo:
        import pyarrow as pa

        schema = arrow_schema(self.table().schema())
        if self.config.columns:
            missing = [c for c in self.config.columns if c not in schema.names]
            if missing:
                raise ConfigError(f"source.columns: {', '.join(missing)} is not a column of {self.config.where()}", key="source.columns")
            schema = pa.schema([schema.field(c) for c in self.config.columns])
        files = self.list_files()
        rows = None if self.config.filters else sum(e.rows or 0 for e in files)
        # the files' bytes: what runtime=auto weighs (a small table is read in the driver, not on a Ray instance it would start)
        size = sum(e.size or 0 for e in files)
        return SourceInfo(schema=schema, label=f"{self.config.where()} at version {self._version}", estimated_rows=rows,
                          estimated_bytes=size)

    def list_files(self) -> list[FileEntry]:
        """The version's data files (those the filters do not rule out), with their rows from the log."""
        import pyarrow as pa

        adds = {a["path"]: a for a in pa.table(self.table().get_add_actions(flatten=True)).to_pylist()}
        root = self.table().table_uri.rstrip("/")
        out = []
        for frag in self._dataset().get_fragments(filter=self._filter()):
            rel = _relative(frag.path, root)
            a = adds.get(rel, {})
            out.append(FileEntry(frag.path, a.get("size_bytes"), None if self.config.filters else a.get("num_records")))
        return out

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        entries = {e.path: e.rows for e in self.list_files()}
        if any(r is None for r in entries.values()):
            return None
        return [sum(entries[p] for p in part.paths) if isinstance(part, FileSet) else sum(entries.values()) for part in parts]  # type: ignore[misc]

    def read(self, part: Partition) -> Iterator[Any]:
        import pyarrow.dataset as ds

        dataset = self._dataset()
        frags = list(dataset.get_fragments(filter=self._filter()))
        if isinstance(part, FileSet):
            wanted = set(part.paths)
            frags = [f for f in frags if f.path in wanted]
            if len(frags) != len(wanted):
                raise SchemaError(f"{self.config.where()}: version {self._version} no longer lists the partition's files",
                                  hint="the table was vacuumed during the run: run again")
        if not frags:
            return
        subset = ds.FileSystemDataset(frags, dataset.schema, dataset.format, dataset.filesystem)
        columns = self.config.columns or None
        try:
            yield from subset.to_batches(columns=columns, filter=self._filter(), batch_size=self.options.batch_size)
        except Exception as exc:
            raise failed(f"{self.config.where()}: reading {part.key}", exc, secret_values(self.config.storage_options),
                         partition=part.key) from None


def _relative(path: str, root: str) -> str:
    from urllib.parse import unquote

    root = root.split("://", 1)[-1].rstrip("/")
    path = path.split("://", 1)[-1]
    return unquote(path[len(root) + 1:]) if path.startswith(root) else path


__all__ = ["DeltaSource", "DeltaSourceConfig"]
