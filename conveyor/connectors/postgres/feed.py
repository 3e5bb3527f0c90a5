"""The PostgreSQL source as a change feed (:class:`~conveyor.core.changes.ChangeFeed`): a sync job's
session on its source (its lock, its tables, its slot), its first position with the snapshot the
first load reads, and each later run's end position with a snapshot of it, the keys the changes
touched and a source of those keys' rows. The logical replication itself is
:mod:`conveyor.connectors.postgres.replication`."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.connectors.postgres import replication
from conveyor.connectors.postgres.common import connect
from conveyor.connectors.postgres.replication import SyncTable, lsn_text
from conveyor.core.changes import FeedTable, SyncState, TableChanges
from conveyor.errors import ConfigError, ConveyorError, SchemaError
from conveyor.log import note

if TYPE_CHECKING:
    from conveyor.connectors.postgres.pgoutput import TableKeys

#: the source settings that say which tables: with the target's, the slot's default name
_IDENTITY = ("host", "port", "dbname", "database", "path", "schema", "table", "tables", "exclude")


class PgChangeFeed:
    """The change feed side of :class:`~conveyor.connectors.postgres.source.PostgresSource`."""

    config: Any
    options: Any
    imported_snapshot: str | None

    def feed_slot(self, target_identity: str, settings: Any) -> str:
        if self.config.query:
            raise ConfigError("incremental.method=replication reads a PostgreSQL table's changes: the source must be postgres with "
                              "source.table or source.tables (not a query, not columns/rename)", key="incremental.method")
        if settings.slot:
            return replication.check_slot_name(settings.slot)
        plain = dataclasses.asdict(self.config)
        mine = json.dumps({k: plain.get(k) for k in _IDENTITY if k in plain}, sort_keys=True, default=str)
        return replication.slot_name(mine, target_identity)

    @contextlib.contextmanager
    def change_feed(self, slot: str, settings: Any, exclusive: bool = True) -> Iterator[PgFeedSession]:
        _readers_warm()  # while the session opens and the targets' states are read
        con = connect(self.config, autocommit=True)
        try:
            replication.check_source(con, self.config.where())
            if exclusive:
                replication.lock(con, slot)  # one session of the job at a time, until this connection closes
            version = int(con.execute("SHOW server_version_num").fetchone()[0])
            many = self.many()  # type: ignore[attr-defined]
            names = [(t.schema, t.name) for t in self.tables()] if many else [(self.config.schema, self.config.table)]  # type: ignore[attr-defined]
            tables = [replication.describe(con, schema, name, version) for schema, name in names]
            yield PgFeedSession(self, con, slot, settings, version, tables)
        finally:
            con.close()


class PgFeedSession:
    """:class:`~conveyor.core.changes.FeedSession` on a PostgreSQL source (its connection holds the job's lock)."""

    #: the slot keeps the job's position on the source; the first load reads the slot's exported snapshot
    held_on_source = True
    live = False

    def __init__(self, source: Any, con: Any, slot: str, settings: Any, version: int, tables: list[SyncTable]) -> None:
        self.source, self.con, self.slot, self.settings, self.version = source, con, slot, settings, version
        self._tables = tables
        self.tables = [FeedTable(t.schema, t.name, t.keys, t.signature) for t in tables]

    def position(self) -> int | None:
        held = replication.slot_state(self.con, self.slot)
        return None if held is None else held[0]

    def retained(self) -> int:
        return (replication.slot_state(self.con, self.slot) or (0, 0))[1]

    @contextlib.contextmanager
    def first(self) -> Iterator[tuple[int, Any]]:
        for dropped in replication.drop(self.con, self.slot):
            note(f"sync: dropped {dropped} (its first load had not finished)")
        replication.publish(self.con, self.slot, self._tables, self.version)  # before the slot: pgoutput reads it as of each change
        try:
            with replication.exported(self.source.config, self.slot, temporary=False,
                                      wait_timeout=self.settings.wait_timeout) as (position, snapshot):
                yield position, snapshot
        except BaseException:
            with contextlib.suppress(Exception):  # a first load that failed holds no WAL back on the source
                replication.drop(self.con, self.slot)
            raise

    def snapshot_source(self, snapshot: Any) -> Any:
        source = copy.copy(self.source)
        source.imported_snapshot = snapshot
        return source

    def check(self, states: Sequence[SyncState]) -> None:
        replication.check_published(self.con, self.slot, self._tables, self.version)
        for table, state in zip(self._tables, states):
            now = replication.describe(self.con, table.schema, table.name, self.version)
            if state.signature != now.signature:
                raise SchemaError(f"sync of {table.label} stopped: the source table changed since the sync began: "
                                  f"{replication.changed_columns(state.signature, now.signature)}",
                                  hint="change the target to match, then conveyor clean --drop (this job's settings) and run again: "
                                       "the first run loads the table again")

    @contextlib.contextmanager
    def run(self, since: int) -> Iterator[PgFeedRun]:
        temporary = f"conveyor_run_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with replication.exported(self.source.config, temporary, temporary=True, wait_timeout=self.settings.wait_timeout) as (upto, snapshot):
            confirmed = self.position() or 0
            if confirmed > since:
                raise ConveyorError(f"sync: slot {self.slot} is at {lsn_text(confirmed)}, past the changes the target holds "
                                    f"({lsn_text(since)}): something else consumed the changes between",
                                    hint=f"conveyor clean --drop (this job's settings) drops slot {self.slot}; the next run loads "
                                         "the tables again")
            if since > confirmed:  # the last run committed and stopped before it moved the slot
                note(f"sync: the targets hold the changes up to {lsn_text(since)}: slot {self.slot} advanced to it")
                replication.advance(self.con, self.slot, since)
            changes, keys = replication.collect(self.source.config, self.slot, upto, self._tables)
            yield PgFeedRun(self, upto, snapshot, changes, keys, max(confirmed, since))

    def order(self) -> tuple[list[int], set[int]]:
        return replication.parents_first(self.con, self._tables)

    def text(self, position: int) -> str:
        return lsn_text(position)

    def drop(self) -> list[str]:
        return replication.drop(self.con, self.slot)


_WARM: list[threading.Thread] = []


def _readers_warm() -> None:
    """Import what reads the changes (NumPy and ADBC: ~0.1-0.2 s) in a thread of its own, once per process. Not a
    daemon: a process that ends meanwhile waits for the imports at exit (never finalised inside one)."""
    if _WARM:
        return

    def run() -> None:
        with contextlib.suppress(Exception):  # what fails is met again, and said, by the run's own import
            import adbc_driver_manager  # noqa: F401
            import adbc_driver_postgresql  # noqa: F401
            import numpy  # noqa: F401

    _WARM.append(threading.Thread(target=run, name="conveyor-sync-warm-up", daemon=False))
    _WARM[0].start()


class PgFeedRun:
    """:class:`~conveyor.core.changes.FeedRun`: the keys the changes touched, each table's into a temporary table of the
    session as it is asked for."""

    def __init__(self, session: PgFeedSession, upto: int, snapshot: str, changes: int, keys: dict[int, TableKeys], held: int) -> None:
        self.session, self.upto, self.snapshot, self.changes, self._held = session, upto, snapshot, changes, held
        self._keys = keys
        self._full: set[str] = set()
        self._counts: dict[str, int] = {}  # the changed keys of each table asked for

    def _table(self, table: FeedTable) -> SyncTable:
        return next(t for t in self.session._tables if t.label == table.label)

    def changed(self, table: FeedTable) -> TableChanges:
        con, mine = self.session.con, self._table(table)
        keys = self._keys.get(mine.oid)
        if keys is not None and keys.truncated:
            self._full.add(table.label)
            return TableChanges(full=True, keys=0)
        self._counts[table.label] = replication.changed_keys(con, mine, keys)
        return TableChanges(full=False, keys=self._counts[table.label])

    def rows(self, table: FeedTable, parts: int, options: Any) -> Any:
        """The changed keys' rows as a source that splits itself into ``parts`` partitions (more where a chunk would pass
        ``incremental.chunk_keys``), in the run's snapshot. Called after :meth:`changed` of that table (the keys are in
        the session's temporary table)."""
        from conveyor.connectors.postgres.changedrows import ChangedRowsSource

        mine = self._table(table)
        if table.label in self._full:  # a TRUNCATE in the changes: every row, each present
            return ChangedRowsSource(self.session.source, mine, None, self.snapshot, options)
        chunks = replication.key_chunks(self.session.con, mine, max(int(parts), 1), self._counts[table.label], self._keys.get(mine.oid))
        return ChangedRowsSource(self.session.source, mine, chunks, self.snapshot, options)

    def advance(self) -> None:
        if self.upto > self._held:
            replication.advance(self.session.con, self.session.slot, self.upto)

    def lag(self) -> int:
        return max(int(self.session.con.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint",
                                                (lsn_text(self.upto),)).fetchone()[0]), 0)


__all__ = ["PgChangeFeed"]
