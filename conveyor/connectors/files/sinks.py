"""Parquet and CSV file sinks: one file per partition, written under a temporary name and
renamed when whole; truncate/replace/create stage into a folder swapped in at the end."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.files.filesink import FileSink, FileSinkConfig
from conveyor.core import (
    SinkPlan,
)
from conveyor.errors import SchemaError


@dataclass
class ParquetSinkConfig(FileSinkConfig):
    #: zstd | snappy | gzip | lz4 | brotli | none
    compression: str = "zstd"
    #: rows of a row group at most: batches are held until they fill one (a row group per 64k-row
    #: batch wrote lineitem 25% slower, with its dictionaries started anew each time, and 14% larger)
    row_group_rows: int = 1024 * 1024
    #: bytes of Arrow data held for one row group at most: it bounds a task's memory (the group held,
    #: and the writer's buffers for it, take two to three times this in resident memory per partition
    #: writing at once); 16 MiB makes groups of ~110k rows of lineitem, as DuckDB's 122,880-row groups.
    #: Larger groups make smaller files (64 MiB: 8% smaller on lineitem) at more memory
    row_group_bytes: int = 16 * 1024 * 1024
    #: decimals of precision <= 18 stored as INT32/INT64 (Spark's and DuckDB's layout: less to write,
    #: smaller files, faster reads; measured in benchmarks/results/design-measurements.md);
    #: false: fixed-length byte arrays, for readers that want them. The values are the same either way
    decimal_as_integer: bool = True


@dataclass
class CsvSinkConfig(FileSinkConfig):
    delimiter: str = ","
    header: bool = True
    #: what stands for NULL, unquoted ('': an empty field, as PostgreSQL's CSV writes it); every text
    #: value is quoted, so an empty string ("") and a text equal to this marker stay apart from NULL
    null: str = ""


class ParquetSink(FileSink):
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

        return pq.ParquetWriter(out, schema, compression=self._compression(), store_decimal_as_integer=self._decimal_as_integer())

    def _chunks(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Batches gathered into tables of a row group each (``row_group_rows`` / ``row_group_bytes``):
        ParquetWriter makes a row group of every write."""
        import pyarrow as pa

        config = self.config
        assert isinstance(config, ParquetSinkConfig)
        limit = max(1, config.row_group_rows)
        held: list[Any] = []
        rows = nbytes = 0
        for batch in batches:
            held.append(batch)
            rows, nbytes = rows + batch.num_rows, nbytes + batch.nbytes
            if rows >= limit or nbytes >= config.row_group_bytes:
                table = pa.Table.from_batches(held)
                yield table.slice(0, limit)
                rest = table.slice(limit)  # what the last batch brought past the limit starts the next group
                held, rows, nbytes = rest.to_batches(), rest.num_rows, rest.nbytes
        if held:
            yield pa.Table.from_batches(held, schema=held[0].schema)

    def _compression(self) -> str | None:
        return None if self.config.compression == "none" else self.config.compression

    def _decimal_as_integer(self) -> bool:
        config = self.config
        assert isinstance(config, ParquetSinkConfig)
        return config.decimal_as_integer

    def _dataset_format(self) -> Any:
        import pyarrow.dataset as ds

        return ds.ParquetFileFormat()

    def target_rows(self, plan: SinkPlan) -> int:
        """Rows in the files this load wrote (their footers)."""
        fs, _ = self._fs()
        return self._stored(fs, self._written(plan, self._existing(fs, plan.write_target)))

    def _stored(self, fs: Any, paths: list[str]) -> int:
        import pyarrow.parquet as pq

        total = 0
        for path in paths:
            with fs.open(path, "rb") as f:
                total += pq.ParquetFile(f).metadata.num_rows
        return total

    def _dataset_options(self) -> Any:
        return self._dataset_format().make_write_options(compression=self._compression(), store_decimal_as_integer=self._decimal_as_integer())


