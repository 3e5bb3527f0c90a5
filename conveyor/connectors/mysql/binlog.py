"""A MySQL / MariaDB server's binary log as a sync reads it: positions, the prerequisites (refused by
name with the fix), a position consistent with what a read after it sees, and the keys the row events
between two positions touched.

A position is one integer: the binlog file's number in the high 32 bits, the byte offset in the low
ones (``binlog.000003:1234``). Positions are taken where every transaction logged before them is
committed in the storage engine (MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and its
``binlog_snapshot_file/position``; MySQL, which has neither: a moment under ``FLUSH TABLES WITH READ
LOCK``), so any read that starts after sees every change logged before the position.

The binlog client is ``mysql-replication`` (PyPI, pure Python, on PyMySQL, which the connector
already uses): it speaks the replication protocol (``COM_BINLOG_DUMP``, non-blocking: it stops at
the end of the log) and reads each event's header and table map; the key columns of each row are
read from the event's bytes by ``rowkeys.py``, the other columns stepped over undecoded. The
server's ``mariadb-binlog`` would print rows as SQL text to be parsed again, and is not always
installed where the job runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.mysql.common import MySqlConnConfig
from conveyor.connectors.mysql.rowkeys import event_keys
from conveyor.errors import ConfigError, ConveyorError, SchemaError

_LOW = 1 << 32

_UTF8 = ("utf8mb4", "utf8mb3", "utf8", "ascii")
#: key column types whose values the binlog's decoding gives back exactly, as a lookup's literal of the column's own type
KEY_TYPES = ("tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "char", "varchar", "date", "datetime")


def position(file: str, offset: int) -> int:
    """``binlog.000003``, 1234 as one integer."""
    return int(file.rsplit(".", 1)[1]) * _LOW + int(offset)


def split(pos: int) -> tuple[int, int]:
    return pos // _LOW, pos % _LOW


def text(base: str, pos: int) -> str:
    number, offset = split(pos)
    return f"{base}.{number:06d}:{offset}"


def file_of(base: str, pos: int) -> str:
    return f"{base}.{split(pos)[0]:06d}"


def _fix(what: str, setting: str) -> ConfigError:
    return ConfigError(f"sync from mysql: {what}", key="incremental.method",
                       hint=f"set {setting} in the server's configuration (my.cnf) and restart it; see docs/sync.md")


def check_server(con: Any) -> tuple[bool, str]:
    """The binlog's prerequisites, each refused by name with its fix; (MariaDB or not, the binlog files' base name)."""
    with con.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@version")
        log_bin, fmt, image, version = cur.fetchone()
    if not int(log_bin or 0):
        raise _fix("the server's binary log is off (log_bin): a sync reads the changes from it", "log_bin (e.g. log-bin=binlog) and server-id")
    if str(fmt).upper() != "ROW":
        raise _fix(f"binlog_format is {fmt}: a sync reads each changed row's key from row events", "binlog_format=ROW")
    if str(image).upper() not in ("FULL", "NOBLOB"):
        raise _fix(f"binlog_row_image is {image}: an insert's event must carry the row's key whatever the statement named",
                   "binlog_row_image=FULL")
    try:
        with con.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
    except Exception as exc:
        raise ConfigError(f"sync from mysql: the user may not read the binary log's position ({_first_line(exc)})",
                          key="source.user", hint="GRANT REPLICATION CLIENT (MariaDB: BINLOG MONITOR) and REPLICATION SLAVE "
                                                  "ON *.* TO the job's user") from None
    if not row:
        raise _fix("SHOW MASTER STATUS shows no binary log", "log_bin")
    return "mariadb" in str(version).lower(), str(row[0]).rsplit(".", 1)[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def current(con: Any) -> int:
    """The end of the binary log now."""
    with con.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, offset = cur.fetchone()[:2]
    return position(file, offset)


def consistent(config: MySqlConnConfig, mariadb: bool, lock: bool = False) -> int:
    """A position every transaction logged before is committed at (so a read that starts after sees each of them):
    MariaDB's consistent snapshot says it; MySQL's (and ``lock``): the log's end under a global read lock, held for
    that one statement."""
    con = config.connect()
    try:
        with con.cursor() as cur:
            if mariadb and not lock:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                got = dict(cur.fetchall())
                cur.execute("COMMIT")
                return position(got["Binlog_snapshot_file"], got["Binlog_snapshot_position"])
            try:
                cur.execute("FLUSH TABLES WITH READ LOCK")
            except Exception as exc:
                raise ConfigError(f"sync from mysql: taking a position needs a brief global read lock ({_first_line(exc)})",
                                  key="source.user", hint="GRANT RELOAD ON *.* TO the job's user") from None
            try:
                return current(con)
            finally:
                cur.execute("UNLOCK TABLES")
    finally:
        con.close()


def files(con: Any) -> list[tuple[str, int]]:
    """The binlog files the server still holds, oldest first, and their sizes."""
    with con.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def oldest(con: Any) -> int:
    held = files(con)
    return position(held[0][0], 4) if held else current(con)


def check_held(con: Any, base: str, since: int, label: str) -> None:
    """The changes since ``since`` are still in the server's binlog, or the sync is refused by name (a gap is never silent)."""
    held = files(con)
    number = split(since)[0]
    if not held or number < int(held[0][0].rsplit(".", 1)[1]):
        first = held[0][0] if held else "(none)"
        raise ConveyorError(f"sync of {label} stopped: the binary log holding the changes since {text(base, since)} was purged "
                            f"from the server (its oldest file is {first}): the changes between are lost to this sync",
                            hint="conveyor clean --drop (this job's settings), then run again: the first run loads the table again; "
                                 "keep binlogs longer than the time between runs (binlog_expire_logs_seconds / expire_logs_days)")


