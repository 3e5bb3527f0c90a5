"""A sync run's changed rows as a PostgreSQL source that splits itself (``strategy=native``): one partition per chunk
of the changed keys, each a plain descriptor (the chunk's keys as array literals of their own types), rendered here as
the lookup of those keys' rows in the run's snapshot. The job that stages them runs these partitions on the job's
runtime like any other."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from conveyor.connectors.postgres import replication
from conveyor.connectors.postgres.replication import SyncTable
from conveyor.connectors.postgres.source import PostgresSource
from conveyor.core import JobOptions, NativePartition, Partition, WholeSource
from conveyor.kit.changedrows import ChunkedRows


class ChangedRowsSource(ChunkedRows, PostgresSource):
    """The rows of a run's changed keys of one table (or, after a TRUNCATE, every row), each with ``_conveyor_present``."""

    _base = PostgresSource

    def __init__(self, base: PostgresSource, table: SyncTable, chunks: Sequence[tuple[str, ...]] | None, snapshot: str,
                 options: JobOptions) -> None:
        # described as the lookup of no key: the columns every chunk's query has
        query = replication.whole_query(table) if chunks is None else replication.lookup_query(table, None)
        super().__init__(dataclasses.replace(base.config, table=None, tables=[], exclude=[], query=query,
                                             options=lookup_options(base.config.options)), options)
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

    def _chunk(self, part: Partition) -> tuple[PostgresSource, Partition]:
        """A plain query source of ``part``'s rows (this source's description and snapshot), and its partition."""
        if not isinstance(part, NativePartition) or not part.token:
            return self, WholeSource(index=part.index, count=part.count)
        plain = copy.copy(self)
        plain.__class__ = PostgresSource
        plain.config = dataclasses.replace(self.config, query=replication.lookup_query(self.sync_table, json.loads(part.token)))
        return plain, WholeSource(index=part.index, count=part.count)


#: the settings of the lookups' sessions: no JIT (the planner's estimate of a chunk's index lookups passes
#: jit_optimize_above_cost, and compiling cost a good share of the lookup), and a chunk's keys put in order in memory, not
#: in a merge sort on disk (work_mem's 4 MB default); measured in benchmarks/results/2026-12-06-sf1-sync-1394093.md
LOOKUP_SETTINGS = "-c jit=off -c work_mem=64MB"


def lookup_options(options: dict[str, str] | None) -> dict[str, str]:
    """``source.options`` with :data:`LOOKUP_SETTINGS` before the user's own ``options`` (a setting of theirs wins)."""
    given = dict(options or {})
    given["options"] = f"{LOOKUP_SETTINGS} {given['options']}" if given.get("options") else LOOKUP_SETTINGS
    return given


__all__ = ["ChangedRowsSource"]
