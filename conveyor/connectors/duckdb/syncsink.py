"""The DuckDB sink's side of a sync job: :class:`~conveyor.kit.syncapply.SqlChangeApplier` in DuckDB's spelling."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conveyor.connectors.duckdb.common import close, connect, qident
from conveyor.kit.syncapply import PRESENT, SqlChangeApplier


class DuckChangeApplier(SqlChangeApplier):
    config: Any

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
        return [f"CREATE OR REPLACE TABLE {self._qualified(stage)} AS SELECT *, CAST(NULL AS BOOLEAN) AS {qident(PRESENT)} "
                f"FROM {self._qualified()} LIMIT 0"]
