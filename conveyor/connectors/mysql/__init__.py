"""MySQL / MariaDB source and sink (``source=mysql``, ``sink=mysql``).

``common``: connection settings, errors, the SQL dialect, one DuckDB per process with the server
attached. ``source``: rows read through DuckDB's mysql extension (its docstring says what is read
exactly and what is consistent). ``sink``: LOAD DATA LOCAL INFILE (or INSERTs), one InnoDB
transaction per partition. ``commits``: exactly once (commit markers, the driver's guard).
"""

from typing import TYPE_CHECKING

from conveyor.registry import lazy_exports

if TYPE_CHECKING:
    from conveyor.connectors.mysql.sink import MySqlSink, MySqlSinkConfig
    from conveyor.connectors.mysql.source import MySqlSource, MySqlSourceConfig

__getattr__ = lazy_exports(__name__, sink=("MySqlSink", "MySqlSinkConfig"), source=("MySqlSource", "MySqlSourceConfig"))
__all__ = ["MySqlSink", "MySqlSinkConfig", "MySqlSource", "MySqlSourceConfig"]
