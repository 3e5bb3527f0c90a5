"""The DuckDB sink's side of a sync job: :class:`~conveyor.kit.syncapply.SqlChangeApplier` in DuckDB's spelling."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conveyor.connectors.duckdb.common import close, connect
from conveyor.kit.syncapply import SqlChangeApplier


class DuckChangeApplier(SqlChangeApplier):
    config: Any
    # the stage is created as the first load created the target; what the target then holds is compared with it value by value
    stage_load_mode = "replace"

    @contextlib.contextmanager
    def _sync_connection(self) -> Iterator[Any]:
        con = connect(self.config.database)
        try:
            yield con
        finally:
            close(con)

    @property
    def _sync_target(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    def _stage_sql(self, stage: str) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self._qualified(stage)}"]

    # DuckDB has no row locks: a second apply's write of the state row conflicts with the first's at its commit
    _for_update = ""

    def _conflict(self, exc: Exception) -> bool:
        import duckdb

        return isinstance(exc, duckdb.TransactionException) and "conflict" in str(exc).lower()

    def _rowcount(self, cursor: Any) -> int:
        return int(cursor.fetchone()[0])  # DuckDB answers a DELETE or UPDATE with its count
