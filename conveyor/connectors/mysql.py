"""MySQL / MariaDB source and sink.

Rows travel through DuckDB's mysql extension (C++; the ``duckdb-extension-mysql`` wheel, installed
offline): a partition's SELECT runs on the server and its result is decoded into Arrow batches
(``mysql_query``); a sink partition's batches are inserted in one MySQL transaction. Planning,
DDL and the final swap use PyMySQL (a few small statements; no rows pass through Python).

Consistency: MySQL cannot share a snapshot between connections. Each partition is one SELECT,
which InnoDB answers from one consistent read view; different partitions start at different
times, so a table written during the copy may be read at different moments by different
partitions (use one partition, ``strategy=none``, for a copy consistent as of one moment).

Types (source): integers signed and unsigned (BIGINT UNSIGNED as uint64, exact), DECIMAL(p,s) up to
38 digits (wider: refused by name), FLOAT/DOUBLE, BIT(1)/BOOL as bool, CHAR/VARCHAR/TEXT (utf8mb4),
BLOB/BINARY, DATE, DATETIME(6), TIMESTAMP (read as the UTC instant), TIME, YEAR, JSON, ENUM and
SET (as text). Values DuckDB cannot hold are refused by name, never changed (``_UNFIT``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from conveyor.arrowutil import CountingBatches, rebatch
from conveyor.connectors import duckext
from conveyor.connectors import merge as merging
from conveyor.connectors.credentials import fill_from_env, read_password
from conveyor.connectors.merge import MergeOptions
from conveyor.connectors.sql import Dialect, SqlSource
from conveyor.connectors.staged import StagedSink, check_mode
from conveyor.core import JobOptions, Partition, PrepareRequest, SinkCapabilities, SinkPlan, SourceInfo, WriteStats
from conveyor.errors import ConfigError, ConnectError, ConveyorError, SchemaError, TransferError, scrub_value
from conveyor.mapping import TargetColumn, map_columns

_MY_ENV = {"host": ("MYSQL_HOST", "127.0.0.1"), "port": ("MYSQL_TCP_PORT", "3306"), "user": ("MYSQL_USER", "root"),
           "database": ("MYSQL_DATABASE", "")}
# error numbers a retry may cure: lost or refused connections, deadlock, lock wait timeout
_RETRIABLE = ("2002", "2003", "2006", "2013", "1205", "1213", "Lost connection", "server has gone away", "Can't connect")


def qident(name: str) -> str:
    """A MySQL identifier, backquoted with embedded backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


@dataclass
class MySqlConnConfig:
    ENVIRONMENT_KEYS: ClassVar[tuple[str, ...]] = tuple(_MY_ENV)

    #: null: $MYSQL_HOST, else 127.0.0.1
    host: str | None = None
    #: null: $MYSQL_TCP_PORT, else 3306
    port: int | None = None
    #: null: $MYSQL_USER, else root
    user: str | None = None
    #: the database (schema) holding the table; null: $MYSQL_DATABASE
    database: str | None = None
    #: the environment variable holding the password (MySQL's client reads MYSQL_PWD), read where the connection opens
    password_env: str = "MYSQL_PWD"
    #: or a file holding it (first line), read where the connection opens
    password_file: str | None = None
    connect_timeout: int = 10
    #: extra connection settings for DuckDB's mysql extension, e.g. {ssl_mode: required}
    options: dict[str, str] | None = None

    def __post_init__(self) -> None:
        fill_from_env(self, _MY_ENV)
        if not self.database:
            raise ValueError("database: name the MySQL database (schema) that holds the table, or set $MYSQL_DATABASE")

    def password(self) -> str | None:
        return read_password(self.password_env, self.password_file, "MYSQL_PWD")

    def where(self) -> str:
        return f"mysql {self.user}@{self.host}:{self.port}/{self.database}"

    def scrub(self, text: str) -> str:
        try:
            pw = self.password()
        except ConfigError:
            return text
        return scrub_value(text, pw)

    def translate(self, exc: BaseException, doing: str, partition: str | None = None) -> ConveyorError:
        """A driver error as one Conveyor error, classified and scrubbed of the password."""
        if isinstance(exc, ConveyorError):
            return exc
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        msg = self.scrub(lines[0])
        text = f"{self.where()}: {doing}: {msg}"
        if "1045" in msg or "Access denied" in msg:
            return ConnectError(text, hint=f"check the user and the password in ${self.password_env or 'MYSQL_PWD'} "
                                           "(or password_file) where this connection opened")
        if "1146" in msg or "doesn't exist" in msg or "1049" in msg or "Unknown database" in msg:
            return SchemaError(text, hint="check the database and table names")
        if any(m in msg for m in ("2002", "2003", "Can't connect")) and partition is None:
            return ConnectError(text, hint=f"is the server running and reachable at {self.host}:{self.port}?")
        return TransferError(text, partition=partition, retriable=any(m in msg for m in _RETRIABLE))

    def connect(self, autocommit: bool = True, partition: str | None = None, local_infile: bool = False) -> Any:
        """A PyMySQL connection (planning, DDL, the final swap, LOAD DATA)."""
        import pymysql

        try:
            return pymysql.connect(host=self.host, port=int(self.port or 3306), user=self.user, password=self.password() or "",
                                   database=self.database, connect_timeout=self.connect_timeout, autocommit=autocommit,
                                   charset="utf8mb4", init_command="SET time_zone = '+00:00'", local_infile=local_infile)
        except Exception as exc:
            raise self.translate(exc, "cannot connect", partition) from None

    def run(self, *statements: str, partition: str | None = None, doing: str = "running SQL") -> list[tuple[Any, ...]]:
        """Statements in autocommit; the last one's rows."""
        con = self.connect(partition=partition)
        try:
            rows: list[tuple[Any, ...]] = []
            with con.cursor() as cur:
                for stmt in statements:
                    cur.execute(stmt)
                    rows = list(cur.fetchall())
            return rows
        except Exception as exc:
            raise self.translate(exc, doing, partition) from None
        finally:
            con.close()


