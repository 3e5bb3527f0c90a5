"""The MySQL sink's side of a sync job: :class:`~conveyor.kit.syncapply.SqlChangeApplier` in MySQL's spelling."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conveyor.connectors.mysql.common import Statements
from conveyor.kit.syncapply import SqlChangeApplier


class MyChangeApplier(SqlChangeApplier):
    config: Any
    _sync_mysql = True
    # the stage is created as the first load created the target (a timestamptz as UTC DATETIME(6), ...); what the
    # target then holds is compared with it value by value in the apply
    _stage_mode = "replace"

    @contextlib.contextmanager
    def _sync_connection(self) -> Iterator[Any]:
        con = self.config.connect()  # autocommit: BEGIN / COMMIT are the applier's
        try:
            yield Statements(con)
        finally:
            con.close()

    @property
    def _sync_target(self) -> str:
        return f"{self.config.database}.{self.config.table}"

    def _stage_sql(self, stage: str) -> list[str]:
        return [f"DROP TABLE IF EXISTS {self._qualified(stage)}"]
