"""What every file sink does: one file per partition under a temporary name, renamed into place when its
rows are read back whole; truncate/replace/create into a staging folder swapped in at the end; the
incremental cursor beside the files. :mod:`conveyor.connectors.files.sinks` has the formats."""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.files import cursors
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
    check_stored,
    columns_only,
    target_for,
)
from conveyor.errors import ConfigError, ConveyorError, SchemaError
from conveyor.kit import fs as fs_util
from conveyor.kit.arrowutil import CountingBatches, cast_batches, without_views
from conveyor.log import say


@dataclass(frozen=True)
class FilesPlan:
    """The file sinks' own decisions (``SinkPlan.own``)."""

    #: incremental.cursor: the window this load reads (committed beside the files when they are)
    window: Any = None
    #: the output folder did not exist before this run: a run that fails leaving it empty removes it
    made_root: bool = False


@dataclass
class FileSinkConfig:
    #: the folder that receives one file per partition; any fsspec URL
    path: str = "???"
    #: file names are <prefix>-<partition>.<ext> (append adds the run id)
    prefix: str = "part"
    #: hive-style output folders by these columns: <col>=<value>/<prefix>-....<ext>
    partition_by: list[str] = field(default_factory=list)
    storage_options: dict[str, Any] = field(default_factory=dict)


class FileSink(SinkBase):
    config_class: type = FileSinkConfig
    capabilities = SinkCapabilities(read_back=True)
    extension = ""

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        """One file per partition, written under a temporary name and renamed when whole; a load other than an
        append writes into a staging folder whose files take the old ones' place at the end."""
        kind = self.extension.lstrip(".")
        how = f"arrow: one {kind} file per partition, renamed into place when whole"
        if self.options.load_mode != "append":
            how += f"; into a staging folder whose files replace the folder's {kind} files at the end"
        return TargetInfo(label=f"{kind} files in {self.config.path}", path=how)

    def __init__(self, config: FileSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def for_target(self, schema: str, table: str, options: JobOptions) -> FileSink:
        """This sink writing one table of a job over several into a folder of its own: ``sink.path``
        with ``{table}`` (and ``{schema}``) replaced, or the table's name as a folder under it."""
        path = self.config.path
        path = target_for(path, schema, table, "sink.path") if "{table}" in path else f"{path.rstrip('/')}/{table}"
        return type(self)(dataclasses.replace(self.config, path=path), options)

    def _fs(self) -> tuple[Any, str]:
        fs, root = fs_util.filesystem(self.config.path, self.config.storage_options)
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
            made = not fs.exists(root)
            fs.makedirs(write_to, exist_ok=True)
            if request.window is not None:  # before any file of the load: a run that stops half way is known to the next
                cursors.record_pending(fs, root, request.window, self.options.load, mode, self.options.run_id)
        except ConveyorError:
            raise
        except Exception as exc:
            raise fs_util.translate(exc, where) from None
        said = columns_only(request.info) if mode in ("create", "replace") else ""
        if said:
            say(f"{where}: {said}")
        return SinkPlan(
            definition=said, target=fs_util.display(fs, root), write_target=write_to, load_mode=mode,
            columns=tuple(schema.names), source_columns=tuple(schema.names), schema=schema, own=FilesPlan(request.window, made),
        )

    def cursor_state(self, column: str) -> CursorState:
        """The cursor the last finished load committed here (beside the files), and an unfinished run's window."""
        fs, root = self._fs()
        try:
            return cursors.state(fs, root, column, lambda load: len(self._files_of(fs, root, load)))
        except Exception as exc:
            raise fs_util.translate(exc, f"sink.path {self.config.path!r}: reading {cursors.STATE}") from None

    def _files_of(self, fs: Any, root: str, load: str) -> list[str]:
        """The appended files of one load (a partition's file, or its hive files, carry the load id)."""
        return [p for p in self._existing(fs, root) if posixpath.basename(p).startswith(f"{self.config.prefix}-{load}-")]

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
                self._check_stored(fs, fs.find(tmp), rows, plan, part)
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
                self._check_stored(fs, [tmp], rows, plan, part)
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

    def _check_stored(self, fs: Any, paths: list[str], sent: int, plan: SinkPlan, part: Partition) -> None:
        """Before a partition's files are published (renamed into place): the rows they hold, as the
        files themselves say (where the format says: Parquet's footers), are the rows written."""
        if self.options.verify != "none":
            stored = self._stored(fs, paths)
            check_stored(plan.target, part.key, sent, stored)

    def _stored(self, fs: Any, paths: list[str]) -> int | None:
        """The rows the files hold, read back from them (None: the format does not say without a parse)."""
        return None

    def _write_hive(self, fs: Any, folder: str, batches: Iterable[Any], schema: Any, part: Partition) -> tuple[int, int]:
        import pyarrow as pa
        import pyarrow.dataset as ds

        counted = CountingBatches(batches)
        plain = without_views(schema)  # the dataset writer has no string_view kernels
        written = self._as_written(plain)
        keys = pa.schema([written.field(c) for c in self.config.partition_by])
        stem = self._stem(part.index)
        ds.write_dataset(
            pa.RecordBatchReader.from_batches(written, self._formatted(cast_batches(counted, plain))), folder, filesystem=fs,
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

    def _chunks(self, batches: Iterable[Any]) -> Iterable[Any]:
        """What the writer gets at a time: each batch as it comes."""
        return batches

    def _formatted(self, batches: Iterable[Any]) -> Iterable[Any]:
        """Batches as the format writes them (``_as_written``'s schema)."""
        return batches

    def _as_written(self, schema: Any) -> Any:
        """The schema of what ``_formatted`` gives the writer."""
        return schema

    def _write_file(self, fs: Any, path: str, batches: Iterable[Any], schema: Any) -> tuple[int, int]:
        counted = CountingBatches(batches)
        writer = None
        with fs.open(path, "wb") as out:
            try:
                for chunk in self._chunks(counted):
                    if writer is None:
                        writer = self._writer(out, chunk.schema)
                    writer.write(chunk)
            finally:
                if writer is None and schema is not None:  # an empty partition still makes a valid file
                    writer = self._writer(out, self._as_written(schema))
                if writer is not None:
                    writer.close()
        return counted.rows, counted.bytes

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        fs, root = self._fs()
        if plan.write_target == root:  # append: every partition's file is in place
            if plan.own.window is not None:
                try:
                    cursors.commit(fs, root, plan.own.window, self.options.load, self.options.run_id)
                except Exception as exc:
                    raise fs_util.translate(exc, f"sink.path {self.config.path!r}: writing {cursors.STATE}") from None
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
        if plan.own.made_root and fs.exists(root) and not fs.ls(root):  # the folder this run made, left empty
            with contextlib.suppress(Exception):
                fs.rmdir(root)