# --- DuckDB with the server attached: one per process and server ------------------------------------

def _duck(conf: MySqlConnConfig, write: bool) -> tuple[tuple[Any, ...], Any]:
    """This process's DuckDB with the server attached as ``my`` (read-only unless ``write``)."""
    import duckdb

    pw = conf.password()
    key = ("mysql", conf.host, conf.port, conf.user, conf.database, conf.connect_timeout, tuple(sorted((conf.options or {}).items())),
           pw, write)

    def make() -> Any:
        try:
            extdir = duckext.extension_dir("mysql")
        except RuntimeError as exc:
            raise ConfigError(f"mysql: DuckDB's mysql extension does not load: {exc}",
                              hint="pip install 'conveyor[mysql]' (duckdb-extension-mysql, the same version as duckdb)") from None
        db = duckdb.connect(config={"extension_directory": extdir, "threads": 1, "autoinstall_known_extensions": False,
                                    "autoload_known_extensions": False})
        try:
            db.execute("LOAD mysql")
            db.execute("SET TimeZone = 'UTC'")
            q = duckext.quote
            fields = [f"HOST {q(conf.host)}", f"PORT {int(conf.port or 3306)}", f"USER {q(conf.user)}", f"DATABASE {q(conf.database)}"]
            if pw is not None:
                fields.append(f"PASSWORD {q(pw)}")
            db.execute(f"CREATE TEMPORARY SECRET conveyor_my (TYPE mysql, {', '.join(fields)})")
            extra = " ".join(f"{k}={v}" for k, v in (conf.options or {}).items())
            db.execute(f"ATTACH {q(extra)} AS my (TYPE mysql, SECRET conveyor_my{'' if write else ', READ_ONLY'})")
        except BaseException as exc:
            db.close()
            if isinstance(exc, Exception):
                raise conf.translate(exc, "cannot connect") from None
            raise
        return db

    return key, duckext.attached(key, make)


@contextlib.contextmanager
def _duck_connection(conf: MySqlConnConfig, write: bool = False) -> Iterator[Any]:
    key, db = _duck(conf, write)
    con = db.cursor()
    ok = False
    try:
        yield con
        ok = True
    finally:
        with contextlib.suppress(Exception):
            con.close()
        if not ok:
            duckext.forget(key)


# --- source ----------------------------------------------------------------------------------------


class MySqlDialect(Dialect):
    name = "mysql"
    binds = False  # mysql_query takes SQL text: values go in as literals

    def quote(self, name: str) -> str:
        return qident(name)

    def literal(self, value: Any) -> str:
        import datetime
        import decimal

        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, (int, decimal.Decimal)):
            return str(value)
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, datetime.datetime):
            return f"TIMESTAMP'{value.replace(tzinfo=None).isoformat(sep=' ')}'"
        if isinstance(value, datetime.date):
            return f"DATE'{value.isoformat()}'"
        if isinstance(value, bytes):
            return f"X'{value.hex()}'" if value else "''"
        text = str(value)
        # a hex literal with a charset introducer: no escaping rules (NO_BACKSLASH_ESCAPES or not)
        return f"_utf8mb4 X'{text.encode().hex()}'" if text else "''"

    def count_where(self, cond: str) -> str:
        return f"COUNT(CASE WHEN {cond} THEN 1 END)"


MYSQL_DIALECT = MySqlDialect()


@dataclass
class MySqlSourceConfig(MySqlConnConfig):
    #: read a table ...
    table: str | None = None
    #: ... or any query
    query: str | None = None
    #: zero dates ('0000-00-00', '2024-00-15': MySQL without NO_ZERO_DATE) have no Arrow form: error (the
    #: default) names the column; null reads them as NULL
    zero_dates: str = "error"

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")
        if self.zero_dates not in ("error", "null"):
            raise ValueError(f"zero_dates: {self.zero_dates!r} is not one of error, null")