def bytes_between(con: Any, since: int, upto: int | None = None) -> int:
    """Bytes of binlog from ``since`` to ``upto`` (None: the end)."""
    end = current(con) if upto is None else upto
    total = 0
    for name, size in files(con):
        number = int(name.rsplit(".", 1)[1])
        lo = split(since)[1] if number == split(since)[0] else 0 if number > split(since)[0] else size
        hi = split(end)[1] if number == split(end)[0] else size if number < split(end)[0] else 0
        total += max(hi - lo, 0)
    return total


@dataclass(frozen=True)
class BinlogTable:
    """A table a sync reads the binlog of: its columns (name, COLUMN_TYPE, DATA_TYPE), its key's column positions."""

    schema: str
    name: str
    columns: tuple[tuple[str, str, str], ...]
    key_at: tuple[int, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.columns[i][0] for i in self.key_at)

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def signature(self) -> str:
        cols = ", ".join(f"{n} {t}" for n, t, _ in self.columns)
        return f"{cols}; primary key ({', '.join(self.keys)})"


def describe(config: MySqlConnConfig, table: str) -> BinlogTable:
    """The table as the binlog's decoding and the lookups see it, its key checked."""
    rows = config.run("SELECT column_name, column_type, data_type, character_set_name FROM information_schema.columns "
                      f"WHERE table_schema = DATABASE() AND table_name = '{_plain(table)}' ORDER BY ordinal_position",
                      doing="describing the table")
    if not rows:
        raise SchemaError(f"sync from mysql: table {config.database}.{table} does not exist", hint="check source.table")
    key_rows = config.run("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = DATABASE() "
                          f"AND table_name = '{_plain(table)}' AND constraint_name = 'PRIMARY' ORDER BY ordinal_position",
                          doing="describing the table")
    names = [str(r[0]) for r in rows]
    if not key_rows:
        raise SchemaError(f"sync from mysql: table {config.database}.{table} has no primary key: a sync applies changes by key",
                          hint="add a primary key to the table (or copy it with a plain job)")
    cols = tuple((str(n), str(t), str(d).lower()) for n, t, d, _ in rows)
    at = tuple(names.index(str(k[0])) for k in key_rows)
    charsets = [str(r[3] or "").lower() for r in rows]
    for i in at:
        if cols[i][2] in ("char", "varchar") and charsets[i] not in _UTF8:
            raise SchemaError(f"sync from mysql: table {config.database}.{table}'s key column {cols[i][0]} is {cols[i][1]} in character "
                              f"set {charsets[i]}: the binlog's decoding reads key text as UTF-8",
                              hint="a sync takes text keys in utf8mb4, utf8mb3 or ascii")
        if cols[i][2] not in KEY_TYPES:
            raise SchemaError(f"sync from mysql: table {config.database}.{table}'s key column {cols[i][0]} is {cols[i][1]}: its values "
                              "cannot be looked up exactly from the binlog's decoding",
                              hint=f"a sync takes keys of these types: {', '.join(KEY_TYPES)}")
    return BinlogTable(str(config.database), table, cols, at)