class CsvSink(FileSink):
    """One CSV file per partition."""

    config_class = CsvSinkConfig
    extension = ".csv"

    def _writer(self, out: Any, schema: Any) -> Any:
        import pyarrow.csv as pacsv

        return pacsv.CSVWriter(out, schema, write_options=self._csv_options())

    def read_back(self, like: Any) -> dict[str, Any]:
        """Each column as the type it was written from (``source.column_types``), not as the reader would guess it from
        the text (a double's ``0.5`` reads as a decimal; a string of digits as a number)."""
        import pyarrow as pa

        def named(typ: Any) -> str | None:
            if pa.types.is_decimal(typ):
                return f"decimal({typ.precision},{typ.scale})"
            if pa.types.is_timestamp(typ):
                return f"timestamp[{typ.unit}" + (f", tz={typ.tz}]" if typ.tz else "]")
            if pa.types.is_date32(typ):
                return "date32"
            if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ) or pa.types.is_string(typ):
                return str(typ)
            return None

        return {"column_types": {f.name: t for f in like if (t := named(f.type)) is not None}}

    def _csv_options(self) -> Any:
        import pyarrow.csv as pacsv

        config = self.config
        assert isinstance(config, CsvSinkConfig)
        # quoting_style="needed" quotes every text value (and only those): "" is an empty string, a bare null_string NULL
        return pacsv.WriteOptions(include_header=config.header, delimiter=config.delimiter, null_string=config.null, quoting_style="needed")

    def _as_written(self, schema: Any) -> Any:
        """Decimals are written as text (Arrow writes 0E-10 for a decimal(38,10) zero; PostgreSQL 0.0000000000)."""
        import pyarrow as pa

        return pa.schema([f.with_type(pa.string()) if pa.types.is_decimal(f.type) or pa.types.is_string_view(f.type) else f for f in schema])

    def _chunks(self, batches: Iterable[Any]) -> Iterable[Any]:
        return self._formatted(batches)

    def _formatted(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Each batch with its decimals in plain notation, as DuckDB casts them to text (one query per batch,
        only where there are decimals)."""
        import duckdb
        import pyarrow as pa

        con = None
        try:
            for batch in batches:
                decimals = [i for i, f in enumerate(batch.schema) if pa.types.is_decimal(f.type)]
                views = [i for i, f in enumerate(batch.schema) if pa.types.is_string_view(f.type)]  # the CSV writer takes no views
                if views:
                    arrays = [c.cast(pa.string()) if i in views else c for i, c in enumerate(batch.columns)]
                    batch = pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
                if not decimals:
                    yield batch
                    continue
                if con is None:
                    con = duckdb.connect(config={"threads": 1})
                con.register("__conveyor_decimals", pa.Table.from_arrays([batch.column(i) for i in decimals], names=[f"c{i}" for i in decimals]))
                texts = con.execute("SELECT " + ", ".join(f"CAST(c{i} AS VARCHAR)" for i in decimals) + " FROM __conveyor_decimals").arrow()
                texts = texts.read_all() if hasattr(texts, "read_all") else texts  # a reader since DuckDB 1.4, a table before
                con.unregister("__conveyor_decimals")
                arrays = list(batch.columns)
                for j, i in enumerate(decimals):
                    arrays[i] = texts.column(j).combine_chunks().cast(pa.string())
                yield pa.RecordBatch.from_arrays(arrays, schema=self._as_written(batch.schema))
        finally:
            if con is not None:
                con.close()

    def _check_types(self, schema: Any) -> None:
        """Refuse, before a row moves, a column CSV cannot hold as text that reads back the same: bytes
        (written raw, NUL and all), durations (their unit is lost), and what the writer cannot write at
        all (uuid, lists, structs)."""
        import io

        import pyarrow as pa
        import pyarrow.csv as pacsv

        for column in schema:
            typ = column.type.storage_type if isinstance(column.type, pa.BaseExtensionType) else column.type
            why = ""
            if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
                why = "bytes have no text form that reads back as bytes"
            elif pa.types.is_string_view(typ):
                continue  # written as a plain string
            elif pa.types.is_duration(typ) or pa.types.is_interval(typ):
                why = "a duration is written as a bare number, without its unit"
            else:
                try:
                    pacsv.CSVWriter(io.BytesIO(), pa.schema([column]), write_options=self._csv_options()).close()
                except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
                    why = f"the CSV writer cannot write it ({exc})"
            if why:
                raise SchemaError(f"csv sink: column {column.name} ({column.type}): {why}",
                                  hint="cast it to text in the source (source.query: e.g. uuid::text, encode(b, 'hex')), or write Parquet")

    def _dataset_format(self) -> Any:
        import pyarrow.dataset as ds

        return ds.CsvFileFormat()

    def _dataset_options(self) -> Any:
        config = self.config
        assert isinstance(config, CsvSinkConfig)
        return self._dataset_format().make_write_options(include_header=config.header, delimiter=config.delimiter,
                                                         null_string=config.null, quoting_style="needed")
