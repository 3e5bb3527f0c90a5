"""Logical replication for sync jobs (``incremental.method=replication``): the job's slot and
publication, the snapshot a run reads, the keys the changes since the target's position touched.

The slot decodes with ``pgoutput`` (built into PostgreSQL 10+: nothing to install on the source)
and the job's publication lists each table whole: a column list (15+) would carry only the keys, but
PostgreSQL then refuses the table's own UPDATE and DELETE as soon as its replica identity needs a
column the list leaves out (``REPLICA IDENTITY FULL``), and a data mover must never make its source
refuse writes. What a run takes of the changes is *which keys* changed, read
from the binary messages column-wise as they stream to the client (never per row in Python); the rows
those keys hold are then read by the job's exact readers in a snapshot exported at a position
``L`` (a temporary slot made with ``EXPORT_SNAPSHOT``): every transaction that committed before
``L`` is in the snapshot and every later one is decoded by the next run. A key read twice (a change
decoded again after a kill) is rewritten with the same row: applying is idempotent, so the target,
its position and the slot agree after any failure once a run completes.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.connectors.postgres.common import PgConnConfig, connect, ident, literal, translate
from conveyor.errors import ConfigError, ConveyorError, SchemaError

if TYPE_CHECKING:  # NumPy is imported by a run that reads changes, not by every job that loads this module
    from conveyor.connectors.postgres import pgoutput

#: the column the rows query adds: true where the key's row exists at the run's position
PRESENT = "_conveyor_present"


def lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(n: int) -> str:
    return f"{n >> 32:X}/{n & 0xFFFFFFFF:X}"


def slot_name(source: str, target: str) -> str:
    """The default slot (and publication) of a sync job: one per source and target pair."""
    return "conveyor_" + hashlib.sha1(f"{source}\n{target}".encode()).hexdigest()[:16]


def check_slot_name(name: str) -> str:
    """A slot's name as the server takes it: lower-case letters, digits and underscores, at most 63."""
    import re

    if not re.fullmatch(r"[a-z0-9_]{1,63}", name):
        raise ConfigError(f"incremental.slot: {name!r} is not a slot name", key="incremental.slot",
                          hint="lower-case letters, digits and underscores, at most 63 of them")
    return name


@dataclass(frozen=True)
class SyncTable:
    """A source table as a sync job sees it."""

    schema: str
    name: str
    oid: int
    #: its primary key's columns and their types (format_type), in key order
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    #: every column, in the table's order, and the columns the publication carries (attnum order)
    columns: tuple[str, ...]
    published: tuple[str, ...]
    #: the columns, their types and the key, as one line: a change of it stops the sync
    signature: str
    #: pg_class.relkind: r (a table), p (partitioned)
    relkind: str = "r"
    #: each key column's collation where it is not its type's own (" COLLATE ..."), else "": keys equal under it are one key
    key_collations: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def qualified(self) -> str:
        return ident(self.schema, self.name)

    @property
    def own(self) -> str:
        """The table as a FROM item of its own rows (an inheritance parent's children are tables of their own)."""
        return ("ONLY " if self.relkind == "r" else "") + self.qualified


def check_source(con: Any, where: str) -> None:
    """What a sync job needs of its source server, each missing one said with its fix."""
    level = con.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        raise ConfigError(f"incremental.method=replication: {where} has wal_level={level}; a sync job reads the source's changes "
                          "by logical decoding, which needs wal_level=logical", key="incremental.method",
                          hint="ALTER SYSTEM SET wal_level = logical, then restart the server (on a managed service: its logical "
                               "replication setting, e.g. rds.logical_replication=1 on Amazon RDS)")
    allowed = con.execute("SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user").fetchone()
    if not allowed or not allowed[0]:
        raise ConfigError(f"incremental.method=replication: the user of {where} may not use replication slots", key="source.user",
                          hint="ALTER ROLE <user> REPLICATION (on a managed service: its replication role, e.g. rds_replication)")


