"""Parquet and CSV files on any fsspec filesystem: sources and sinks.

A source ``path`` is a file, a folder (every file in it with the format's extension) or a
glob. Sinks write one file per partition into a folder, each under a temporary name first
and renamed when whole, so a failed partition leaves no file behind. ``truncate``,
``replace`` and ``create`` write into a staging folder that replaces the folder's files
only when every partition succeeded.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.arrowutil import CountingBatches, rebatch, same_columns
from conveyor.core import PrepareRequest, FileEntry, FileSet, JobOptions, Partition, SinkPlan, SourceInfo, WholeSource, WriteStats
from conveyor.errors import ConfigError, ConnectError, PlanningError, SchemaError, TransferError

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
    import fsspec

    try:
        return fsspec.core.url_to_fs(path, **storage_options)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"path {path!r}: {exc}", key="path", hint="for s3:// install conveyor[s3]") from None


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

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_entries"] = None  # workers get their files from the partition
        return state

    def list_files(self) -> list[FileEntry]:
        if self._entries is None:
            self._entries = self._list()
        return self._entries

    def _list(self) -> list[FileEntry]:
        fs, root = _filesystem(self.config.path, self.config.storage_options)
        where = f"source.path {self.config.path!r}"
        try:
            if any(c in root for c in _GLOB_CHARS):
                found = sorted(p for p in fs.glob(root) if not fs.isdir(p))
                if not found:
                    raise ConfigError(f"{where}: the glob matches no files", key="source.path", hint="check the pattern")
            elif fs.isdir(root):
                found = sorted(p for p in fs.find(root) if p.endswith(self.extensions))
                if not found:
                    exts = "/".join(self.extensions)
                    raise ConfigError(f"{where}: the folder holds no {exts} files", key="source.path")
            elif fs.exists(root):
                found = [root]
            else:
                raise ConfigError(f"{where}: no such file or folder", key="source.path", hint="check the path")
        except (PermissionError, OSError) as exc:
            raise ConnectError(f"{where}: {type(exc).__name__}: {exc}") from None
        sizes = {p: fs.size(p) for p in found} if len(found) <= 10000 else {}
        return [FileEntry(path=p, size=sizes.get(p)) for p in found]

    # subclasses: schema of one file, batches of one file
    def _file_schema(self, fs: Any, path: str) -> Any:
        raise NotImplementedError

    def _read_file(self, fs: Any, path: str) -> Iterator[Any]:
        raise NotImplementedError

    def describe(self) -> SourceInfo:
        entries = self.list_files()
        fs, _ = _filesystem(self.config.path, self.config.storage_options)
        self._schema = self._file_schema(fs, entries[0].path)
        total = sum(e.size or 0 for e in entries)
        return SourceInfo(
            schema=self._schema,
            label=f"{self.format_name}: {len(entries)} file(s) at {self.config.path}",
            estimated_bytes=total or None,
        )

    def read(self, part: Partition) -> Iterator[Any]:
        fs, _ = _filesystem(self.config.path, self.config.storage_options)
        if isinstance(part, FileSet):
            paths: Sequence[str] = part.paths
        elif isinstance(part, WholeSource):
            paths = [e.path for e in self.list_files()]
        else:
            raise PlanningError(f"{self.format_name} source cannot read a {part.kind} partition", hint="use strategy=files or strategy=none")
        for path in paths:
            yield from rebatch(self._read_file(fs, path), self.options.batch_size)

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
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for damaged files
            raise SchemaError(f"parquet file {path}: cannot be read: {exc}", hint="is it a Parquet file, and whole?") from None

    def _file_schema(self, fs: Any, path: str) -> Any:
        return self._open(fs, path).schema_arrow

    def describe(self) -> SourceInfo:
        """Reads every file's footer: checks the schemas agree and counts rows, before any task runs."""
        from concurrent.futures import ThreadPoolExecutor

        info = super().describe()
        fs, _ = _filesystem(self.config.path, self.config.storage_options)
        entries = self.list_files()

        def footer(entry: FileEntry) -> FileEntry:
            pf = self._open(fs, entry.path)
            self._check_schema(entry.path, pf.schema_arrow)
            return FileEntry(entry.path, entry.size, pf.metadata.num_rows)

        with ThreadPoolExecutor(max_workers=8) as pool:
            self._entries = list(pool.map(footer, entries))
        rows = sum(e.rows or 0 for e in self._entries)
        return SourceInfo(info.schema, info.label, estimated_rows=rows, estimated_bytes=info.estimated_bytes)

    def _read_file(self, fs: Any, path: str) -> Iterator[Any]:
        pf = self._open(fs, path)
        self._check_schema(path, pf.schema_arrow)
        try:
            yield from pf.iter_batches(batch_size=self.options.batch_size)
        except OSError as exc:
            raise TransferError(f"parquet file {path}: {exc}") from None