@dataclass(frozen=True)
class MyColumn:
    """A result column as the server describes it (PyMySQL's field: type code, character set, flags)."""

    name: str
    code: int
    charset: int
    flags: int
    length: int
    scale: int

    @property
    def typ(self) -> str:
        if self.flags & 256:
            return "enum"
        if self.flags & 2048:
            return "set"
        return _FIELD_TYPES.get(self.code, f"type {self.code}")

    @property
    def text(self) -> bool:
        """Characters (any text type, ENUM, SET, JSON), not bytes: read as Arrow strings."""
        return self.code == 245 or (self.code in (15, 252, 253, 254, 249, 250, 251) and self.charset != 63)

    @property
    def wide_decimal(self) -> bool:
        """DECIMAL beyond Arrow's decimal128 (38 digits): DuckDB would read a double; read as exact text."""
        return self.code in (0, 246) and self.length - (1 if self.scale else 0) - 1 > 38

    @property
    def dated(self) -> bool:
        return self.code in (7, 10, 12)


# column types DuckDB's mysql extension cannot carry exactly, refused by name before a row moves
_UNFIT = {"geometry": "a spatial type has no Arrow form", "point": "a spatial type has no Arrow form",
          "linestring": "a spatial type has no Arrow form", "polygon": "a spatial type has no Arrow form"}


