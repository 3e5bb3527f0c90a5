"""DuckDB source: a table or any SQL query of a database file (or of files, through DuckDB's readers),
streamed as Arrow batches by ``fetch_record_batch``; serves the keyed strategies."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.duckdb.common import close, connect, qident, qualified
from conveyor.core import JobOptions, Partition, SourceInfo
from conveyor.errors import ConnectError, SchemaError, TransferError
from conveyor.kit import fs as fs_util
from conveyor.kit.sql import Dialect, SqlSource


@dataclass
class DuckDBSourceConfig:
    #: the database file (":memory:" for an empty in-memory database, e.g. to query files)
    database: str = ":memory:"
    #: a table to read; or set ``query``
    table: str | None = None
    schema: str = "main"
    #: any SQL query (read_parquet('s3://...'), joins, ...); or set ``table``
    query: str | None = None
    #: open the file read-only, so several processes can read it at once
    read_only: bool = True
    #: fsspec filesystems registered with DuckDB, by protocol, with their storage options
    #: (DuckDB cannot download httpfs here; s3 is registered by itself when the query names s3://)
    filesystems: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: columns left out of the output (e.g. the ``filename`` column a datadriven split uses)
    drop_columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")


class DuckDBDialect(Dialect):
    name = "duckdb"

    def quantiles(self, column: str, fractions: str, relation: str) -> str | None:
        return f"SELECT quantile_disc({column}, [{fractions}]) FROM {relation}"


class DuckDBSource(SqlSource):
    """Rows of a DuckDB table or query, as Arrow batches; serves the keyed strategies."""

    config_class = DuckDBSourceConfig
    dialect = DuckDBDialect()

    def __init__(self, config: DuckDBSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._schema: Any = None

    def _base_sql(self) -> str:
        if self.config.query:
            return self.config.query
        return f"SELECT * FROM {qualified(self.config.schema, self.config.table or '')}"

    def _con(self) -> Any:
        read_only = self.config.read_only and self.config.database != ":memory:"
        con = connect(self.config.database, read_only=read_only)
        filesystems = dict(self.config.filesystems)
        if "s3://" in (self.config.query or "") and "s3" not in filesystems:
            filesystems["s3"] = {}
        for protocol, options in filesystems.items():
            fs, _ = fs_util.filesystem(f"{protocol}://", options)
            con.register_filesystem(fs)
        return con

    def _execute(self, con: Any, sql: str, params: list[Any] | None = None) -> Any:
        import duckdb

        try:
            return con.execute(sql, params or [])
        except duckdb.CatalogException as exc:
            raise SchemaError(f"duckdb source: {str(exc).splitlines()[0]}", hint="check source.table / source.query") from None
        except duckdb.IOException as exc:
            raise ConnectError(f"duckdb source: {str(exc).splitlines()[0]}", hint="check the files, the bucket and the credentials") from None
        except duckdb.Error as exc:
            raise SchemaError(f"duckdb source query failed: {str(exc).splitlines()[0]}") from None

    def _select(self, where: str = "") -> str:
        exclude = ""
        if self.config.drop_columns:
            exclude = f" EXCLUDE ({', '.join(qident(c) for c in self.config.drop_columns)})"
        return f"SELECT *{exclude} FROM ({self._base_sql()}) AS _conveyor_q{where}"

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        con = self._con()
        try:
            return self._execute(con, sql, params).fetchall()
        finally:
            close(con)

    def describe(self) -> SourceInfo:
        con = self._con()
        try:
            self._schema = self._execute(con, f"SELECT * FROM ({self._base_sql()}) AS _conveyor_q LIMIT 0").to_arrow_reader().schema
            schema = self._execute(con, self._select() + " LIMIT 0").to_arrow_reader().schema
            rows = None
            if self.config.table:
                rows = self._execute(con, f"SELECT count(*) FROM {qualified(self.config.schema, self.config.table)}").fetchone()[0]
        finally:
            close(con)
        what = f"table {self.config.schema}.{self.config.table}" if self.config.table else "query"
        return SourceInfo(schema=schema, label=f"duckdb {what} in {self.config.database}", estimated_rows=rows)

    # --- capabilities for the keyed strategies -------------------------------------------------

    def _relation(self) -> str:
        return f"({self._base_sql()}) AS _q"

    # --- reading -------------------------------------------------------------------------------

    def read(self, part: Partition) -> Iterator[Any]:
        where, params = self._predicate(part)
        con = self._con()
        try:
            reader = self._execute(con, self._select(where), params).to_arrow_reader(self.options.batch_size)
            try:
                yield from reader
            except Exception as exc:  # raised by DuckDB while it scans (a damaged file, a lost connection)
                raise TransferError(f"duckdb source {part.key}: {str(exc).splitlines()[0]}", partition=part.key) from None
        finally:
            close(con)
