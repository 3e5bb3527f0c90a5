"""PostgreSQL source and sink (binary COPY through ADBC, and a binary COPY pass-through)."""

from typing import TYPE_CHECKING

from conveyor.registry import lazy_exports

if TYPE_CHECKING:
    from conveyor.connectors.postgres.sink import PostgresSink, PostgresSinkConfig
    from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig

__getattr__ = lazy_exports(__name__, sink=("PostgresSink", "PostgresSinkConfig"), source=("PostgresSource", "PostgresSourceConfig"))
__all__ = ["PostgresSink", "PostgresSinkConfig", "PostgresSource", "PostgresSourceConfig"]
