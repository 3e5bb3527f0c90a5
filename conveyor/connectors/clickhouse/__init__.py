"""ClickHouse source and sink (``source=clickhouse``, ``sink=clickhouse``), over the HTTP interface.

``common``: connection settings, errors, the SQL dialect. ``types``: ClickHouse <-> Arrow types.
``native``: the Native format <-> Arrow, with numpy and Arrow compute. ``source``: a table or query
read by partitions. ``sink``: a table per partition, moved or swapped in whole. ``commits``: exactly
once without transactions (markers, the driver's beat).
"""

from typing import TYPE_CHECKING

from conveyor.registry import lazy_exports

if TYPE_CHECKING:
    from conveyor.connectors.clickhouse.sink import ClickHouseSink, ClickHouseSinkConfig
    from conveyor.connectors.clickhouse.source import ClickHouseSource, ClickHouseSourceConfig

__getattr__ = lazy_exports(__name__, sink=("ClickHouseSink", "ClickHouseSinkConfig"),
                           source=("ClickHouseSource", "ClickHouseSourceConfig"))
__all__ = ["ClickHouseSink", "ClickHouseSinkConfig", "ClickHouseSource", "ClickHouseSourceConfig"]
