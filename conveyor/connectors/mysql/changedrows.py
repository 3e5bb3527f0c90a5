"""A MySQL sync run's changed rows as a source that splits itself (``strategy=native``): one partition per
chunk of the changed keys, each a plain descriptor (the chunk's keys as a JSON array), read as the
lookup of those keys' rows: ``JSON_TABLE`` of the keys, typed as the key's own columns, joined to the
table by its primary key; a key whose row is gone has NULL columns and ``_conveyor_present`` false."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from conveyor.connectors.mysql.binlog import BinlogTable, key_json
from conveyor.connectors.mysql.common import MYSQL_DIALECT, qident
from conveyor.connectors.mysql.source import MySqlSource
from conveyor.core import JobOptions, NativePartition, Partition, WholeSource
from conveyor.kit.changedrows import ChunkedRows

PRESENT = "_conveyor_present"


def lookup_query(table: BinlogTable, keys_json: str) -> str:
    """The rows of the keys in ``keys_json`` as the table holds them now, each key once."""
    own = f"{qident(table.schema)}.{qident(table.name)}"
    typed = ", ".join(f"{qident(table.columns[i][0])} {table.columns[i][1]} PATH '$[{n}]'" for n, i in enumerate(table.key_at))
    cols = ", ".join(f"k.{qident(c)}" if c in table.keys else f"t.{qident(c)}" for c, _, _ in table.columns)
    on = " AND ".join(f"t.{qident(k)} = k.{qident(k)}" for k in table.keys)
    return (f"SELECT {cols}, t.{qident(table.keys[0])} IS NOT NULL AS {PRESENT} "
            f"FROM JSON_TABLE({MYSQL_DIALECT.literal(keys_json)}, '$[*]' COLUMNS ({typed})) AS k LEFT JOIN {own} AS t ON {on}")


def whole_query(table: BinlogTable) -> str:
    """Every row of the table, each present (a TRUNCATE in the changes: the target is loaded again)."""
    return (f"SELECT {', '.join(qident(c) for c, _, _ in table.columns)}, TRUE AS {PRESENT} "
            f"FROM {qident(table.schema)}.{qident(table.name)}")


class MySqlChangedRows(ChunkedRows, MySqlSource):
    """The rows of a run's changed keys of one table (or, after a TRUNCATE, every row), each with ``_conveyor_present``."""

    _base = MySqlSource

    def __init__(self, base: MySqlSource, table: BinlogTable, chunks: Sequence[Sequence[tuple[Any, ...]]] | None,
                 options: JobOptions) -> None:
        first = whole_query(table) if chunks is None else lookup_query(table, "[]")
        super().__init__(dataclasses.replace(base.config, table=None, query=first), options)
        self.sync_table = table
        self.changed_keys = None if chunks is None else sum(len(c) for c in chunks)
        n = 1 if chunks is None else len(chunks)
        # handed to the strategy on the driver; not shipped with the source to the tasks (each partition carries its own)
        self._parts = [NativePartition(index=i, count=n, token=b"" if chunks is None else key_json(c).encode(),
                                       label="every row (a TRUNCATE)" if chunks is None else f"changed keys, chunk {i + 1} of {n}")
                       for i, c in enumerate(chunks or [()])]

    def describe(self) -> Any:
        import pyarrow as pa

        info = super().describe()
        # MySQL has no boolean: the flag is read as 0/1 and carried as Arrow's bool (the stage's column)
        self._schema = pa.schema([pa.field(f.name, pa.bool_()) if f.name == PRESENT else f for f in self._schema])
        rows = self.config.run("SELECT data_length, table_rows FROM information_schema.tables WHERE table_schema = DATABASE() "
                               f"AND table_name = {MYSQL_DIALECT.literal(self.sync_table.name)}", doing="describing the source")
        size, count = (int(rows[0][0] or 0), int(rows[0][1] or 0)) if rows else (0, 0)
        per_row = size / count if count else 1024.0
        estimate = size if self.changed_keys is None else int(self.changed_keys * per_row)
        return dataclasses.replace(info, schema=self._schema, estimated_rows=self.changed_keys, estimated_bytes=estimate,
                                   primary_key=self.sync_table.keys, definition=None)

    def _chunk(self, part: Partition) -> tuple[MySqlSource, Partition]:
        """A plain query source of ``part``'s rows (this source's description), and its partition."""
        if self._schema is None:  # described here (a task's copy): the flag's type is this source's
            self.describe()
        if not isinstance(part, NativePartition) or not part.token:
            return self, WholeSource(index=part.index, count=part.count)
        plain = copy.copy(self)
        plain.__class__ = MySqlSource
        plain.config = dataclasses.replace(self.config, query=lookup_query(self.sync_table, part.token.decode()))
        return plain, WholeSource(index=part.index, count=part.count)


__all__ = ["MySqlChangedRows"]
