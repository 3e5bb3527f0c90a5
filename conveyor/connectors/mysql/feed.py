"""The MySQL / MariaDB source as a change feed (:class:`~conveyor.core.changes.ChangeFeed`): a sync job's
session on one table (the job's named lock, the binlog's prerequisites), its first position, and each
later run's end position and the keys the binlog's row events touched up to it (``binlog.py``).

MySQL cannot share a snapshot between connections, so the rows a run reads (the first load's, in
parallel, and each run's changed keys') are read live, each partition at or after the run's position
``L``, and every change logged before ``L`` is committed by then (:func:`binlog.consistent`). A row
changed while it was read was changed after ``L``: the next run reads that key again. So after each
run every target row is the source's row as of ``L`` or later, the target equals the source
whenever the source was quiet while the run read, and nothing is lost or left stale for good. A first
load is followed at once by a run (``live = True``), which reads again what changed during the load.

The server keeps no position for the job (unlike a PostgreSQL slot): each target's state is the
position, and a run refuses by name when the binlog holding the changes since it was purged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.connectors.mysql import binlog
from conveyor.connectors.mysql.binlog import BinlogTable
from conveyor.core.changes import FeedTable, SyncState, TableChanges
from conveyor.errors import ConfigError, ConveyorError, SchemaError

#: the source settings that say which table: with the target's, the job's default name
_IDENTITY = ("host", "port", "database", "table")
#: how long a run waits for the job's lock before refusing (a killed run's session may take a moment to end)
LOCK_WAIT = 2


class MySqlChangeFeed:
    """The change feed side of :class:`~conveyor.connectors.mysql.source.MySqlSource`."""

    config: Any
    options: Any
    #: take positions under a global read lock even on MariaDB (what MySQL does; tests the MySQL path on MariaDB)
    lock_positions: bool = False

    def feed_slot(self, target_identity: str, settings: Any) -> str:
        from conveyor.connectors.postgres.replication import check_slot_name, slot_name

        if not self.config.table:
            raise ConfigError("incremental.method=replication reads a MySQL table's changes: set source.table (not a query)",
                              key="incremental.method")
        if settings.slot:
            return check_slot_name(settings.slot)
        plain = dataclasses.asdict(self.config)
        return slot_name("mysql" + json.dumps({k: plain.get(k) for k in _IDENTITY}, sort_keys=True, default=str), target_identity)

    @contextlib.contextmanager
    def change_feed(self, slot: str, settings: Any, exclusive: bool = True) -> Iterator[MySqlFeedSession]:
        con = self.config.connect()
        try:
            mariadb, base = binlog.check_server(con)
            binlog.probe(self.config)
            if exclusive:
                with con.cursor() as cur:  # one session of the job at a time, until this connection closes
                    cur.execute(f"SELECT GET_LOCK('conveyor_sync:{slot}', {LOCK_WAIT})")
                    if cur.fetchone()[0] != 1:
                        raise ConveyorError(f"sync: job {slot} is running in another process (it holds the job's lock on "
                                            f"{self.config.where()})", hint="wait for it to finish, or stop it; two runs of one "
                                                                             "job at once would apply the same changes twice")
            table = binlog.describe(self.config, self.config.table)
            yield MySqlFeedSession(self, con, slot, settings, mariadb, base, table)
        except ConveyorError:
            raise
        except Exception as exc:
            raise self.config.translate(exc, "opening the sync's session") from None
        finally:
            con.close()


class MySqlFeedSession:
    """:class:`~conveyor.core.changes.FeedSession` on a MySQL / MariaDB source (its connection holds the job's lock)."""

    #: the server keeps no position for the job: the targets' states are its position
    held_on_source = False
    #: the first load reads live rows (no snapshot to share): a run follows it at once
    live = True

    def __init__(self, source: Any, con: Any, slot: str, settings: Any, mariadb: bool, base: str, table: BinlogTable) -> None:
        self.source, self.con, self.slot, self.settings = source, con, slot, settings
        self.mariadb, self.base, self.table = mariadb, base, table
        self.tables = [FeedTable(table.schema, table.name, table.keys, table.signature)]

    def position(self) -> int | None:
        return binlog.oldest(self.con)

    def retained(self) -> int:
        return 0

    def _consistent(self) -> int:
        return binlog.consistent(self.source.config, self.mariadb, lock=self.source.lock_positions)

    @contextlib.contextmanager
    def first(self) -> Iterator[tuple[int, Any]]:
        yield self._consistent(), None

    def snapshot_source(self, snapshot: Any) -> Any:
        return self.source

    def check(self, states: Sequence[SyncState]) -> None:
        now = binlog.describe(self.source.config, self.table.name)
        for state in states:
            if state.signature != now.signature:
                raise SchemaError(f"sync of {self.table.label} stopped: the source table changed since the sync began: "
                                  f"{binlog.changed_columns(state.signature, now.signature)}",
                                  hint="change the target to match, then conveyor clean --drop (this job's settings) and run again: "
                                       "the first run loads the table again")
            binlog.check_held(self.con, self.base, state.position, self.table.label)

    @contextlib.contextmanager
    def run(self, since: int) -> Iterator[MySqlFeedRun]:
        upto = self._consistent()
        decoded = binlog.read(self.source.config, self.mariadb, self.base, self.table, since, upto)
        yield MySqlFeedRun(self, max(upto, since), decoded)

    def order(self) -> tuple[list[int], set[int]]:
        return [0], set()

    def text(self, position: int) -> str:
        return binlog.text(self.base, position)

    def drop(self) -> list[str]:
        return []  # the server keeps nothing for the job


class MySqlFeedRun:
    """:class:`~conveyor.core.changes.FeedRun`: the keys the binlog's row events touched up to ``upto``."""

    def __init__(self, session: MySqlFeedSession, upto: int, decoded: binlog.Decoded) -> None:
        self.session, self.upto, self.decoded = session, upto, decoded
        self.changes = decoded.changes

    def changed(self, table: FeedTable) -> TableChanges:
        return TableChanges(full=self.decoded.truncated, keys=0 if self.decoded.truncated else len(self.decoded.keys))

    def rows(self, table: FeedTable, parts: int, options: Any) -> Any:
        """The changed keys' rows, read now (each at or after ``upto``), as a source that splits itself into chunks of keys."""
        from conveyor.connectors.mysql.changedrows import MySqlChangedRows

        mine = self.session.table
        if self.decoded.truncated:
            return MySqlChangedRows(self.session.source, mine, None, options)
        keys = sorted(self.decoded.keys, key=_order)
        n = max(int(parts), 1)
        size = -(-len(keys) // n)
        return MySqlChangedRows(self.session.source, mine, [keys[i:i + size] for i in range(0, len(keys), size)], options)

    def advance(self) -> None:
        pass  # the targets' states are the job's position

    def lag(self) -> int:
        return binlog.bytes_between(self.session.con, self.upto)


def _order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A key's sort order (a NULL never is a key's part, but a decoded value's type may differ from another's)."""
    return tuple((0, v) if v is not None else (1, 0) for v in key)


__all__ = ["MySqlChangeFeed"]
