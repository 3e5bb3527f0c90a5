"""What every file source does: list the files a path names (a file, a folder, a glob; Hive partitions),
split them (``strategy=files``), count and mark them; :mod:`conveyor.connectors.files.sources` has
the formats."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.compat import fs_path
from conveyor.core import (
    FileEntry,
    FileSet,
    JobOptions,
    Partition,
    RowGroupSet,
    SourceBase,
    SourceInfo,
    WholeSource,
)
from conveyor.errors import ConfigError, PlanningError, SchemaError
from conveyor.kit import fs as fs_util
from conveyor.kit.arrowutil import rebatch, same_columns
from conveyor.log import warn

_GLOB_CHARS = ("*", "?", "[")


@dataclass
class FileSourceConfig:
    #: a file, a folder or a glob; any fsspec URL (local path, s3://bucket/key, memory://...)
    path: str = "???"
    #: passed to the fsspec filesystem (credentials belong in the environment)
    storage_options: dict[str, Any] = field(default_factory=dict)


def _filesystem(path: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    return fs_util.filesystem(path, storage_options)


class FileSource(SourceBase):
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
        if not str(self.config.path or "").strip():
            raise ConfigError("source.path is empty: it names no file, folder or glob", key="source.path",
                              hint="set source.path to a file, a folder or a glob (use source.path=. for the current folder)")
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
        pyarrow.dataset discovers the columns and their types; each file gets its values. Imported only for
        such folders: pyarrow.dataset imports pandas where it is installed (0.15 s and ~40 MB of every job)."""
        _, root = _filesystem(self.config.path, self.config.storage_options)
        root = root.rstrip("/")
        paths = [fs_path(fs, e.path) for e in entries]
        if not any("=" in p[len(root):] for p in paths):
            return
        import pyarrow.dataset as ds

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

    # --- resume: are the files a stopped run finished the same files? ------------------------------

    def change_mark(self) -> dict[str, Any]:
        """Each file's version (size and ETag or modification time), as the run found them."""
        return {"files": self._versions([e.path for e in self.list_files()])}

    def changed_since(self, mark: Any, parts: Sequence[Partition], rows: Sequence[int]) -> list[str] | None:
        """The partitions whose files were rewritten or removed since the run that finished them."""
        seen = (mark or {}).get("files")
        if seen is None:
            return None
        out = []
        for part in parts:
            paths = [part.path] if isinstance(part, RowGroupSet) else list(part.paths) if isinstance(part, FileSet) else list(seen)
            now = self._versions(paths)
            moved = [p for p in paths if now.get(p) != seen.get(p)]
            if moved:
                out.append(f"{part.key}: {moved[0]} " + ("was removed" if moved[0] not in now else "was rewritten")
                           + (f" (and {len(moved) - 1} more)" if len(moved) > 1 else "") + " since")
        return out

    def _versions(self, paths: list[str]) -> dict[str, str]:
        """{path: version} of the files that exist among ``paths``."""
        from concurrent.futures import ThreadPoolExecutor

        fs = self._fs()

        def one(path: str) -> tuple[str, str | None]:
            try:
                return path, fs_util.version(fs.info(path))
            except FileNotFoundError:
                return path, None

        with ThreadPoolExecutor(max_workers=8) as pool:
            return {p: v for p, v in pool.map(one, paths) if v is not None}

    def _check_schema(self, path: str, schema: Any) -> None:
        if self._schema is not None and not same_columns(schema, self._schema):
            first = {f.name: f.type for f in self._schema}
            here = {f.name: f.type for f in schema}
            diffs = [f"{n}: {first[n]} in the first file, {here[n]} here" for n in first if n in here and first[n] != here[n]]
            diffs += [f"{n}: not here" for n in first if n not in here] + [f"{n}: not in the first file" for n in here if n not in first]
            raise SchemaError(
                f"{self.format_name} file {path}: its columns differ from the first file's: {'; '.join(diffs[:5])}"
                + (f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""),
                hint="read files of one layout at a time (source.path), or cast the column to one type when writing them",
            )