def describe(con: Any, schema: str, name: str, server_version: int) -> SyncTable:
    """A table's keys and columns (in the catalog's current state), refused by name where a sync
    cannot apply its changes by key."""
    row = con.execute("SELECT c.oid, c.relkind, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                      "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
    label = f"{schema}.{name}"
    if row is None:
        raise ConfigError(f"incremental.method=replication: the source has no table {label}", key="source.table")
    oid, kind, identity = int(row[0]), row[1], row[2]
    if kind not in ("r", "p"):
        raise ConfigError(f"incremental.method=replication: {label} is not a table (a view or foreign table has no changes to decode)",
                          key="source.table")
    cols = con.execute("SELECT attname, format_type(atttypid, atttypmod), attgenerated <> '' FROM pg_attribute "
                       "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
    keys = con.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod), CASE WHEN a.attcollation <> t.typcollation "
                       "THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END FROM pg_index i "
                       "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos) "
                       "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum JOIN pg_type t ON t.oid = a.atttypid "
                       "LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace "
                       "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.pos", (oid,)).fetchall()
    if not keys:
        raise ConfigError(f"incremental.method=replication: {label} has no primary key: a sync applies each change by its key",
                          key="source.table", hint=f"add one: ALTER TABLE {label} ADD PRIMARY KEY (...)")
    if identity not in ("d", "f"):
        raise ConfigError(f"incremental.method=replication: {label} has REPLICA IDENTITY "
                          f"{'NOTHING' if identity == 'n' else 'USING INDEX'}: its deletes would not carry the primary key",
                          key="source.table", hint=f"ALTER TABLE {label} REPLICA IDENTITY DEFAULT")
    names = tuple(c[0] for c in cols)
    key_names = tuple(k[0] for k in keys)
    # pgoutput carries every column but the generated ones (before 18, or where the publication leaves them out)
    published = tuple(c[0] for c in cols if not c[2])
    signature = ", ".join(f"{c[0]} {c[1]}" for c in cols) + f"; primary key ({', '.join(key_names)})"
    return SyncTable(schema, name, oid, key_names, tuple(k[1] for k in keys), names, published, signature, kind, tuple(k[2] or "" for k in keys))


def changed_columns(recorded: str, now: str) -> str:
    """What differs between two signatures, for the message that stops the sync."""
    def split(sig: str) -> tuple[dict[str, str], str]:
        cols, _, key = sig.partition("; ")
        return dict(c.split(" ", 1) for c in cols.split(", ") if c), key

    (before, key_before), (after, key_after) = split(recorded), split(now)
    out = [f"column {c} added ({t})" for c, t in after.items() if c not in before]
    out += [f"column {c} dropped" for c in before if c not in after]
    out += [f"column {c} retyped from {before[c]} to {t}" for c, t in after.items() if c in before and before[c] != t]
    if key_before != key_after:
        out.append(f"{key_before} is now {key_after}")
    return "; ".join(out) or "its definition changed"


# --- the slot and its publication -----------------------------------------------------------------


def slot_state(con: Any, slot: str) -> tuple[int, int] | None:
    """The slot's confirmed position and the bytes of WAL it holds back on the source (None: no such slot)."""
    row = con.execute("SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                      "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return (lsn(row[0]) if row[0] else 0), int(row[1] or 0)


def drop(con: Any, slot: str) -> list[str]:
    """Drop the job's slot and publication where they exist; what was dropped."""
    out = []
    if con.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone():
        con.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        out.append(f"replication slot {slot}")
    if con.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (slot,)).fetchone():
        con.execute(f"DROP PUBLICATION {ident(slot)}")
        out.append(f"publication {slot}")
    return out


def publish(con: Any, slot: str, tables: Sequence[SyncTable], server_version: int) -> None:
    """The job's publication: each table whole (no column list: see the module's docstring)."""
    via_root = " WITH (publish_via_partition_root = true)" if server_version >= 130000 else ""
    con.execute(f"CREATE PUBLICATION {ident(slot)} FOR TABLE {', '.join(t.qualified for t in tables)}{via_root}")


def check_published(con: Any, slot: str, tables: Sequence[SyncTable], server_version: int) -> None:
    """Every table of the job still in its publication, as the table it is now (a table dropped and created again is
    another one, whose changes the publication does not carry): refused by name. A publication that lists columns (made
    by an earlier Conveyor) is set to the whole tables, so a change of a table's replica identity never makes the source
    refuse its own writes."""
    if not con.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (slot,)).fetchone():
        raise SchemaError(f"sync stopped: the job's publication {slot} is gone from the source: the changes since it went are not "
                          "decoded", hint="conveyor clean --drop (this job's settings), then run it again: the first run loads the tables again")
    lists = ", r.prattrs IS NOT NULL" if server_version >= 150000 else ", false"
    rows = con.execute(f"SELECT r.prrelid::int8{lists} FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
                       "WHERE p.pubname = %s", (slot,)).fetchall()
    held = {int(r[0]) for r in rows}
    for t in tables:
        if t.oid not in held:
            raise SchemaError(f"sync of {t.label} stopped: the source table is not in the job's publication {slot} (it was dropped and "
                              "created again, or taken out of the publication): its changes since are not decoded",
                              hint="conveyor clean --drop (this job's settings), then run it again: the first run loads the tables again")
    if any(r[1] for r in rows):
        con.execute(f"ALTER PUBLICATION {ident(slot)} SET TABLE {', '.join(t.qualified for t in tables)}")


