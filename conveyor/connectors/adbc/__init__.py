"""Any ADBC driver, by name: ``driver: sqlite`` loads ``adbc_driver_sqlite`` (package
``adbc-driver-sqlite``), ``postgresql``, ``flightsql``, ``snowflake``, ... whichever is installed.

Source: a table or a query; results arrive as Arrow from the driver. Where the driver offers
partitioned execution (``adbc_execute_partitions``, e.g. Flight SQL), ``strategy=native``
makes one partition per descriptor; the keyed strategies (rangeid, ntile, random,
datadriven) work through standard SQL with bound parameters.

Sink: ``adbc_ingest``, one transaction per partition. append ingests into the target;
create, replace and truncate load a staging table and swap it in with standard SQL at the
end; a driver that cannot do a step says so, naming the mode.
"""

from conveyor.connectors.adbc.common import AdbcConfig, AdbcDialect, AdbcSinkConfig, AdbcSourceConfig, _module
from conveyor.connectors.adbc.sink import AdbcSink
from conveyor.connectors.adbc.source import AdbcSource

__all__ = ["AdbcConfig", "AdbcDialect", "AdbcSink", "AdbcSinkConfig", "AdbcSource", "AdbcSourceConfig", "_module"]
