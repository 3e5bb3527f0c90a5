"""ADBC source: a table or a query through any driver; native partitions where the driver
executes partitioned, the keyed strategies through the shared SQL base."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conveyor.connectors.adbc.common import AdbcBase, AdbcDialect, AdbcSourceConfig, qident
from conveyor.core import JobOptions, NativePartition, Partition, SourceInfo
from conveyor.errors import ConveyorError
from conveyor.kit.arrowutil import CountingBatches, rebatch
from conveyor.kit.sql import SqlSource


class AdbcSource(AdbcBase, SqlSource):
    """Reads a table or query through any ADBC driver."""

    config_class = AdbcSourceConfig

    def __init__(self, config: AdbcSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._schema: Any = None
        self.dialect = AdbcDialect(config.driver)

    def _sql(self) -> str:
        if self.config.query:
            return self.config.query
        table = qident(self.config.table or "")
        return f"SELECT * FROM {qident(self.config.db_schema) + '.' if self.config.db_schema else ''}{table}"

    def _from(self) -> str:
        return f"({self._sql()}) AS _conveyor_q"

    def describe(self) -> SourceInfo:
        """The schema: the table's declared one, or (for a query) that of its first rows.

        Some drivers (SQLite) type columns from the data they see; every batch read is cast to
        this schema, so all partitions agree.
        """
        conn = self._connect()
        cur = conn.cursor()
        try:
            try:
                if self.config.table:
                    self._schema = conn.adbc_get_table_schema(self.config.table, db_schema_filter=self.config.db_schema)
                else:
                    cur.execute(f"SELECT * FROM {self._from()} LIMIT 1000")
                    self._schema = cur.fetch_record_batch().schema
            except Exception as exc:
                raise self._translate(exc, "describing the source") from None
        finally:
            cur.close()
            conn.close()
        what = f"table {self.config.table}" if self.config.table else "query"
        return SourceInfo(schema=self._schema, label=f"adbc {self.config.driver} {what}")

    # --- partitions --------------------------------------------------------------------------

    def native_partitions(self) -> list[NativePartition]:
        conn = self._connect()
        cur = conn.cursor()
        try:
            try:
                descriptors, _ = cur.adbc_execute_partitions(self._sql())
            except Exception as exc:
                if "NOT_IMPLEMENTED" in str(exc) or type(exc).__name__ == "NotSupportedError":
                    from conveyor.errors import PlanningError

                    raise PlanningError(f"strategy=native: the {self.config.driver} driver has no partitioned execution",
                                        hint="use strategy=none, rangeid, ntile, random or datadriven") from None
                raise self._translate(exc, "partitioning the query") from None
        finally:
            cur.close()
            conn.close()
        n = len(descriptors)
        return [NativePartition(index=i, count=n, token=bytes(d), label=f"driver partition {i + 1} of {n}") for i, d in enumerate(descriptors)]

    def _relation(self) -> str:
        return self._from()

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params)

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        """Each partition's row count in one scan (None for driver partitions, which cannot be counted)."""
        if any(isinstance(p, NativePartition) for p in parts):
            return None
        return SqlSource.count_rows(self, parts)

    # --- reading -------------------------------------------------------------------------------

    def read(self, part: Partition) -> Iterator[Any]:
        conn = self._connect(part.key)
        cur = conn.cursor()
        try:
            try:
                if isinstance(part, NativePartition):
                    reader = cur.adbc_read_partition(part.token)
                else:
                    where, params = self._predicate(part)
                    cur.execute(f"SELECT * FROM {self._from()}{where}", parameters=params or None)
                    reader = cur.fetch_record_batch()
                if self._schema is None:
                    self.describe()
                yield from rebatch(CountingBatches(reader, self._schema), self.options.batch_size)
            except ConveyorError:
                raise
            except Exception as exc:
                raise self._translate(exc, f"reading {part.key}", part.key) from None
        finally:
            cur.close()
            with contextlib.suppress(Exception):
                conn.rollback()
            conn.close()