class CsvSource(_FileSource):
    """CSV files; column types are inferred once, from the first file, and imposed on the rest."""

    config_class = CsvSourceConfig
    extensions = (".csv", ".csv.gz", ".tsv")
    format_name = "csv"

    def _reader(self, fs: Any, path: str, column_types: Any = None) -> Any:
        import pyarrow.csv as pacsv

        cfg = self.config
        compression = "gzip" if path.endswith(".gz") else None
        stream = fs.open(path, "rb", compression=compression)
        read = pacsv.ReadOptions(autogenerate_column_names=not cfg.header, block_size=8 << 20)
        parse = pacsv.ParseOptions(delimiter=cfg.delimiter, quote_char=cfg.quote_char)
        convert = pacsv.ConvertOptions(column_types=column_types)
        try:
            return pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        except Exception as exc:
            raise SchemaError(f"csv file {path}: cannot be read: {exc}") from None

    def _file_schema(self, fs: Any, path: str) -> Any:
        return self._reader(fs, path).schema

    def _read_file(self, fs: Any, path: str) -> Iterator[Any]:
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
        if not fs.exists(root):
            return []
        if not fs.isdir(root):
            raise ConfigError(f"sink.path {self.config.path!r} is a file; give a folder", key="sink.path")
        return [p for p in fs.ls(root, detail=False) if p.endswith(self.extension) and not fs.isdir(p)]

    def _check_types(self, schema: Any) -> None:
        """Fail before any row moves when the format cannot hold a column's type."""

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        schema = request.schema
        self._check_types(schema)
        fs, root = self._fs()
        mode = self.options.load_mode
        existing = self._existing(fs, root)
        if mode == "create" and existing:
            raise SchemaError(f"sink.path {self.config.path!r} already holds {len(existing)} {self.extension} file(s)", hint="use load_mode=replace or append")
        write_to = root if mode == "append" else posixpath.join(root, f"_conveyor_staging_{self.options.run_id}")
        try:
            fs.makedirs(write_to, exist_ok=True)
        except OSError as exc:
            raise ConnectError(f"sink.path {self.config.path!r}: cannot create the folder: {exc}") from None
        return SinkPlan(
            target=root, write_target=write_to, load_mode=mode,
            columns=tuple(schema.names), source_columns=tuple(schema.names), schema=schema,
        )

    def _name(self, part: Partition) -> str:
        run = f"-{self.options.run_id}" if self.options.load_mode == "append" else ""
        return f"{self.config.prefix}{run}-{part.index:05d}{self.extension}"

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import time

        fs, _ = self._fs()
        final = posixpath.join(plan.write_target, self._name(part))
        tmp = posixpath.join(plan.write_target, f".{self._name(part)}.tmp")
        start = time.perf_counter()
        try:
            rows, nbytes = self._write_file(fs, tmp, batches, plan.schema)
            fs.mv(tmp, final)
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
        return WriteStats(part.key, rows, nbytes, time.perf_counter() - start)

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
        if plan.write_target == plan.target:
            return
        fs, root = self._fs()
        for old in self._existing(fs, root):
            fs.rm(old)
        for new in fs.ls(plan.write_target, detail=False):
            fs.mv(new, posixpath.join(root, posixpath.basename(new)))
        fs.rm(plan.write_target, recursive=True)

    def abort(self, plan: SinkPlan) -> None:
        fs, _ = self._fs()
        if plan.write_target != plan.target and fs.exists(plan.write_target):
            fs.rm(plan.write_target, recursive=True)


class ParquetSink(_FileSink):
    """One Parquet file per partition (zstd by default)."""

    config_class = ParquetSinkConfig
    extension = ".parquet"

    def _check_types(self, schema: Any) -> None:
        import io

        import pyarrow as pa

        for field in schema:
            try:
                self._writer(io.BytesIO(), pa.schema([field])).close()
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError) as exc:
                raise SchemaError(
                    f"parquet sink: column {field.name} of type {field.type} cannot be stored in Parquet: {exc}",
                    hint="cast the column in the source (e.g. to text in source.query), or write CSV",
                ) from None

    def _writer(self, out: Any, schema: Any) -> Any:
        import pyarrow.parquet as pq

        compression = None if self.config.compression == "none" else self.config.compression
        return pq.ParquetWriter(out, schema, compression=compression)


class CsvSink(_FileSink):
    """One CSV file per partition."""

    config_class = CsvSinkConfig
    extension = ".csv"

    def _writer(self, out: Any, schema: Any) -> Any:
        import pyarrow.csv as pacsv

        options = pacsv.WriteOptions(include_header=self.config.header, delimiter=self.config.delimiter)
        return pacsv.CSVWriter(out, schema, write_options=options)