#: seconds a run tries for the job's lock before it refuses: a run killed just before still holds it until its backend
#: on the source sees its connection gone (a few milliseconds, up to a moment on a busy server)
LOCK_WAIT = 2.0


def lock(con: Any, slot: str) -> None:
    """The job's lock, held by ``con``'s session on the source until it closes: a second run of the job is refused by name
    (after :data:`LOCK_WAIT` seconds of trying, every 0.1 s)."""
    import time

    key = "SELECT hashtextextended('conveyor sync ' || %s, 0)"
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        if con.execute(f"SELECT pg_try_advisory_lock(({key}))", (slot,)).fetchone()[0]:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    row = con.execute("SELECT l.pid, a.application_name, extract(epoch FROM now() - a.backend_start)::int FROM pg_locks l "
                      "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                      f"AND ((l.classid::int8 << 32) | l.objid::int8) = ({key})", (slot,)).fetchone()
    who = f" (source backend pid {row[0]}, connected {row[2]} s ago)" if row else ""
    raise ConveyorError(f"sync: another run of this job is running{who}: one run of a sync job applies at a time (slot {slot})",
                        hint="wait for it to end, or stop it (a run with incremental.follow runs until Ctrl-C or SIGTERM)")


def parents_first(con: Any, tables: Sequence[SyncTable]) -> tuple[list[int], set[int]]:
    """The tables' order with every table after the tables its foreign keys refer to (as the source's catalog has them),
    and the tables another of them refers to."""
    oids = [t.oid for t in tables]
    pairs = con.execute("SELECT conrelid::int8, confrelid::int8 FROM pg_constraint WHERE contype = 'f' AND conrelid = ANY(%s) "
                        "AND confrelid = ANY(%s) AND conrelid <> confrelid", (oids, oids)).fetchall()
    index = {oid: i for i, oid in enumerate(oids)}
    parents: dict[int, set[int]] = {i: set() for i in range(len(tables))}
    for child, parent in pairs:
        parents[index[int(child)]].add(index[int(parent)])
    order: list[int] = []
    while len(order) < len(tables):
        ready = [i for i in range(len(tables)) if i not in order and parents[i] <= set(order)]
        order.extend(ready or [i for i in range(len(tables)) if i not in order])  # a cycle: as listed (its constraints deferred)
    return order, {p for ps in parents.values() for p in ps}


def advance(con: Any, slot: str, to: int) -> None:
    con.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn_text(to)))


@contextlib.contextmanager
def exported(config: PgConnConfig, slot: str, temporary: bool, wait_timeout: float = 0) -> Iterator[tuple[int, str]]:
    """A logical slot made on a replication connection with an exported snapshot: yields (its
    position, the snapshot's name); the snapshot lives until the block ends. A temporary slot goes
    with its connection. The slot is made once every transaction running on the source has ended: a
    wait for one is said (which, since when), and given up after ``wait_timeout`` seconds (0: none)."""
    import psycopg

    where = config.where()
    try:
        con = psycopg.connect(autocommit=True, replication="database", **config.conninfo())
    except psycopg.Error as exc:
        raise translate(exc, config, "connecting for replication") from None
    try:
        with _waits(config, con, wait_timeout) as waited:
            # the replication protocol takes simple queries only (psycopg's execute uses the extended one)
            res = con.pgconn.exec_(f"CREATE_REPLICATION_SLOT {check_slot_name(slot)} {'TEMPORARY ' if temporary else ''}LOGICAL "
                                   "pgoutput EXPORT_SNAPSHOT".encode())
        if res.status != 2:  # PGRES_TUPLES_OK
            if waited.gave_up:
                raise ConveyorError(f"sync: {where}: {waited.gave_up} stayed open past incremental.wait_timeout={wait_timeout:g} s; a "
                                    "replication slot's snapshot begins once every transaction running when it is made has ended",
                                    hint="commit or end that transaction (SELECT pg_terminate_backend(<pid>) on the source), or raise "
                                         "incremental.wait_timeout (0 waits as long as it takes)")
            message = res.error_message.decode(errors="replace").strip()
            hint = ("raise max_replication_slots on the source (and restart it), or drop slots no job uses (conveyor clean --drop)"
                    if "slots are in use" in message else "see the source server's log")
            raise ConfigError(f"incremental.method=replication: {where} could not make the replication slot {slot}: {message}",
                              key="incremental.method", hint=hint)
        yield lsn(res.get_value(0, 1).decode()), res.get_value(0, 2).decode()
    finally:
        con.close()