def _plain(name: str) -> str:
    if "'" in name or "\\" in name:
        raise ConfigError(f"source.table: {name!r}: a sync's table name has no quote or backslash", key="source.table")
    return name


def changed_columns(before: str, now: str) -> str:
    old, new = (dict(c.split(" ", 1) for c in s.split("; ")[0].split(", ")) for s in (before, now))
    out = [f"column {c} added" for c in new if c not in old] + [f"column {c} dropped" for c in old if c not in new]
    out += [f"column {c} {old[c]} -> {new[c]}" for c in new if c in old and old[c] != new[c]]
    if before.split("; ")[1:] != now.split("; ")[1:]:
        out.append(f"{before.split('; ')[-1]} -> {now.split('; ')[-1]}")
    return "; ".join(out) or "the columns' order changed"


# --- the keys the row events touched -------------------------------------------------------------

_DDL = re.compile(r"^\s*(?:/\*.*?\*/\s*)*(ALTER|DROP|RENAME|CREATE|TRUNCATE|INSERT|UPDATE|DELETE|REPLACE|LOAD)\b", re.I | re.S)


@dataclass
class Decoded:
    """What the events between two positions did to one table."""

    keys: set[tuple[Any, ...]] = field(default_factory=set)
    #: a TRUNCATE among them: the table is loaded again whole
    truncated: bool = False
    #: row changes decoded (inserts, updates, deletes)
    changes: int = 0


def _names(query: str, schema: str, table: str) -> bool:
    """Whether a statement names ``schema``.``table`` (or the bare table, run in ``schema``)."""
    t = re.escape(table)
    return re.search(rf"(?<![\w$])`?{t}`?(?![\w$])", query, re.I) is not None


def read(config: MySqlConnConfig, mariadb: bool, base: str, table: BinlogTable, since: int, upto: int) -> Decoded:
    """The keys the row events of ``table`` between ``since`` and ``upto`` touched (an update's key before and after);
    a TRUNCATE marks the table for a whole load; any other statement naming it (ALTER, DROP, RENAME, CREATE, or a
    change logged as a statement) stops the sync by name."""
    from pymysqlreplication.event import QueryEvent, RotateEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    out = Decoded()
    if upto <= since:
        return out
    file_number, offset = split(since)
    at = tuple(table.key_at)
    unsigned = tuple("unsigned" in table.columns[i][1].lower() for i in at)
    stream = _stream(config, file_of(base, since), offset, [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, QueryEvent, RotateEvent],
                     table)
    current_file = file_number
    try:
        for event in _events(stream, config):
            if isinstance(event, RotateEvent):
                current_file = int(event.next_binlog.rsplit(".", 1)[1])
                continue
            end = current_file * _LOW + int(event.packet.log_pos)
            if end > upto:
                break
            if isinstance(event, QueryEvent):
                _statement(event, table, out)
                continue
            if event.schema != table.schema or event.table != table.name:
                continue
            images = 2 if isinstance(event, UpdateRowsEvent) else 1
            found = event_keys(event, at, unsigned, images)
            out.keys.update(found)
            out.changes += len(found) // images
    finally:
        stream.close()
    return out


def probe(config: MySqlConnConfig) -> None:
    """That the user may read the binary log (REPLICATION SLAVE), refused by name before a row moves: a dump from the
    log's end, which ends at once."""
    con = config.connect()
    try:
        now = current(con)
        base = file_of(str(files(con)[-1][0]).rsplit(".", 1)[0], now)
    finally:
        con.close()
    stream = _stream(config, base, split(now)[1], [])
    try:
        for _ in _events(stream, config):
            pass
    finally:
        stream.close()


