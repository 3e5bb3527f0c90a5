"""MySQL / MariaDB: connection settings, errors, the SQL dialect, and one DuckDB per process with the
server attached (what the source, the sink and the commit markers share)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from conveyor.errors import ConfigError, ConnectError, ConveyorError, SchemaError, TransferError
from conveyor.kit import duckext
from conveyor.kit.credentials import ScrubsPassword, fill_from_env, read_password
from conveyor.kit.merge import MergeOptions
from conveyor.kit.sql import Dialect

_MY_ENV = {"host": ("MYSQL_HOST", "127.0.0.1"), "port": ("MYSQL_TCP_PORT", "3306"), "user": ("MYSQL_USER", "root"),
           "database": ("MYSQL_DATABASE", "")}
# error numbers a retry may cure: lost or refused connections, deadlock, lock wait timeout
_RETRIABLE = ("2002", "2003", "2006", "2013", "1205", "1213", "Lost connection", "server has gone away", "Can't connect")


def qident(name: str) -> str:
    """A MySQL identifier, backquoted with embedded backquotes doubled."""
    return "`" + name.replace("`", "``") + "`"


@dataclass
class MySqlConnConfig(ScrubsPassword):
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

def _duck(conf: MySqlConnConfig, write: bool) -> tuple[tuple[Any, ...], Callable[[], Any]]:
    """The key and maker of this process's DuckDB with the server attached as ``my`` (read-only unless ``write``)."""
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

    return key, make


def _duck_connection(conf: MySqlConnConfig, write: bool = False) -> contextlib.AbstractContextManager[Any]:
    """A cursor of this process's DuckDB with the server attached as ``my`` (read-only unless ``write``)."""
    return duckext.cursor(*_duck(conf, write))


# --- the dialect ----------------------------------------------------------------------------------


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
class MySqlSinkConfig(MergeOptions, MySqlConnConfig):
    table: str = "???"
    #: target columns whose values MySQL may convert by its own rules (``[*]``: all)
    allow_cast: list[str] = field(default_factory=list)
    #: how rows go in: load_data (LOAD DATA LOCAL INFILE, fed CSV by DuckDB through a pipe; several times
    #: the insert path's speed, benchmarks/results/; any warning MySQL raises fails the partition), insert (DuckDB's mysql
    #: extension, batched INSERTs), or auto: load_data where the server allows LOCAL INFILE, else insert
    bulk: str = "auto"
    #: record each partition's commit in `_conveyor_commits` (and the run in `_conveyor_runs`) in the
    #: target's database, in the partition's own transaction: exactly once whatever died when, and
    #: resume asks the target. false: where you may not create tables (the run's state is then
    #: checked by named locks just before COMMIT, with a small window; resume trusts the manifest)
    commit_markers: bool = True
    #: create / replace: the source table's NOT NULL, primary key and comments, made with the table (target.py)
    definition: bool = True
    #: a float -0.0, which MySQL and MariaDB store as 0: error (refused, naming the column), or zero (stored as 0)
    negative_zero: str = "error"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bulk not in ("auto", "load_data", "insert"):
            raise ValueError(f"bulk: {self.bulk!r} is not one of auto, load_data, insert")
        if self.negative_zero not in ("error", "zero"):
            raise ValueError(f"negative_zero: {self.negative_zero!r} is not one of error, zero")
        self.check_merge_options()


class Statements:
    """A PyMySQL connection with the ``execute(sql)`` -> cursor shape the shared SQL (``kit.merge``, ``kit.syncapply``)
    reads from (``fetchone``, ``fetchall``, ``description``)."""

    def __init__(self, con: Any) -> None:
        self.con = con

    def execute(self, sql: str) -> Any:
        cur = self.con.cursor()
        cur.execute(sql)
        return cur
