"""PostgreSQL source and sink (binary COPY through ADBC, and a binary COPY pass-through)."""

from conveyor.connectors.postgres.sink import PostgresSink, PostgresSinkConfig
from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig

__all__ = ["PostgresSink", "PostgresSinkConfig", "PostgresSource", "PostgresSourceConfig"]