class MySqlSource(SqlSource):
    """Reads a MySQL / MariaDB table or query as Arrow batches; serves the keyed partition methods."""

    config_class = MySqlSourceConfig
    dialect = MYSQL_DIALECT

    def __init__(self, config: MySqlSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._schema = None
        self._cols: tuple[MyColumn, ...] = ()
        self._estimate: int | None = None
        self.window = None

    def _from(self) -> str:
        if self.config.table:
            return f"{qident(self.config.database or '')}.{qident(self.config.table)}"
        return f"({self.config.query}) AS _conveyor_q"

    def _relation(self) -> str:
        cond = self._predicate_window()
        return f"(SELECT * FROM {self._from()} WHERE {cond}) AS _conveyor_w" if cond else self._from()

    def _predicate_window(self) -> str:
        if self.window is None:
            return ""
        return self._window_cond(1)[0]

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.config.run(sql, doing="planning")

    def describe(self) -> SourceInfo:
        import pyarrow as pa

        conf = self.config
        estimate = size = None
        if conf.table:
            rows = conf.run("SELECT table_rows, data_length FROM information_schema.tables WHERE table_schema = DATABASE() "
                            f"AND table_name = {MYSQL_DIALECT.literal(conf.table)}", doing="describing the source")
            if not rows:
                raise SchemaError(f"mysql source: table {conf.database}.{conf.table} does not exist",
                                  hint=f"check source.database and source.table on {conf.where()}")
            estimate, size = (int(rows[0][0]) if rows[0][0] else None), (int(rows[0][1]) if rows[0][1] else None)
        self._estimate = estimate
        # the server's own column types, from an empty result's metadata
        con = conf.connect()
        try:
            with con.cursor() as cur:
                cur.execute(f"SELECT * FROM {self._from()} LIMIT 0")
                self._cols = tuple(MyColumn(f.name, f.type_code, f.charsetnr, f.flags, f.length, f.scale) for f in cur._result.fields)
        except Exception as exc:
            raise conf.translate(exc, "describing the source") from None
        finally:
            con.close()
        for col in self._cols:
            if col.typ in _UNFIT:
                raise SchemaError(f"mysql column {col.name} ({col.typ}): {_UNFIT[col.typ]}", hint="cast it in source.query (e.g. to CHAR)")
        with _duck_connection(conf) as duck:
            try:
                raw = duck.execute(f"SELECT * FROM mysql_query('my', {duckext.quote(self.select_sql(None, limit0=True))})").arrow().schema
            except Exception as exc:
                raise conf.translate(exc, "describing the source") from None
        self._schema = pa.schema([pa.field(c.name, _arrow_type(c, f.type)) for c, f in zip(self._cols, raw)])
        label = f"mysql table {conf.database}.{conf.table}" if conf.table else "mysql query"
        return SourceInfo(schema=self._schema, label=label, estimated_rows=estimate, estimated_bytes=size,
                          reader="Arrow batches decoded by DuckDB's mysql extension")

    def select_sql(self, part: Partition | None, limit0: bool = False) -> str:
        where = "" if part is None else self._predicate(part)[0]
        cols = [self._select_expr(c) for c in self._cols]
        flags = self._flags()
        if flags and not limit0:
            cols.append(f"({flags}) AS _conveyor_flags")
        return f"SELECT {', '.join(cols)} FROM {self._from()}{where}" + (" LIMIT 0" if limit0 else "")

    def _select_expr(self, col: MyColumn) -> str:
        """TIME and DECIMAL wider than 38 digits are read as their exact text (MySQL's TIME spans
        -838:59:59..838:59:59, beyond a time of day); TIMESTAMP as its UTC time."""
        q = qident(col.name)
        if col.typ == "time" or col.wide_decimal:
            return f"CAST({q} AS CHAR) AS {q}"
        if col.dated:  # a zero date (or month, or day): NULL here, refused by name through the flags unless zero_dates=null
            value = f"CONVERT_TZ({q}, @@session.time_zone, '+00:00')" if col.code == 7 else q
            return f"IF(MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0, NULL, {value}) AS {q}"
        if col.code == 1:  # TINYINT(1) (BOOL) holds -128..127: DuckDB would read 5 as true
            return f"CAST({q} AS {'UNSIGNED' if col.flags & 32 else 'SIGNED'}) AS {q}"
        return q

    def _checked(self) -> list[tuple[MyColumn, str, str]]:
        """(column, server-side condition, what it means) for the values DuckDB would turn into NULL."""
        out = []
        for col in self._cols:
            q = qident(col.name)
            if col.dated and self.config.zero_dates == "error":
                out.append((col, f"(MONTH({q}) = 0 OR DAYOFMONTH({q}) = 0)", "a zero date (0000-00-00, or a zero month or day)"))
            if col.code == 7:
                out.append((col, f"({q} IS NOT NULL AND CONVERT_TZ({q}, @@session.time_zone, '+00:00') IS NULL)",
                            "a TIMESTAMP the session's time zone cannot convert to UTC (load the server's time zone tables)"))
        return out[:63]

    def _flags(self) -> str:
        return " + ".join(f"COALESCE({cond}, 0) * {1 << i}" for i, (_, cond, _) in enumerate(self._checked()))

    def _refuse(self, flags: Any, key: str) -> None:
        import pyarrow.compute as pc

        if not pc.max(flags).as_py():
            return
        hit = flags.filter(pc.not_equal(flags, 0))[0].as_py()
        col, _, what = next(c for i, c in enumerate(self._checked()) if hit & (1 << i))
        raise TransferError(f"mysql column {col.name} ({col.typ}) holds {what}, which Arrow (and Parquet, PostgreSQL) cannot hold",
                            partition=key, hint="set source.zero_dates=null to read zero dates as NULL, or filter or cast them "
                                                "in source.query")

    def read(self, part: Partition) -> Iterator[Any]:
        import pyarrow as pa

        if self._schema is None:
            self.describe()
        sql = self.select_sql(part)
        with _duck_connection(self.config) as duck:
            try:
                reader = duck.execute(f"SELECT * FROM mysql_query('my', {duckext.quote(sql)})").to_arrow_reader(self.options.batch_size)
                checked = bool(self._flags())
                for batch in rebatch(reader, self.options.batch_size):
                    if checked:
                        self._refuse(batch.column(len(self._cols)), part.key)
                    # bytes of a text column -> string (checked UTF-8); a naive UTC time -> timestamp with time zone
                    yield pa.RecordBatch.from_arrays([c if c.type == f.type else c.cast(f.type)
                                                      for c, f in zip(batch.columns, self._schema)], schema=self._schema)
            except ConveyorError:
                raise
            except Exception as exc:
                raise self.config.translate(exc, f"reading {part.key}", part.key) from None

    def key_quantiles(self, column: str, buckets: int, exact: bool) -> list[Any]:
        """Sampled boundaries (rangeid) from about 200,000 rows picked by RAND() in one scan, sorted on the
        server (MySQL has no percentile aggregate, and an exact NTILE sorts the whole table); ntile: exact."""
        kind = self._key_kind(column)
        if exact or buckets <= 1 or kind not in ("integer", "numeric", "temporal"):
            return super().key_quantiles(column, buckets, exact)
        q = qident(column)
        rows = (self._estimate if self.config.table and self.window is None and self._estimate else
                self._rows(f"SELECT count(*) FROM {self._relation()}")[0][0]) or 0
        fraction = min(1.0, 200_000 / max(1, rows))
        sample = [r[0] for r in self._rows(f"SELECT {q} FROM {self._relation()} WHERE {q} IS NOT NULL"
                                           + (f" AND RAND() < {fraction:.8f}" if fraction < 1 else "") + f" ORDER BY {q}")]
        if not sample:
            return []
        return sorted({sample[min(len(sample) - 1, (i * len(sample)) // buckets)] for i in range(1, buckets)})

    def primary_key(self) -> str | None:
        """The table's primary key when it is one column (``auto`` ranges on it)."""
        if not self.config.table:
            return None
        rows = self.config.run("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = DATABASE() "
                               f"AND table_name = {MYSQL_DIALECT.literal(self.config.table)} AND constraint_name = 'PRIMARY'",
                               doing="planning")
        return rows[0][0] if len(rows) == 1 else None

    def key_values(self, column: str) -> list[tuple[Any, int]]:
        self._key_kind(column)
        q = qident(column)
        rows = self._rows(f"SELECT {q}, count(*) FROM {self._relation()} GROUP BY {q} ORDER BY {q}")  # NULL sorts first in MySQL
        return [(r[0], int(r[1])) for r in rows]


def _arrow_type(col: MyColumn, read: Any) -> Any:
    """The Arrow type a column's batches carry: DuckDB's, with text as strings and TIMESTAMP as UTC."""
    import pyarrow as pa

    if col.text and (pa.types.is_binary(read) or pa.types.is_large_binary(read)):
        return pa.string()
    if col.code == 7 and pa.types.is_timestamp(read):
        return pa.timestamp(read.unit, tz="UTC")
    if col.code == 1:
        return pa.uint8() if col.flags & 32 else pa.int8()
    return read


# PyMySQL's field type codes -> MySQL type names (those the source treats specially, and the usual ones)
_FIELD_TYPES = {0: "decimal", 1: "tinyint", 2: "smallint", 3: "int", 4: "float", 5: "double", 7: "timestamp", 8: "bigint",
                9: "mediumint", 10: "date", 11: "time", 12: "datetime", 13: "year", 15: "varchar", 16: "bit", 245: "json",
                246: "decimal", 247: "enum", 248: "set", 249: "blob", 250: "blob", 251: "blob", 252: "blob", 253: "varchar",
                254: "char", 255: "geometry"}


# --- sink ------------------------------------------------------------------------------------------


@dataclass
class MySqlSinkConfig(MergeOptions, MySqlConnConfig):
    table: str = "???"
    #: target columns whose values MySQL may convert by its own rules (``[*]``: all)
    allow_cast: list[str] = field(default_factory=list)
    #: how rows go in: load_data (LOAD DATA LOCAL INFILE, fed CSV by DuckDB through a pipe; about 3x the
    #: insert path's speed here; any warning MySQL raises fails the partition), insert (DuckDB's mysql
    #: extension, batched INSERTs), or auto: load_data where the server allows LOCAL INFILE, else insert
    bulk: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bulk not in ("auto", "load_data", "insert"):
            raise ValueError(f"bulk: {self.bulk!r} is not one of auto, load_data, insert")
        self.check_merge_options()


@dataclass(frozen=True)
class MyPlan:
    """The MySQL sink's own decisions (``SinkPlan.own``): how rows go in, and a merge's plan."""

    bulk: str
    merge: merging.MergePlan | None = None


def arrow_to_mysql(f: Any) -> str:
    """The MySQL column type ``create`` gives an Arrow field (values kept exactly, or refused by name)."""
    import pyarrow.types as t

    typ = f.type
    if t.is_dictionary(typ):
        typ = typ.value_type
    simple = [(t.is_boolean, "BOOLEAN"), (t.is_int8, "TINYINT"), (t.is_int16, "SMALLINT"), (t.is_int32, "INT"), (t.is_int64, "BIGINT"),
              (t.is_uint8, "TINYINT UNSIGNED"), (t.is_uint16, "SMALLINT UNSIGNED"), (t.is_uint32, "INT UNSIGNED"),
              (t.is_uint64, "BIGINT UNSIGNED"), (t.is_float32, "FLOAT"), (t.is_float64, "DOUBLE"), (t.is_date, "DATE"),
              (t.is_string, "LONGTEXT"), (t.is_large_string, "LONGTEXT"), (t.is_binary, "LONGBLOB"), (t.is_large_binary, "LONGBLOB"),
              (t.is_fixed_size_binary, "LONGBLOB")]
    if hasattr(t, "is_string_view") and (t.is_string_view(typ) or t.is_binary_view(typ)):
        return "LONGTEXT" if t.is_string_view(typ) else "LONGBLOB"
    for test, sql in simple:
        if test(typ):
            return sql
    if t.is_timestamp(typ):
        if typ.unit == "ns":
            raise SchemaError(f"column {f.name}: {typ} has nanoseconds; MySQL keeps microseconds",
                              hint="cast it to microseconds in the source")
        return "DATETIME(6)"  # a timestamp with a time zone is kept as its UTC wall-clock time
    if t.is_time(typ) and typ.unit in ("s", "ms", "us"):
        return "TIME(6)"
    if t.is_decimal(typ) and typ.precision <= 65 and typ.scale <= 30:
        return f"DECIMAL({typ.precision},{typ.scale})"
    raise SchemaError(f"column {f.name}: Arrow type {typ} has no exact MySQL type",
                      hint="cast it in the source (e.g. to text), or create the target table yourself")


class _Rows:
    """A PyMySQL connection with the ``execute(...).fetchone()/fetchall()`` shape merging.check_keys uses."""

    def __init__(self, con: Any) -> None:
        self.con = con

    def execute(self, sql: str) -> Any:
        cur = self.con.cursor()
        cur.execute(sql)
        return cur


def _drain(fifo: str, writer: threading.Thread) -> None:
    """A pipe's writer still running (the server stopped reading, or never began): read the pipe empty,
    so the writer's open() and writes return and it ends (bounded: 30 s)."""
    if not writer.is_alive():
        return
    with contextlib.suppress(OSError):
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            deadline = time.monotonic() + 30
            while writer.is_alive() and time.monotonic() < deadline:
                try:
                    if not os.read(fd, 1 << 20):
                        time.sleep(0.01)
                except BlockingIOError:
                    time.sleep(0.01)
        finally:
            os.close(fd)
    writer.join(timeout=5)


def _dq(name: str) -> str:
    """A DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def _in_duck(conf: MySqlConnConfig, table: str) -> str:
    """A MySQL table as DuckDB names it through the attached server."""
    return f"my.{_dq(conf.database or '')}.{_dq(table)}"


class MySqlSink(StagedSink):
    """One MySQL transaction per partition (InnoDB); truncate/create/replace/merge through a staging table."""

    config_class = MySqlSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"))
    empty = "DELETE FROM"  # TRUNCATE commits on its own in MySQL: DELETE keeps the swap in one transaction

    def __init__(self, config: MySqlSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.table = config.table

    def _where(self) -> str:
        return f"mysql table {self.config.database}.{self.config.table}"

    def _qualified(self, table: str | None = None) -> str:
        return f"{qident(self.config.database or '')}.{qident(table or self.config.table)}"

    def _quote(self, name: str) -> str:
        return qident(name)

    def _target_columns(self) -> list[TargetColumn] | None:
        rows = self.config.run("SELECT column_name, column_type, is_nullable = 'YES', column_default IS NOT NULL "
                               "FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = "
                               f"{MYSQL_DIALECT.literal(self.config.table)} ORDER BY ordinal_position", doing="reading the target")
        return [TargetColumn(r[0], r[1], bool(r[2]), bool(r[3])) for r in rows] or None

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        schema, mode, where = request.schema, self.options.load_mode, self._where()
        target = self._target_columns()
        check_mode(mode, target is not None, where)
        stage = f"_conveyor_stage_{self.options.run_id}"
        write_target = self.config.table
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            cols = ", ".join(f"{qident(f.name)} {arrow_to_mysql(f)}" for f in schema)
            self.config.run(f"CREATE TABLE {self._qualified(stage)} ({cols}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                            doing=f"load_mode={mode}")
            write_target = stage
        else:
            assert target is not None
            pairs = map_columns(schema.names, target, self.options.map_method, where)
            merge = self._merge_plan(pairs, target) if mode == "merge" else None
            if mode == "truncate":  # the target's indexes too: a duplicate key fails its partition, as it would the target
                self.config.run(f"CREATE TABLE {self._qualified(stage)} LIKE {self._qualified()}", doing=f"load_mode={mode}")
                write_target = stage
            elif mode == "merge":  # no unique index: duplicated source keys reach the check that names them
                self.config.run(f"CREATE TABLE {self._qualified(stage)} ENGINE=InnoDB AS SELECT * FROM {self._qualified()} WHERE 1 = 0",
                                doing=f"load_mode={mode}")
                write_target = stage
        try:
            self._check_types(pairs, schema, write_target, where)
        except BaseException:
            if write_target != self.config.table:
                self._drop(write_target)
            raise
        before = self._count(self.config.table) if mode == "append" and self.options.verify != "none" else 0
        bulk, reason = self._bulk()
        return SinkPlan(rows_before=before, target=f"{self.config.where()}.{self.config.table}", write_target=write_target,
                        load_mode=mode, columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        own=MyPlan(bulk, merge if mode == "merge" else None), path_reason=reason)

    def _merge_plan(self, pairs: list[tuple[str, str]], target: list[TargetColumn]) -> merging.MergePlan:
        """merge's keys, which must be exactly a unique index of the target, and the target's only one:
        INSERT ... ON DUPLICATE KEY UPDATE matches rows by any unique index."""
        rows = self.config.run("SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics "
                               f"WHERE table_schema = DATABASE() AND table_name = {MYSQL_DIALECT.literal(self.config.table)} "
                               "AND non_unique = 0 GROUP BY index_name", doing="reading the target's keys")
        uniques = {name: tuple(cols.split(",")) for name, cols in rows}
        plan = merging.plan(self.config, list(uniques.get("PRIMARY", ())), [t for _, t in pairs], [c.name for c in target], self._where())
        if sorted(plan.keys) not in [sorted(u) for u in uniques.values()]:
            raise ConfigError(f"load_mode=merge into {self._where()}: no unique index is exactly ({', '.join(plan.keys)})",
                              key="sink.merge_keys", hint="MySQL upserts by a unique index: add one on the merge keys, or merge on the "
                                                          "primary key")
        if len(uniques) > 1:
            raise ConfigError(f"load_mode=merge into {self._where()}: it has {len(uniques)} unique indexes "
                              f"({', '.join(sorted(uniques))}); ON DUPLICATE KEY UPDATE would match a row by any of them",
                              key="sink.merge_keys", hint="merge into a table whose only unique index is the merge key")
        return plan

    def _bulk(self) -> tuple[str, str]:
        """(load_data | insert, why) for ``sink.bulk``."""
        asked = self.config.bulk
        if asked == "insert":
            return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (sink.bulk=insert)"
        allowed = str(self.config.run("SELECT @@local_infile", doing="reading the server's settings")[0][0]) in ("1", "ON")
        if allowed:
            return "load_data", f"mysql: LOAD DATA LOCAL INFILE, CSV written by DuckDB into a pipe (sink.bulk={asked})"
        if asked == "load_data":
            raise ConfigError(f"{self.config.where()}: sink.bulk=load_data: the server does not allow LOAD DATA LOCAL INFILE "
                              "(local_infile is OFF)", hint="SET GLOBAL local_infile = 1 on the server, or sink.bulk=insert")
        return "insert", "mysql: batched INSERTs through DuckDB's mysql extension (the server's local_infile is OFF)"

    def _check_types(self, pairs: list[tuple[str, str]], schema: Any, table: str, where: str) -> None:
        """The cast policy (conveyor/casts.py) against the target's columns as DuckDB sees them."""
        import pyarrow as pa

        from conveyor.casts import ColumnType, check_casts

        with _duck_connection(self.config, write=True) as duck:
            try:
                duck.execute("CALL mysql_clear_cache()")
                target = duck.execute(f"SELECT * FROM {_in_duck(self.config, table)} LIMIT 0").arrow().schema
            except Exception as exc:
                raise self.config.translate(exc, "reading the target's columns") from None
        sources = [ColumnType.of_field(schema.field(s)) for s, _ in pairs]
        targets = [ColumnType(target.field(t).type) for _, t in pairs]
        if self.options.load_mode in ("create", "replace"):  # our own DATETIME(6) holds a UTC time: the documented mapping
            targets = [s if pa.types.is_timestamp(s.arrow) and s.arrow.tz else t for s, t in zip(sources, targets)]
        check_casts(pairs, sources, targets, where, self.config.allow_cast)

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        if plan.own.bulk == "load_data":
            return self._load_data(plan, part, batches)
        return self._insert(plan, part, batches)

    def _load_data(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        """LOAD DATA LOCAL INFILE in one transaction, fed through a named pipe by DuckDB's CSV writer.

        Every non-NULL field is quoted (a bare NULL is NULL; ``ESCAPED BY ''``: no backslash rules),
        bytes travel as hex (UNHEX on the server), bools as 0/1, timestamps with a time zone as UTC. LOAD
        DATA LOCAL turns bad values into warnings and goes on: any warning fails the partition, by name."""
        import duckdb
        import pyarrow as pa

        start = time.perf_counter()
        counted = CountingBatches(batches, plan.schema)
        reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
        folder = tempfile.mkdtemp(prefix="conveyor-mysql-")
        fifo = os.path.join(folder, "rows.csv")
        os.mkfifo(fifo, 0o600)
        exprs, targets, sets = [], [], []
        for i, (src, tgt) in enumerate(zip(plan.source_columns, plan.columns)):
            typ, q = plan.schema.field(src).type, _dq(src)
            if pa.types.is_dictionary(typ):
                typ = typ.value_type
            if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
                exprs.append(f"hex({q})")
                targets.append(f"@v{i}")
                sets.append(f"{qident(tgt)} = UNHEX(@v{i})")
                continue
            if pa.types.is_boolean(typ):
                exprs.append(f"CAST({q} AS INTEGER)")
            elif pa.types.is_timestamp(typ) and typ.tz:
                exprs.append(f"CAST({q} AS TIMESTAMP)")  # the UTC wall-clock time (TimeZone is UTC)
            else:
                exprs.append(q)
            targets.append(qident(tgt))
        duck = duckdb.connect(config={"threads": 1})
        duck.execute("SET TimeZone = 'UTC'")
        duck.register("__conveyor_batches", reader)
        failed: list[BaseException] = []

        def produce() -> None:
            try:
                duck.execute(f"COPY (SELECT {', '.join(exprs)} FROM __conveyor_batches) TO {duckext.quote(fifo)} "
                             "(FORMAT csv, HEADER false, DELIMITER ',', QUOTE '\"', ESCAPE '\"', NULLSTR 'NULL', FORCE_QUOTE *, "
                             "NEW_LINE '\n')")
            except BaseException as exc:  # reported by the loading side
                failed.append(exc)

        writer = threading.Thread(target=produce, name="conveyor-mysql-csv", daemon=True)
        writer.start()
        con = None
        try:
            con = self.config.connect(autocommit=False, partition=part.key, local_infile=True)
            sql = (f"LOAD DATA LOCAL INFILE '{fifo}' INTO TABLE {self._qualified(plan.write_target)} "
                   "CHARACTER SET utf8mb4 FIELDS TERMINATED BY ',' ENCLOSED BY '\"' ESCAPED BY '' LINES TERMINATED BY '\n' "
                   f"({', '.join(targets)})" + (f" SET {', '.join(sets)}" if sets else ""))
            with con.cursor() as cur:
                try:
                    loaded = cur.execute(sql)
                except Exception as exc:
                    _drain(fifo, writer)
                    if counted.error is not None:
                        raise counted.error from None
                    raise self.config.translate(exc, f"writing {part.key}", part.key) from None
                writer.join(timeout=60)
                if counted.error is not None:
                    raise counted.error
                if failed:
                    raise TransferError(f"{self.config.where()}: writing {part.key}: {str(failed[0]).splitlines()[0]}", partition=part.key)
                warnings = con.show_warnings() if getattr(con._result, "warning_count", 0) else ()
                if warnings:
                    level, code, message = warnings[0][:3]
                    raise TransferError(f"{self.config.where()}: writing {part.key}: MySQL changed or refused a value ({level} {code}: "
                                        f"{message}; {len(warnings)} such)", partition=part.key, retriable=False,
                                        hint="LOAD DATA turns bad values into warnings; the partition was rolled back. Fix the value, "
                                             "or the target column's type")
                if loaded != counted.rows:
                    raise TransferError(f"{self.config.where()}: writing {part.key}: MySQL took {loaded} rows of {counted.rows}",
                                        partition=part.key, retriable=False)
            con.commit()
        except BaseException:
            if con is not None:
                with contextlib.suppress(Exception):
                    con.rollback()
            raise
        finally:
            _drain(fifo, writer)
            if con is not None:
                with contextlib.suppress(Exception):
                    con.close()
            with contextlib.suppress(Exception):
                duck.close()
            with contextlib.suppress(OSError):
                os.unlink(fifo)
                os.rmdir(folder)
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def _insert(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        start = time.perf_counter()
        counted = CountingBatches(batches, plan.schema)
        reader = pa.RecordBatchReader.from_batches(plan.schema, counted)
        dq, into = _dq, _in_duck(self.config, plan.write_target)
        sql = (f"INSERT INTO {into} ({', '.join(dq(c) for c in plan.columns)}) "
               f"SELECT {', '.join(dq(c) for c in plan.source_columns)} FROM __conveyor_batches")
        with _duck_connection(self.config, write=True) as duck:
            duck.register("__conveyor_batches", reader)
            duck.execute("BEGIN")
            try:
                duck.execute(sql)
                duck.execute("COMMIT")
            except Exception as exc:
                with contextlib.suppress(Exception):
                    duck.execute("ROLLBACK")
                if counted.error is not None:  # the source failed; DuckDB only wrapped it
                    raise counted.error from None
                raise self.config.translate(exc, f"writing {part.key}", part.key) from None
            finally:
                duck.unregister("__conveyor_batches")
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def _count(self, table: str) -> int:
        return int(self.config.run(f"SELECT count(*) FROM {self._qualified(table)}", doing="counting")[0][0])

    def count_rows(self, plan: SinkPlan) -> int:
        return self._count(plan.write_target)

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        if not self.staged(plan, self.table):
            return
        stage = self._qualified(plan.write_target)
        if plan.load_mode == "merge":
            return self._merge(plan, stage)
        if plan.load_mode == "truncate":
            return super().finalize(plan, results)  # DELETE + INSERT ... SELECT in one transaction
        # create / replace: RENAME TABLE swaps atomically (MySQL's DDL commits on its own: no transaction)
        if plan.load_mode == "replace" and self._target_columns() is not None:
            old = self._qualified(f"_conveyor_old_{self.options.run_id}")
            self.config.run(f"RENAME TABLE {self._qualified()} TO {old}, {stage} TO {self._qualified()}", f"DROP TABLE {old}",
                            doing="load_mode=replace")
        else:
            self.config.run(f"RENAME TABLE {stage} TO {self._qualified()}", doing=f"load_mode={plan.load_mode}")

    def _merge(self, plan: SinkPlan, stage: str) -> None:
        """The staged keys checked, then upsert (and deletes) in one transaction; the stage dropped after."""
        merge = plan.own.merge
        cols = ", ".join(qident(c) for c in merge.columns)
        soft = qident(merge.soft_column) if merge.soft_column else None
        sets = [f"{qident(c)} = VALUES({qident(c)})" for c in merge.update] + ([f"{soft} = FALSE"] if soft else [])
        values = ", ".join(f"s.{qident(c)}" for c in merge.columns)
        if soft and merge.soft_column not in merge.columns:
            cols, values = f"{cols}, {soft}", f"{values}, FALSE"
        keep = sets or [f"{qident(merge.keys[0])} = {qident(merge.keys[0])}"]  # no column to update: a no-op, not IGNORE
        steps = [f"INSERT INTO {self._qualified()} ({cols}) SELECT {values} FROM {stage} AS s ON DUPLICATE KEY UPDATE {', '.join(keep)}"]
        gone = "NOT EXISTS (SELECT 1 FROM {} AS s WHERE {})".format(
            stage, " AND ".join(f"s.{qident(k)} = t.{qident(k)}" for k in merge.keys))
        if merge.delete == "hard":
            steps.append(f"DELETE t FROM {self._qualified()} AS t WHERE {gone}")
        elif merge.delete == "soft":
            steps.append(f"UPDATE {self._qualified()} AS t SET t.{soft} = TRUE WHERE {gone} AND NOT (t.{soft} <=> TRUE)")
        self._in_one_transaction(plan, steps, first=lambda con: merging.check_keys(_Rows(con), merge, stage, self._where(), qident))
        self._drop(plan.write_target)

    def _in_one_transaction(self, plan: SinkPlan, steps: list[str], first: Callable[[Any], None] | None = None) -> None:
        """``steps`` in one transaction, after ``first`` (a check inside it: merge's staged keys)."""
        con = self.config.connect(autocommit=False)
        try:
            if first is not None:
                first(con)
            with con.cursor() as cur:
                for step in steps:
                    cur.execute(step)
            con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            raise self.config.translate(exc, f"finishing load_mode={plan.load_mode}") from None
        finally:
            con.close()

    def _drop(self, table: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the run's own error matters more
            self.config.run(f"DROP TABLE IF EXISTS {self._qualified(table)}")
