"""The MySQL sink's side of a sync job: :class:`~conveyor.kit.syncapply.SqlChangeApplier` in MySQL's spelling."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from conveyor.connectors.mysql.common import Statements
from conveyor.kit.syncapply import SqlChangeApplier, _text


class MyChangeApplier(SqlChangeApplier):
    config: Any
    _sync_mysql = True
    _rows_counted = False
    # the stage is created as the first load created the target (a timestamptz as UTC DATETIME(6), ...); what the
    # target then holds is compared with it value by value in the apply
    stage_load_mode = "replace"

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

    def _outside_possible(self, con: Any) -> bool:
        # a trigger on the target, or a foreign key whose action changes rows (CASCADE, SET NULL, SET DEFAULT) into or out of it
        database, table = (_text(v, True) for v in (self.config.database, self.config.table))
        row = con.execute(f"SELECT (SELECT count(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = {database} AND "
                          f"EVENT_OBJECT_TABLE = {table}) + (SELECT count(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE "
                          f"CONSTRAINT_SCHEMA = {database} AND (TABLE_NAME = {table} OR REFERENCED_TABLE_NAME = {table}) AND "
                          "(DELETE_RULE NOT IN ('RESTRICT', 'NO ACTION') OR UPDATE_RULE NOT IN ('RESTRICT', 'NO ACTION')))").fetchone()
        return bool(row[0])