def _stream(config: MySqlConnConfig, file: str, offset: int, only: list[Any], table: BinlogTable | None = None) -> Any:
    from pymysqlreplication import BinLogStreamReader

    settings = {"host": config.host, "port": int(config.port or 3306), "user": config.user, "password": config.password() or "",
                "connect_timeout": config.connect_timeout, "charset": "utf8mb4"}
    # a replica id of its own per reader (two with one id would end each other's dump)
    server_id = 1_000_000_000 + zlib.crc32(f"{file}{offset}{os.getpid()}{time.monotonic_ns()}".encode()) % 1_000_000_000
    # MySQL's dump by file and offset, which MariaDB serves too (the library's MariaDB mode starts from a GTID state)
    return BinLogStreamReader(connection_settings=settings, server_id=server_id, log_file=file, log_pos=max(offset, 4),
                              resume_stream=True, blocking=False, only_events=only or None, enable_logging=False,
                              use_column_name_cache=True,
                              # other tables' row events are skipped before their rows are decoded
                              only_tables=[table.name] if table else None, only_schemas=[table.schema] if table else None,
                              # a value outside the key is decoded and dropped: text of another character set may not be UTF-8
                              ignore_decode_errors=True)


def _events(stream: Any, config: MySqlConnConfig) -> Iterator[Any]:
    try:
        with _quiet():
            yield from stream
    except ConveyorError:
        raise
    except Exception as exc:
        message = _first_line(exc)
        if "1227" in message or "REPLICATION SLAVE" in message.upper() or "denied" in message.lower():
            raise ConfigError(f"sync from mysql: the user may not read the binary log ({message})", key="source.user",
                              hint="GRANT REPLICATION SLAVE ON *.* TO the job's user") from None
        if "1236" in message:
            raise ConveyorError(f"sync from mysql: the server cannot send the binary log from the position asked ({message})",
                                hint="conveyor clean --drop (this job's settings), then run again: the first run loads the table again") from None
        raise config.translate(exc, "reading the binary log") from None


def _statement(event: Any, table: BinlogTable, out: Decoded) -> None:
    query = event.query if isinstance(event.query, str) else bytes(event.query).decode("utf-8", "replace")
    found = _DDL.match(query)
    if not found:
        return
    schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema or "")
    if not _names(query, table.schema, table.name) or (schema != table.schema and f"{table.schema}" not in query):
        return
    verb = found.group(1).upper()
    if verb == "TRUNCATE":
        out.truncated = True
        out.keys.clear()
        return
    shown = " ".join(query.split())[:160]
    if verb in ("INSERT", "UPDATE", "DELETE", "REPLACE", "LOAD"):
        raise ConveyorError(f"sync of {table.label} stopped: a change to it was logged as a statement, not as rows ({shown}): its keys "
                            "cannot be read", hint="keep binlog_format=ROW for every session (a session's SET binlog_format overrides "
                                                   "it); then conveyor clean --drop (this job's settings) and run again")
    raise SchemaError(f"sync of {table.label} stopped: the source table's definition changed since the sync began ({shown})",
                      hint="change the target to match, then conveyor clean --drop (this job's settings) and run again: the first "
                           "run loads the table again")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """mysql-replication prints a banner about binlog_row_metadata through its logger at start: not the job's to show."""
    logger = logging.getLogger("pymysqlreplication")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def key_json(keys: Sequence[tuple[Any, ...]]) -> str:
    """Keys as a JSON array of arrays (decimals, dates and datetimes as MySQL's text of them) for a lookup's JSON_TABLE."""
    import datetime

    def plain(v: Any) -> Any:
        if isinstance(v, datetime.datetime):
            return v.isoformat(sep=" ")
        if isinstance(v, (datetime.date,)):
            return v.isoformat()
        if isinstance(v, (int, str)) or v is None:
            return v
        return str(v)

    return json.dumps([[plain(v) for v in k] for k in keys], ensure_ascii=False, separators=(",", ":"))


__all__ = ["BinlogTable", "Decoded", "check_server", "consistent", "describe", "read"]
