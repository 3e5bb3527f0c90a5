"""MySQL / MariaDB source and sink (``source=mysql``, ``sink=mysql``).

Rows travel through DuckDB's mysql extension (C++; the ``duckdb-extension-mysql`` wheel, installed
offline): a partition's SELECT runs on the server and its result is decoded into Arrow batches
(``mysql_query``); a sink partition's batches are inserted in one MySQL transaction. Planning,
DDL and the final swap use PyMySQL (a few small statements; no rows pass through Python).

Consistency: MySQL cannot share a snapshot between connections. Each partition is one SELECT,
which InnoDB answers from one consistent read view; different partitions start at different
times, so a table written during the copy may be read at different moments by different
partitions (use one partition, ``strategy=none``, for a copy consistent as of one moment).

Types (source): integers signed and unsigned (BIGINT UNSIGNED as uint64, exact), DECIMAL(p,s) up to
38 digits (wider: refused by name), FLOAT/DOUBLE, BIT(1)/BOOL as bool, CHAR/VARCHAR/TEXT (utf8mb4),
BLOB/BINARY, DATE, DATETIME(6), TIMESTAMP (read as the UTC instant), TIME, YEAR, JSON, ENUM and
SET (as text). Values DuckDB cannot hold are refused by name, never changed (``_UNFIT``).
"""

from conveyor.connectors.mysql.sink import MySqlSink, MySqlSinkConfig
from conveyor.connectors.mysql.source import MySqlSource, MySqlSourceConfig

__all__ = ["MySqlSink", "MySqlSinkConfig", "MySqlSource", "MySqlSourceConfig"]
