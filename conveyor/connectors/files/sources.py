"""Parquet and CSV file sources: a file, a folder or a glob on any fsspec filesystem, planned
by file or by Parquet row group."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.files.filesource import FileSource, FileSourceConfig
from conveyor.core import (
    FileEntry,
    FileSet,
    Partition,
    RowGroupSet,
    SourceInfo,
)
from conveyor.errors import ConfigError, PlanningError, SchemaError, TransferError, first_line
from conveyor.kit import fs as fs_util
from conveyor.kit.casts import SCALES


@dataclass
class CsvSourceConfig(FileSourceConfig):
    delimiter: str = ","
    header: bool = True
    quote_char: str = '"'
    #: what stands for NULL when it stands unquoted ('': an empty field, as PostgreSQL's CSV writes it);
    #: a quoted value is never NULL: "" is an empty string
    null: str = ""
    #: column types by name, instead of those inferred from the first file: Arrow type names (int64,
    #: float64, string, date32, timestamp[us], bool) or decimal(p,s). Inferred: numbers with a decimal
    #: point (and no exponent) are decimal(38, s) with the largest scale the first block of the first
    #: file shows, read exactly; a later value with more digits is refused by name
    column_types: dict[str, str] = field(default_factory=dict)


class ParquetSource(FileSource):
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
        groups = range(pf.metadata.num_row_groups) if row_groups is None else row_groups
        try:
            # one reader per row group: one iter_batches over many row groups keeps part of every group
            # it has read (~4 MB per lineitem group: as Python bytes through fsspec's file object, in
            # Arrow's pool through a native one), so memory grew with the file; per group it stays flat,
            # at the same speed
            for group in groups:
                yield from pf.iter_batches(batch_size=self.options.batch_size, row_groups=[group])
        except (OSError, pa.ArrowException) as exc:  # a corrupt page: 'Corrupt snappy compressed data.' alone named no file
            raise TransferError(f"parquet file {path}: {first_line(exc)}",
                                hint="the file is damaged: write it again, or leave it out of source.path") from None


class CsvSource(FileSource):
    """CSV files; column types are inferred once, from the first file, and imposed on the rest."""

    config_class = CsvSourceConfig
    extensions = (".csv", ".csv.gz", ".tsv")
    format_name = "csv"

    def _reader(self, fs: Any, path: str, column_types: Any = None, tail: list[Any] | None = None) -> Any:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        cfg = self.config
        assert isinstance(cfg, CsvSourceConfig)
        compression = "gzip" if path.endswith(".gz") else None
        try:
            stream = _Tail(fs.open(path, "rb", compression=compression))
        except Exception as exc:
            raise fs_util.translate(exc, f"csv file {path}") from None
        if tail is not None:
            tail.append(stream)
        if column_types is not None:  # pyarrow's CSV reader has no decimal256: those columns are read as text (see _widen)
            column_types = {f.name: pa.string() if pa.types.is_decimal256(f.type) else f.type for f in column_types} \
                if isinstance(column_types, pa.Schema) else {n: pa.string() if pa.types.is_decimal256(t) else t for n, t in column_types.items()}
        read = pacsv.ReadOptions(autogenerate_column_names=not cfg.header, block_size=8 << 20)
        parse = pacsv.ParseOptions(delimiter=cfg.delimiter, quote_char=cfg.quote_char)
        # NULL is the null marker standing unquoted, in every column (text too); nothing else is NULL
        convert = pacsv.ConvertOptions(column_types=column_types, null_values=[cfg.null], strings_can_be_null=True,
                                       quoted_strings_can_be_null=False)
        try:
            return pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        except Exception as exc:
            if column_types is not None and ("CSV conversion error" in str(exc) or "Rescaling" in str(exc)):
                raise self._unfit(path, exc) from None
            raise self._unreadable(fs, path, exc) from None

    def _unreadable(self, fs: Any, path: str, exc: BaseException) -> SchemaError:
        """A file the CSV parser refused: one line, the file's bytes never printed raw (a Parquet or binary file named as
        CSV printed them into the terminal)."""
        with contextlib.suppress(Exception), fs.open(path, "rb") as f:
            head = f.read(4)
            if head == b"PAR1":
                return SchemaError(f"csv file {path}: is a Parquet file (it starts with PAR1)", hint="read it with source=parquet")
        return SchemaError(f"csv file {path}: cannot be read: {printable(first_line(exc))}",
                           hint="check source.delimiter, source.quote_char and source.header against the file")

    def _unfit(self, path: str, exc: BaseException) -> TransferError:
        """A value that does not fit its column's type, with the column named (pyarrow numbers it)."""
        import re

        text = printable(first_line(exc))
        found = re.search(r"column #(\d+)", text)
        if found and self._schema is not None and int(found.group(1)) < len(self._schema):
            field = self._schema.field(int(found.group(1)))
            text = f"column {field.name} ({field.type}): {text}"
        return TransferError(f"csv file {path}: {text}",
                             hint="a value does not fit the type inferred from the first file's first block: name the column's "
                                  "type in source.column_types (e.g. {price: 'decimal(18,4)'}), or its NULL marker in source.null")

    def _file_schema(self, fs: Any, path: str) -> Any:
        """The first file's columns: pyarrow's inference over its first block, with numbers that have a
        decimal point as exact decimals (not doubles) and ``column_types`` over both."""
        import pyarrow as pa

        cfg = self.config
        assert isinstance(cfg, CsvSourceConfig)
        given = {name: csv_type(name, text) for name, text in cfg.column_types.items()}
        inferred = self._reader(fs, path, column_types=given).schema
        unknown = sorted(set(given) - set(inferred.names))
        if unknown:
            raise ConfigError(f"source.column_types: no column {', '.join(unknown)} in {path}", key="source.column_types",
                              hint=f"its columns: {', '.join(inferred.names)}")
        binary = [f.name for f in inferred if (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)) and f.name not in given]
        if binary:
            raise SchemaError(f"csv file {path}: column {binary[0]} holds bytes that are not UTF-8 text: read as text, they would "
                              "change", hint=f"convert the file to UTF-8, or read the column as bytes: source.column_types="
                                             f"{{{binary[0]}: binary}}")
        doubles = [f.name for f in inferred if pa.types.is_floating(f.type) and f.name not in given]
        varied: set[str] = set()
        if doubles:
            decimals, varied = self._decimals(fs, path, doubles, given)
            given.update(decimals)
        return pa.schema([f.with_type(given.get(f.name, f.type)).with_metadata({SCALES: b"varied"} if f.name in varied else f.metadata)
                          for f in inferred])

    def _decimals(self, fs: Any, path: str, names: list[str], given: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
        """Of the columns pyarrow would read as doubles, those whose text in the first block is plain decimal
        numbers: their decimal type (the largest scale seen, at 38 digits; 76 where they need more), and the names of
        those whose values are written with different numbers of decimals (``0.0`` beside ``1.25``: one scale holds
        them as numbers, not as written, which a target without a scale of its own would show)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        block = self._reader(fs, path, column_types={**given, **{n: pa.string() for n in names}}).read_next_batch()
        out, varied = {}, set()
        for name in names:
            text = block.column(name).drop_null()
            if len(text) == 0 or not pc.all(pc.match_substring_regex(text, r"^[+-]?[0-9]*\.?[0-9]+$")).as_py():
                continue  # an exponent, inf or nan: a double's text
            fraction = pc.utf8_length(pc.replace_substring_regex(text, r"^[^.]*\.?", ""))
            whole = pc.utf8_length(pc.replace_substring_regex(text, r"^[+-]?0*([0-9]*)(\..*)?$", r"\1"))
            scale, digits = pc.max(fraction).as_py() or 0, (pc.max(whole).as_py() or 0) + (pc.max(fraction).as_py() or 0)
            out[name] = pa.decimal128(38, scale) if digits <= 38 and scale <= 38 else pa.decimal256(76, min(scale, 76))
            if (pc.min(fraction).as_py() or 0) != scale:
                varied.add(name)
        return out, varied

    def _read_file(self, fs: Any, path: str, row_groups: list[int] | None = None) -> Iterator[Any]:
        if row_groups is not None:
            raise PlanningError("csv files have no row groups", hint="set strategy.row_groups_per_partition=0")
        import pyarrow as pa

        if self._schema is None:
            self._schema = self._file_schema(fs, path)
        tail: list[_Tail] = []
        reader = self._reader(fs, path, column_types=self._schema, tail=tail)
        wide = [i for i, f in enumerate(self._schema) if pa.types.is_decimal256(f.type)]
        self._check_schema(path, self._widen(path, reader.schema, wide, rows=0))
        last, rows = None, 0
        try:
            for batch in reader:
                batch = self._widen(path, batch, wide, rows)
                if batch.num_rows:
                    last, rows = batch, rows + batch.num_rows
                yield batch
        except TransferError:
            raise
        except Exception as exc:
            raise self._unfit(path, exc) from None
        self._check_closed(path, last, rows, tail[0].last)

    def _widen(self, path: str, batch: Any, wide: list[int], rows: int) -> Any:
        """``batch`` (or a schema) with its decimal256 columns, read as text, cast to their type by Arrow (exact: a value
        with more digits or more decimals than the type holds is refused, naming the column)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not wide:
            return batch
        if isinstance(batch, pa.Schema):
            return pa.schema([self._schema.field(i) if i in wide else f for i, f in enumerate(batch)])
        columns = list(batch.columns)
        for i in wide:
            field = self._schema.field(i)
            try:
                columns[i] = pc.cast(columns[i], field.type)
            except pa.ArrowException as exc:
                raise TransferError(f"csv file {path}: column {field.name} ({field.type}): a value in rows {rows + 1:,}-"
                                    f"{rows + batch.num_rows:,} does not fit it: {printable(first_line(exc))}",
                                    hint=f"name the column's type in source.column_types ({{{field.name}: string}} keeps its "
                                         "text)") from None
        return pa.RecordBatch.from_arrays(columns, schema=self._schema)

    def _check_closed(self, path: str, last: Any, rows: int, end: bytes) -> None:
        """A quote the file never closes: the parser takes the rest of the file, newlines and rows included, as the value
        it opened (pyarrow accepts it at the end of a file). Its sign: the last row's last value holds a line break, and
        the file does not end with a closing quote (a value that may hold one ends with its quote, then the line's end)."""
        import pyarrow as pa

        cfg = self.config
        assert isinstance(cfg, CsvSourceConfig)
        if last is None or not cfg.quote_char or not pa.types.is_string(last.schema.field(last.num_columns - 1).type):
            return
        value = last.column(last.num_columns - 1)[last.num_rows - 1].as_py()  # one value of the file
        if value is None or ("\n" not in value and "\r" not in value):
            return
        if end.rstrip(b"\r\n").endswith(cfg.quote_char.encode()):
            return
        name = last.schema.field(last.num_columns - 1).name
        raise TransferError(f"csv file {path}: the quoted value of column {name} in row {rows:,} is never closed: its quote takes "
                            "the rest of the file (line breaks and rows) as one value", hint=f"close the quote ({cfg.quote_char}) in "
                            "the file, or set source.quote_char to the character the file quotes with")


class _Tail:
    """A binary file object that keeps the last bytes read from it (whether a CSV file ends inside a quote)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.last = inner, b""
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        if data:
            self.last = (self.last + bytes(data[-16:]))[-16:]
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def printable(text: str, limit: int = 200) -> str:
    """``text`` with every control or undecodable character escaped, and cut at ``limit`` characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit * 2])  # one message, not data
    return out if len(out) <= limit else out[:limit] + " ..."


def csv_type(name: str, text: str) -> Any:
    """An Arrow type from its name (``int64``, ``timestamp[us]``, ...) or ``decimal(p,s)``, refused by name."""
    import re

    import pyarrow as pa

    found = re.fullmatch(r"\s*decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", text)
    if found:
        p, s = int(found.group(1)), int(found.group(2))
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    unit = re.fullmatch(r"\s*timestamp\[(s|ms|us|ns)(?:,\s*tz=(.+))?\]\s*", text)
    if unit:
        return pa.timestamp(unit.group(1), unit.group(2))
    try:
        return pa.type_for_alias(text.strip())
    except (ValueError, KeyError):
        raise ConfigError(f"source.column_types: {name}: {text!r} is not a type", key=f"source.column_types.{name}",
                          hint="Arrow type names: int64, float64, string, bool, date32, timestamp[us], or decimal(p,s)") from None


# --- sinks ----------------------------------------------------------------------------------