@dataclass
class _Waited:
    #: the transaction the wait was given up on (empty: not given up)
    gave_up: str = ""


#: how often a wait is looked at, and said again while it lasts
_WAIT_POLL, _WAIT_SAY = 0.5, 30.0


@contextlib.contextmanager
def _waits(config: PgConnConfig, replication_con: Any, timeout: float) -> Iterator[_Waited]:
    """While the block makes a slot on ``replication_con``: a watcher that says which source transaction the slot waits
    for (pid, xid, how long open) and cancels the wait after ``timeout`` seconds."""
    import threading
    import time

    from conveyor.log import say

    waited, stop = _Waited(), threading.Event()
    pid = replication_con.info.backend_pid

    def watch() -> None:
        began, said = time.monotonic(), 0.0
        try:
            with connect(config, autocommit=True) as con:
                while not stop.wait(_WAIT_POLL):
                    row = con.execute("SELECT wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'virtualxid') "
                                      "FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                    if not row or not row[0]:
                        continue
                    held = con.execute(
                        "SELECT format('source transaction %%s (pid %%s, open %%s s, %%s)', backend_xid, pid, "
                        "extract(epoch FROM now() - xact_start)::int, state) FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
                        "AND pid <> %s UNION ALL SELECT format('prepared transaction %%s (%%L, prepared %%s s ago)', transaction, gid, "
                        "extract(epoch FROM now() - prepared)::int) FROM pg_prepared_xacts ORDER BY 1 LIMIT 1", (pid,)).fetchone()
                    what = held[0] if held else "a source transaction"
                    now = time.monotonic()
                    if timeout and now - began > timeout:
                        waited.gave_up = what
                        replication_con.cancel()
                        return
                    if not said or now - said >= _WAIT_SAY:
                        said = now
                        limit = f"; gives up after incremental.wait_timeout={timeout:g} s" if timeout else ""
                        say(f"sync: waiting for {what} to end: a replication slot's snapshot begins once every transaction "
                            f"running when it is made has ended{limit}")
        except Exception:  # the watcher only says; the slot's own outcome is the run's
            return

    thread = threading.Thread(target=watch, name="conveyor-slot-wait", daemon=True)
    thread.start()
    try:
        yield waited
    finally:
        stop.set()
        thread.join(timeout=10)


# --- the keys the changes touched -------------------------------------------------------------------

_KEYS = "pg_temp._conveyor_keys"


def collect(config: PgConnConfig, slot: str, upto: int, tables: Sequence[SyncTable]) -> tuple[int, dict[int, pgoutput.TableKeys]]:
    """The slot's changes up to ``upto``: (how many changes of rows, each synced table's keys by relid). The messages
    stream to this process through ADBC's COPY reader as the server decodes them and are read column-wise batch by batch
    (:mod:`~conveyor.connectors.postgres.pgoutput`), so the decoding and the reading of keys overlap; only the keys
    stay (a slot's changes are never held whole). ADBC's own objects, not its DB-API module (which imports pandas:
    ~0.2 s of a run's start)."""
    import adbc_driver_manager
    import adbc_driver_postgresql
    import pyarrow as pa

    from conveyor.connectors.postgres import pgoutput

    wanted = {t.oid: (tuple(t.published.index(k) for k in t.keys), len(t.published), integer_keys(t)) for t in tables}
    found: dict[int, pgoutput.TableKeys] = {}
    changes = 0
    with contextlib.ExitStack() as stack:
        try:
            db = adbc_driver_postgresql.connect(config.uri())
            stack.callback(db.close)
            con = adbc_driver_manager.AdbcConnection(db)  # autocommit: each statement its own transaction
            stack.callback(con.close)

            def query(sql: str) -> Any:
                stmt = adbc_driver_manager.AdbcStatement(con)
                stack.callback(stmt.close)
                stmt.set_sql_query(sql)
                return pa.RecordBatchReader.from_stream(stmt.execute_query()[0])

            # pgoutput writes each value in the client encoding of the session that decodes (libpq's conversion of its output)
            recent, encoding = query("SELECT current_setting('server_version_num')::int >= 130000 AS recent, "
                                     "current_setting('client_encoding') AS encoding").read_all().to_pylist()[0].values()
            if recent:  # a large transaction decoded in memory, not spilled to disk in 64 MB pieces (13+ lets a session set it)
                query("SELECT set_config('logical_decoding_work_mem', '512MB', false)").read_all()
            reader = query(f"SELECT data FROM pg_logical_slot_peek_binary_changes({literal(slot)}, {literal(lsn_text(upto))}::pg_lsn, "
                           f"NULL, 'proto_version', '1', 'publication_names', {literal(slot)}) WHERE get_byte(data, 0) IN "
                           f"({pgoutput.INSERT}, {pgoutput.UPDATE}, {pgoutput.DELETE}, {pgoutput.TRUNCATE})")
            for batch in reader:
                try:
                    changes += pgoutput.keys_of(batch.column(0), wanted, found, encoding)
                except (ValueError, IndexError) as exc:  # a message not as the table's columns say: never guessed at
                    raise ConveyorError(f"sync: slot {slot}'s changes do not match the synced tables' columns ({exc})",
                                        hint="conveyor clean --drop (this job's settings), then run it again to load the tables "
                                             "again") from None
        except adbc_driver_manager.Error as exc:
            raise translate(exc, config, f"cannot read the changes of slot {slot}") from None
    return changes, found


def changed_keys(con: Any, table: SyncTable, keys: pgoutput.TableKeys | None) -> int:
    """The distinct keys the changes of ``table`` touched (inserted, updated: the old key and the new, deleted), as the
    key columns' own types in a temporary table of ``con``'s session; how many. A key the messages do not carry (a
    TOASTed key value left out) is refused by name."""
    if keys is not None and keys.uncarried:
        raise SchemaError(f"sync of {table.label}: {keys.uncarried:,} changes do not carry their key (a key value stored out of "
                          "line, or changes made while the table's REPLICA IDENTITY did not hold its primary key)",
                          hint="a sync applies changes by the primary key: keep the key's values small (under 2 kB) and the replica "
                               "identity DEFAULT or FULL; conveyor clean --drop (this job's settings), then run it again to load the table again")
    if keys is None or not keys.count:  # no change of this table (its keys are never asked for)
        return 0
    if keys.ints is not None:  # integers: made distinct and put in order here, no temporary table
        keys.ints = [keys.distinct()]
        return len(keys.ints[0][0])
    from conveyor.connectors.postgres import pgoutput

    raw = "_conveyor_raw_keys"
    con.execute(f"DROP TABLE IF EXISTS pg_temp.{raw}")
    con.execute(f"CREATE TEMP TABLE {raw} ({', '.join(f'k{i} bytea' for i in range(len(table.keys)))})")
    with con.cursor().copy(f"COPY pg_temp.{raw} FROM STDIN (FORMAT binary)") as copy:
        copy.write(pgoutput.COPY_HEADER)
        for rows in keys.rows:
            copy.write(rows)
        copy.write(pgoutput.COPY_TRAILER)
    # the values' bytes as pgoutput wrote them, in the decoding session's encoding, read as the key's own types: one key however
    # many times it changed (and however its text was written)
    enc = literal(keys.encoding)
    collations = table.key_collations or ("",) * len(table.keys)
    typed = ", ".join(f"convert_from(k{i}, {enc})::{t}{c} AS {ident(k)}" for i, (k, t, c) in enumerate(zip(table.keys, table.key_types, collations)))
    con.execute(f"DROP TABLE IF EXISTS {_KEYS}")
    with con.transaction():
        # one sort in memory that makes the keys distinct and orders them (the table holds them in key order, which
        # key_chunks cuts into ranges without sorting again), where a hash of many keys spilled to disk and the ranges
        # took a second sort (benchmarks/results/2026-12-06-sf1-sync-1394093.md)
        con.execute("SET LOCAL work_mem = '64MB'")
        con.execute("SET LOCAL enable_hashagg = off")
        cur = con.execute(f"CREATE TEMP TABLE {_KEYS[8:]} AS SELECT DISTINCT {typed} FROM pg_temp.{raw} "
                          f"ORDER BY {', '.join(str(i + 1) for i in range(len(table.keys)))}")
        count = int(cur.rowcount)
    con.execute(f"DROP TABLE pg_temp.{raw}")
    return count


#: key types whose changed keys are read as numbers in this process (:attr:`pgoutput.TableKeys.ints`)
INTEGER_TYPES = ("smallint", "integer", "bigint")


def integer_keys(table: SyncTable) -> bool:
    """Whether every key column of ``table`` is an integer (no domain, no array): its keys are read as numbers."""
    return all(t in INTEGER_TYPES for t in table.key_types)


def key_chunks(con: Any, table: SyncTable, chunks: int, count: int, keys: pgoutput.TableKeys | None = None) -> list[tuple[str, ...]]:
    """The ``count`` changed keys (in the session's temporary table, in key order; or, of integer keys, read as numbers in
    ``keys``) in ``chunks`` chunks of consecutive keys: each chunk's key columns as array literals of their own types
    (empty chunks left out)."""
    if keys is not None and keys.ints is not None:
        return _int_chunks(keys.ints[0] if keys.ints else [], chunks)
    names = ", ".join(ident(k) for k in table.keys)
    # the ranges cut in the order the table holds the keys (their sort's, :func:`changed_keys`), not sorted again; any
    # order would be exact (a chunk is a set of keys), and the lookups put each chunk's keys in order themselves
    chunk = f"(row_number() OVER () - 1) * {int(chunks)} / {max(int(count), 1)}" if chunks > 1 else "0"
    rows = con.execute(f"SELECT c, {', '.join(f'array_agg({ident(k)})::text' for k in table.keys)} "
                       f"FROM (SELECT {names}, {chunk} AS c FROM {_KEYS}) AS k GROUP BY 1 ORDER BY 1").fetchall()
    return [tuple(r[1:]) for r in rows]


def _int_chunks(columns: Sequence[Any], chunks: int) -> list[tuple[str, ...]]:
    """Distinct integer keys in key order (one array per key column) cut into ``chunks`` ranges, each key column of each
    as an array literal ('{1,-2,3}')."""
    import numpy as np

    from conveyor.connectors.postgres import pgoutput

    if not columns or not len(columns[0]):
        return []
    out = []
    for part in np.array_split(np.arange(len(columns[0])), max(int(chunks), 1)):
        if len(part):
            out.append(tuple("{" + pgoutput.decimal_list(col[part[0]:part[-1] + 1]) + "}" for col in columns))
    return out


def lookup_query(table: SyncTable, arrays: Sequence[str] | None) -> str:
    """The query of the rows of the keys in ``arrays`` (:func:`key_chunks`' array literals; None: no key) as the source
    holds them in the snapshot it is read in: every key, its row's columns (NULL where the row is gone) and
    ``_conveyor_present``. The keys travel as literal arrays of their own types, and each is looked up by the primary
    key's index (LATERAL ... LIMIT 1): a change touches a fraction of the table."""
    keys = ", ".join(ident(k) for k in table.keys)
    unnest = ", ".join(f"{literal(a)}::{t}[]" for a, t in zip(arrays or ("{}",) * len(table.keys), table.key_types))
    types = dict(zip(table.keys, table.key_types))
    # a key as the row holds it where there is one (the keys looked up are equal to it by the key's type, not always the same
    # value: numeric 1.0 and 1.00), else as it was changed; as its column's own type, modifier and all (an array's elements
    # lose it: numeric(10,2) would read as numeric)
    cols = ", ".join(f"coalesce(t.{ident(c)}, k.{ident(c)})::{types[c]} AS {ident(c)}" if c in types else f"t.{ident(c)}"
                     for c in table.columns)
    on = " AND ".join(f"r.{ident(k)} = k.{ident(k)}" for k in table.keys)
    # each key looked up by the key's index, in key order (a plain join, hashed for many keys, read the rows out of key
    # order: the stage's load and the target's apply then took twice as long on 10% of lineitem)
    return (f"SELECT {cols}, t.ctid IS NOT NULL AS {PRESENT} FROM (SELECT * FROM unnest({unnest}) AS k({keys}) ORDER BY {keys}) AS k "
            f"LEFT JOIN LATERAL (SELECT r.*, r.ctid FROM {table.own} AS r WHERE {on} LIMIT 1) AS t ON true")


def whole_query(table: SyncTable) -> str:
    """Every row of the table, each present (a TRUNCATE in the changes: the target is loaded again)."""
    return f"SELECT {', '.join(ident(c) for c in table.columns)}, true AS {PRESENT} FROM {table.own}"
