"""DuckDB: a source (a table or any SQL query) and a sink (a table in a database file)."""

from conveyor.connectors.duckdb.sink import DuckDBSink, DuckDBSinkConfig
from conveyor.connectors.duckdb.source import DuckDBSource, DuckDBSourceConfig

__all__ = ["DuckDBSink", "DuckDBSinkConfig", "DuckDBSource", "DuckDBSourceConfig"]
