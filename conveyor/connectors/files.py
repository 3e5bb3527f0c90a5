"""Parquet and CSV files on any fsspec filesystem: sources and sinks.

A source ``path`` is a file, a folder (every file in it with the format's extension) or a
glob. Sinks write one file per partition into a folder, each under a temporary name first
and renamed when whole, so a failed partition leaves no file behind. ``truncate``,
``replace`` and ``create`` write into a staging folder that replaces the folder's files
only when every partition succeeded.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.arrowutil import CountingBatches, cast_batches, rebatch, same_columns, without_views
from conveyor.connectors import fs as fs_util
from conveyor.core import (
    FileEntry,
    FileSet,
    JobOptions,
    Partition,
    PrepareRequest,
    RowGroupSet,
    SinkPlan,
    SourceInfo,
    WholeSource,
    WriteStats,
)
from conveyor.errors import ConfigError, ConveyorError, PlanningError, SchemaError, TransferError, first_line
from conveyor.log import warn

_GLOB_CHARS = ("*", "?", "[")


@dataclass
class FileSourceConfig:
    #: a file, a folder or a glob; any fsspec URL (local path, s3://bucket/key, memory://...)
    path: str = "???"
    #: passed to the fsspec filesystem (credentials belong in the environment)
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class CsvSourceConfig(FileSourceConfig):
    delimiter: str = ","
    header: bool = True
    quote_char: str = '"'


def _filesystem(path: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    return fs_util.filesystem(path, storage_options)


class _FileSource:
    """Shared listing and planning for file sources; subclasses read one file's batches."""

    config_class: type = FileSourceConfig
    extensions: tuple[str, ...] = ()
    format_name = "file"

    def __init__(self, config: FileSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._entries: list[FileEntry] | None = None
        self._schema: Any = None
        self._fs_obj: Any = None
        self._hive_fields: list[Any] = []  # columns held in folder names (key=value), after the files' own
        self._hive: dict[str, dict[str, Any]] = {}  # file -> its values of those columns

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_entries"] = None  # workers get their files from the partition
        state["_fs_obj"] = None  # each process builds its own filesystem
        return state

    def list_files(self) -> list[FileEntry]:
        if self._entries is None:
            self._entries = self._list()
        return self._entries

    def _fs(self) -> Any:
        """This process's filesystem object (built once per process, never pickled)."""
        if self._fs_obj is None:
            self._fs_obj = _filesystem(self.config.path, self.config.storage_options)[0]
        return self._fs_obj

    def _list(self) -> list[FileEntry]:
        fs, root = _filesystem(self.config.path, self.config.storage_options)
        self._fs_obj = fs
        where = f"source.path {self.config.path!r}"
        try:
            if any(c in root for c in _GLOB_CHARS):
                found = sorted(p for p in fs.glob(root) if not fs.isdir(p))
                if not found:
                    self._check_bucket(fs, root, where)
                    raise ConfigError(f"{where}: the glob matches no files", key="source.path", hint="check the pattern")
            elif fs.isdir(root):
                found = sorted(p for p in fs.find(root) if p.endswith(self.extensions))
                if not found:
                    exts = "/".join(self.extensions)
                    raise ConfigError(f"{where}: the folder holds no {exts} files", key="source.path")
            elif fs.exists(root):
                found = [root]
            else:
                self._check_bucket(fs, root, where)
                raise ConfigError(f"{where}: no such file or folder", key="source.path", hint="check the path")
            sizes = {p: fs.size(p) for p in found} if len(found) <= 10000 else {}
        except Exception as exc:
            raise fs_util.translate(exc, where) from None
        return [FileEntry(path=fs_util.display(fs, p), size=sizes.get(p)) for p in found]

    def _check_bucket(self, fs: Any, root: str, where: str) -> None:
        """On an object store, say so when the bucket itself is missing."""
        if fs_util.protocol_of(self.config.path) in ("file", "memory", "local"):
            return
        bucket = root.split("/", 1)[0]
        if not fs.exists(bucket):
            raise ConfigError(f"{where}: bucket {bucket!r} does not exist (or these credentials cannot see it)",
                              key="source.path", hint="check the bucket name, the endpoint and the credentials")

    def _discover_hive(self, fs: Any, entries: list[FileEntry]) -> None:
        """Hive-style folders (``year=2024/part-0.parquet``, as ``sink.partition_by`` writes them):
        pyarrow.dataset discovers the columns and their types; each file gets its values."""
        import pyarrow.dataset as ds

        _, root = _filesystem(self.config.path, self.config.storage_options)
        root = root.rstrip("/")
        paths = [fs._strip_protocol(e.path) for e in entries]
        if not any("=" in p[len(root):] for p in paths):
            return
        try:
            found = ds.dataset(paths, filesystem=fs, format=self._dataset_format(), partitioning="hive", partition_base_dir=root)
        except Exception as exc:  # the folders are not hive-style after all
            warn(f"source.path {self.config.path!r}: folder names look like key=value but are not hive partitions: {exc}")
            return
        own = set(self._schema.names)
        self._hive_fields = [f for f in found.schema if f.name not in own]
        names = {f.name for f in self._hive_fields}
        for fragment in found.get_fragments():
            keys = ds.get_partition_keys(fragment.partition_expression)
            self._hive[fs_util.display(fs, fragment.path)] = {k: v for k, v in keys.items() if k in names}

    def _with_hive(self, path: str, batches: Iterator[Any]) -> Iterator[Any]:
        """The file's batches with its folder's key=value columns added (constant arrays, no rows in Python)."""
        if not self._hive_fields:
            yield from batches
            return
        import pyarrow as pa

        values = self._hive.get(path, {})
        for batch in batches:
            extra = [pa.repeat(pa.scalar(values.get(f.name), f.type), batch.num_rows) for f in self._hive_fields]
            yield pa.RecordBatch.from_arrays([*batch.columns, *extra], names=[*batch.schema.names, *(f.name for f in self._hive_fields)])

    def _dataset_format(self) -> str:
        return self.format_name

    # subclasses: schema of one file, batches of one file
    def _file_schema(self, fs: Any, path: str) -> Any:
        raise NotImplementedError

    def _read_file(self, fs: Any, path: str, row_groups: list[int] | None = None) -> Iterator[Any]:
        raise NotImplementedError

    def describe(self) -> SourceInfo:
        import pyarrow as pa

        entries = self.list_files()
        fs = self._fs()
        self._schema = self._file_schema(fs, entries[0].path)
        self._discover_hive(fs, entries)
        total = sum(e.size or 0 for e in entries)
        return SourceInfo(
            schema=pa.schema([*self._schema, *self._hive_fields]),
            label=f"{self.format_name}: {len(entries)} file(s) at {self.config.path}",
            estimated_bytes=total or None,
        )

    def read(self, part: Partition) -> Iterator[Any]:
        fs = self._fs()
        if isinstance(part, RowGroupSet):
            yield from rebatch(self._with_hive(part.path, self._read_file(fs, part.path, list(part.row_groups))), self.options.batch_size)
            return
        if isinstance(part, FileSet):
            paths: Sequence[str] = part.paths
        elif isinstance(part, WholeSource):
            paths = [e.path for e in self.list_files()]
        else:
            raise PlanningError(f"{self.format_name} source cannot read a {part.kind} partition", hint="use strategy=files or strategy=none")
        for path in paths:
            yield from rebatch(self._with_hive(path, self._read_file(fs, path)), self.options.batch_size)

    def _check_schema(self, path: str, schema: Any) -> None:
        if self._schema is not None and not same_columns(schema, self._schema):
            raise SchemaError(
                f"{self.format_name} file {path}: its columns differ from the first file's",
                hint=f"expected {self._schema.names}, found {schema.names}",
            )


class ParquetSource(_FileSource):
    """Parquet files; row groups stream in ``batch_size`` batches."""

    extensions = (".parquet", ".parq", ".pq")
    format_name = "parquet"

    def _open(self, fs: Any, path: str) -> Any:
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(fs.open(path, "rb"))
        except (FileNotFoundError, PermissionError, ConnectionError) as exc:
            raise fs_util.translate(exc, f"parquet file {path}") from None
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for damaged files
            raise SchemaError(f"parquet file {path}: cannot be read: {exc}", hint="is it a Parquet file, and whole?") from None

    def _file_schema(self, fs: Any, path: str) -> Any:
        return self._open(fs, path).schema_arrow

    def describe(self) -> SourceInfo:
        """Reads every file's footer: checks the schemas agree and counts rows, before any task runs."""
        from concurrent.futures import ThreadPoolExecutor

        info = super().describe()
        fs = self._fs()

        def footer(entry: FileEntry) -> FileEntry:
            meta = self._open(fs, entry.path)
            self._check_schema(entry.path, meta.schema_arrow)
            groups = tuple(meta.metadata.row_group(i).num_rows for i in range(meta.metadata.num_row_groups))
            return FileEntry(entry.path, entry.size, meta.metadata.num_rows, groups)

        with ThreadPoolExecutor(max_workers=8) as pool:
            self._entries = list(pool.map(footer, self.list_files()))
        rows = sum(e.rows or 0 for e in self._entries)
        return SourceInfo(info.schema, info.label, estimated_rows=rows, estimated_bytes=info.estimated_bytes)

    def count_rows(self, parts: list[Partition]) -> list[int]:
        """Row counts from the Parquet footers (read by ``describe``)."""
        entries = {e.path: e for e in self.list_files()}
        if any(e.rows is None for e in entries.values()):
            self.describe()
            entries = {e.path: e for e in self.list_files()}
        out = []
        for p in parts:
            if isinstance(p, RowGroupSet):
                out.append(sum((entries[p.path].row_groups or ())[g] for g in p.row_groups))
            elif isinstance(p, FileSet):
                out.append(sum(entries[x].rows or 0 for x in p.paths))
            else:
                out.append(sum(e.rows or 0 for e in entries.values()))
        return out

    def _read_file(self, fs: Any, path: str, row_groups: list[int] | None = None) -> Iterator[Any]:
        import pyarrow as pa

        pf = self._open(fs, path)
        self._check_schema(path, pf.schema_arrow)
        try:
            yield from pf.iter_batches(batch_size=self.options.batch_size, row_groups=row_groups)
        except (OSError, pa.ArrowException) as exc:  # a corrupt page: 'Corrupt snappy compressed data.' alone named no file
            raise TransferError(f"parquet file {path}: {first_line(exc)}",
                                hint="the file is damaged: write it again, or leave it out of source.path") from None


class CsvSource(_FileSource):
    """CSV files; column types are inferred once, from the first file, and imposed on the rest."""

    config_class = CsvSourceConfig
    extensions = (".csv", ".csv.gz", ".tsv")
    format_name = "csv"

    def _reader(self, fs: Any, path: str, column_types: Any = None) -> Any:
        import pyarrow.csv as pacsv

        cfg = self.config
        compression = "gzip" if path.endswith(".gz") else None
        try:
            stream = fs.open(path, "rb", compression=compression)
        except Exception as exc:
            raise fs_util.translate(exc, f"csv file {path}") from None
        read = pacsv.ReadOptions(autogenerate_column_names=not cfg.header, block_size=8 << 20)
        parse = pacsv.ParseOptions(delimiter=cfg.delimiter, quote_char=cfg.quote_char)
        convert = pacsv.ConvertOptions(column_types=column_types)
        try:
            return pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        except Exception as exc:
            raise SchemaError(f"csv file {path}: cannot be read: {exc}") from None

    def _file_schema(self, fs: Any, path: str) -> Any:
        return self._reader(fs, path).schema

    def _read_file(self, fs: Any, path: str, row_groups: list[int] | None = None) -> Iterator[Any]:
        if row_groups is not None:
            raise PlanningError("csv files have no row groups", hint="set strategy.row_groups_per_partition=0")
        if self._schema is None:
            self._schema = self._file_schema(fs, path)
        reader = self._reader(fs, path, column_types=self._schema)
        self._check_schema(path, reader.schema)
        try:
            yield from reader
        except Exception as exc:
            raise TransferError(f"csv file {path}: {exc}", hint="a value does not fit the type inferred from the first file") from None


# --- sinks ----------------------------------------------------------------------------------


@dataclass
class FileSinkConfig:
    #: the folder that receives one file per partition; any fsspec URL
    path: str = "???"
    #: file names are <prefix>-<partition>.<ext> (append adds the run id)
    prefix: str = "part"
    #: hive-style output folders by these columns: <col>=<value>/<prefix>-....<ext>
    partition_by: list[str] = field(default_factory=list)
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParquetSinkConfig(FileSinkConfig):
    #: zstd | snappy | gzip | lz4 | brotli | none
    compression: str = "zstd"


@dataclass
class CsvSinkConfig(FileSinkConfig):
    delimiter: str = ","
    header: bool = True


class _FileSink:
    config_class: type = FileSinkConfig
    extension = ""

    def __init__(self, config: FileSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def _fs(self) -> tuple[Any, str]:
        fs, root = _filesystem(self.config.path, self.config.storage_options)
        return fs, root.rstrip("/")

    def _existing(self, fs: Any, root: str) -> list[str]:
        """The data files already under the folder (recursively, for hive-style output)."""
        if not fs.exists(root):
            return []
        if not fs.isdir(root):
            raise ConfigError(f"sink.path {self.config.path!r} is a file; give a folder", key="sink.path")
        return [p for p in fs.find(root) if p.endswith(self.extension) and "/_conveyor_" not in p[len(root):]
                and "/." not in p[len(root):]]

    def _check_types(self, schema: Any) -> None:
        """Fail before any row moves when the format cannot hold a column's type."""

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        schema = request.schema
        missing = [c for c in self.config.partition_by if c not in schema.names]
        if missing:
            raise SchemaError(f"sink.partition_by: no source column {', '.join(missing)}", hint=f"columns are: {', '.join(schema.names)}")
        self._check_types(schema)
        mode = self.options.load_mode
        where = f"sink.path {self.config.path!r}"
        try:
            fs, root = self._fs()
            existing = self._existing(fs, root)
            if mode == "create" and existing:
                raise SchemaError(f"{where} already holds {len(existing)} {self.extension} file(s)", hint="use load_mode=replace or append")
            write_to = root if mode == "append" else posixpath.join(root, f"_conveyor_staging_{self.options.run_id}")
            fs.makedirs(write_to, exist_ok=True)
        except ConveyorError:
            raise
        except Exception as exc:
            raise fs_util.translate(exc, where) from None
        return SinkPlan(
            target=fs_util.display(fs, root), write_target=write_to, load_mode=mode,
            columns=tuple(schema.names), source_columns=tuple(schema.names), schema=schema,
        )

    def _name(self, part: Partition) -> str:
        """A partition's file name. Appended files carry the load id (the first run's id, kept by
        ``resume``): a partition written again, by a resume or by the task of a driver that was killed,
        replaces its own file instead of adding a second copy of its rows."""
        return self._stem(part.index) + self.extension

    def _written(self, plan: SinkPlan, paths: list[str]) -> list[str]:
        """The files, among ``paths``, of the partitions this run writes (appended files only: a
        replaced folder holds nothing else)."""
        if self.options.load_mode != "append":
            return paths
        indexes = plan.to_write
        if indexes is None:
            return [p for p in paths if posixpath.basename(p).startswith(f"{self.config.prefix}-{self.options.load}-")]
        # 'stem.ext', or 'stem-<i>.ext' in hive folders
        stems = tuple(self._stem(i) + end for i in indexes for end in (self.extension, "-"))
        return [p for p in paths if posixpath.basename(p).startswith(stems)]

    def _stem(self, index: int) -> str:
        load = f"-{self.options.load}" if self.options.load_mode == "append" else ""
        return f"{self.config.prefix}{load}-{index:05d}"

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import time

        fs, _ = self._fs()
        start = time.perf_counter()
        # everything is written under a temporary name first and renamed when whole
        tmp = posixpath.join(plan.write_target, f"_conveyor_tmp_{self.options.run_id}_{part.index:05d}")
        try:
            if self.config.partition_by:
                rows, nbytes = self._write_hive(fs, tmp, batches, plan.schema, part)
                if self.options.load_id:  # resumed: this partition's files from before are replaced, not added to
                    for old in fs.glob(posixpath.join(plan.write_target, "**", f"{self._stem(part.index)}-*{self.extension}")):
                        if "/_conveyor_" not in old:  # not the ones just written
                            fs.rm(old)
                for path in fs.find(tmp):
                    dest = posixpath.join(plan.write_target, path[len(tmp) + 1:])
                    fs.makedirs(posixpath.dirname(dest), exist_ok=True)  # a local folder must exist (object stores have none)
                    fs.mv(path, dest)
            else:
                rows, nbytes = self._write_file(fs, tmp, batches, plan.schema)
                fs.mv(tmp, posixpath.join(plan.write_target, self._name(part)))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                if fs.exists(tmp):
                    fs.rm(tmp, recursive=True)
            if isinstance(exc, (OSError, ConnectionError)) and not isinstance(exc, ConveyorError):
                raise fs_util.translate(exc, f"sink.path {self.config.path!r}") from None
            raise
        with contextlib.suppress(Exception):
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        return WriteStats(part.key, rows, nbytes, time.perf_counter() - start)

    def _write_hive(self, fs: Any, folder: str, batches: Iterable[Any], schema: Any, part: Partition) -> tuple[int, int]:
        import pyarrow as pa
        import pyarrow.dataset as ds

        counted = CountingBatches(batches)
        plain = without_views(schema)  # the dataset writer has no string_view kernels
        keys = pa.schema([plain.field(c) for c in self.config.partition_by])
        stem = self._stem(part.index)
        ds.write_dataset(
            pa.RecordBatchReader.from_batches(plain, cast_batches(counted, plain)), folder, filesystem=fs,
            format=self._dataset_format(), file_options=self._dataset_options(),
            partitioning=ds.partitioning(keys, flavor="hive"), basename_template=stem + "-{i}" + self.extension,
            existing_data_behavior="overwrite_or_ignore",
        )
        if counted.error is not None:
            raise counted.error
        return counted.rows, counted.bytes

    def _dataset_format(self) -> Any:
        raise NotImplementedError

    def _dataset_options(self) -> Any:
        return None

    def _writer(self, out: Any, schema: Any) -> Any:
        raise NotImplementedError

    def _write_file(self, fs: Any, path: str, batches: Iterable[Any], schema: Any) -> tuple[int, int]:
        counted = CountingBatches(batches)
        writer = None
        with fs.open(path, "wb") as out:
            try:
                for batch in counted:
                    if writer is None:
                        writer = self._writer(out, batch.schema)
                    writer.write_batch(batch)
            finally:
                if writer is None and schema is not None:  # an empty partition still makes a valid file
                    writer = self._writer(out, schema)
                if writer is not None:
                    writer.close()
        return counted.rows, counted.bytes

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        fs, root = self._fs()
        if plan.write_target == root:
            return
        try:
            for old in self._existing(fs, root):
                fs.rm(old)
            for new in fs.find(plan.write_target):
                dest = posixpath.join(root, new[len(plan.write_target) + 1:])
                fs.makedirs(posixpath.dirname(dest), exist_ok=True)
                fs.mv(new, dest)
            if fs.exists(plan.write_target):  # object stores have no folders left to remove
                fs.rm(plan.write_target, recursive=True)
        except Exception as exc:
            raise fs_util.translate(exc, f"sink.path {self.config.path!r}") from None

    def abort(self, plan: SinkPlan) -> None:
        fs, root = self._fs()
        if plan.write_target != root and fs.exists(plan.write_target):
            fs.rm(plan.write_target, recursive=True)


class ParquetSink(_FileSink):
    """One Parquet file per partition (zstd by default)."""

    config_class = ParquetSinkConfig
    extension = ".parquet"

    def _check_types(self, schema: Any) -> None:
        import io

        import pyarrow as pa

        for column in schema:
            try:
                self._writer(io.BytesIO(), pa.schema([column])).close()
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError) as exc:
                raise SchemaError(
                    f"parquet sink: column {column.name} of type {column.type} cannot be stored in Parquet: {exc}",
                    hint="cast the column in the source (e.g. to text in source.query), or write CSV",
                ) from None

    def _writer(self, out: Any, schema: Any) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetWriter(out, schema, compression=self._compression())

    def _compression(self) -> str | None:
        return None if self.config.compression == "none" else self.config.compression

    def _dataset_format(self) -> Any:
        import pyarrow.dataset as ds

        return ds.ParquetFileFormat()

    def count_rows(self, plan: SinkPlan) -> int:
        """Rows in the files this load wrote (their footers)."""
        import pyarrow.parquet as pq

        fs, _ = self._fs()
        total = 0
        for path in self._written(plan, self._existing(fs, plan.write_target)):
            with fs.open(path, "rb") as f:
                total += pq.ParquetFile(f).metadata.num_rows
        return total

    def _dataset_options(self) -> Any:
        return self._dataset_format().make_write_options(compression=self._compression())


class CsvSink(_FileSink):
    """One CSV file per partition."""

    config_class = CsvSinkConfig
    extension = ".csv"

    def _writer(self, out: Any, schema: Any) -> Any:
        import pyarrow.csv as pacsv

        return pacsv.CSVWriter(out, schema, write_options=self._csv_options())

    def _csv_options(self) -> Any:
        import pyarrow.csv as pacsv

        return pacsv.WriteOptions(include_header=self.config.header, delimiter=self.config.delimiter)

    def _dataset_format(self) -> Any:
        import pyarrow.dataset as ds

        return ds.CsvFileFormat()

    def _dataset_options(self) -> Any:
        return self._dataset_format().make_write_options(include_header=self.config.header, delimiter=self.config.delimiter)
