"""A sync run's changed rows as a PostgreSQL source that splits itself (``strategy=native``): one partition per chunk
of the changed keys, each a plain descriptor (the chunk's keys as array literals of their own types), rendered here as
the lookup of those keys' rows in the run's snapshot. The job that stages them runs these partitions on the job's
runtime like any other."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.connectors.postgres import replication
from conveyor.connectors.postgres.replication import SyncTable
from conveyor.connectors.postgres.source import PostgresSource
from conveyor.core import JobOptions, NativePartition, Partition, WholeSource


class ChangedRowsSource(PostgresSource):
    """The rows of a run's changed keys of one table (or, after a TRUNCATE, every row), each with ``_conveyor_present``."""

    def __init__(self, base: PostgresSource, table: SyncTable, chunks: Sequence[tuple[str, ...]] | None, snapshot: str,
                 options: JobOptions) -> None:
        # described as the lookup of no key: the columns every chunk's query has
        query = replication.whole_query(table) if chunks is None else replication.lookup_query(table, None)
        super().__init__(dataclasses.replace(base.config, table=None, tables=[], exclude=[], query=query), options)
        self.imported_snapshot = snapshot
        self.sync_table = table
        #: the changed keys (None: every row, after a TRUNCATE): with the table's bytes per row, the size the runtime
        #: decides by (runtime=auto runs a small change set in the driver rather than starting Ray for it)
        self.changed_keys = None if chunks is None else sum(len(c) for c in chunks)
        n = 1 if chunks is None else len(chunks)
        # handed to the strategy on the driver; not shipped with the source to the tasks (each partition carries its own)
        self._parts = [NativePartition(index=i, count=n, token=b"" if chunks is None else json.dumps(list(c)).encode(),
                                       label="every row (a TRUNCATE)" if chunks is None else f"changed keys, chunk {i + 1} of {n}")
                       for i, c in enumerate(chunks or [()])]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_parts"] = []
        return state

    def __copy__(self) -> ChangedRowsSource:  # the session's copy (copy.copy would go through __getstate__)
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def describe(self) -> Any:
        info = super().describe()
        from conveyor.connectors.postgres.common import connect

        con = connect(self.config, autocommit=True)
        try:
            size, rows = con.execute("SELECT pg_table_size(oid), reltuples FROM pg_class WHERE oid = %s", (self.sync_table.oid,)).fetchone()
        finally:
            con.close()
        per_row = int(size) / float(rows) if rows and float(rows) > 0 else 1024.0
        estimate = int(size) if self.changed_keys is None else int(self.changed_keys * per_row)
        return dataclasses.replace(info, estimated_rows=self.changed_keys, estimated_bytes=estimate)

    def native_partitions(self) -> list[NativePartition]:
        return list(self._parts)

    def _chunk(self, part: Partition) -> tuple[PostgresSource, Partition]:
        """A plain query source of ``part``'s rows (this source's description and snapshot), and its partition."""
        if not isinstance(part, NativePartition) or not part.token:
            return self, WholeSource(index=part.index, count=part.count)
        plain = copy.copy(self)
        plain.__class__ = PostgresSource
        plain.config = dataclasses.replace(self.config, query=replication.lookup_query(self.sync_table, json.loads(part.token)))
        return plain, WholeSource(index=part.index, count=part.count)

    def read(self, part: Partition) -> Iterator[Any]:
        source, whole = self._chunk(part)
        return PostgresSource.read(source, whole)

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> Any:
        source, whole = self._chunk(part)
        return PostgresSource.export_native(source, whole, columns)

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        counts = []
        for part in parts:
            source, whole = self._chunk(part)
            got = PostgresSource.count_rows(source, [whole])
            if got is None:
                return None
            counts.append(got[0])
        return counts


__all__ = ["ChangedRowsSource"]
