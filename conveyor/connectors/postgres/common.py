"""Connections, identifiers and error translation shared by the PostgreSQL source and sink.

Passwords never live in a config object: ``password_env`` names the environment variable
that holds it (``PGPASSWORD`` by default, as libpq does), read when a connection opens, in
the process that opens it. Driver messages are scrubbed of it before they reach an error.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

from conveyor.errors import ConfigError, ConnectError, ConveyorError, SchemaError, TransferError, scrub_value
from conveyor.kit import reuse
from conveyor.kit.credentials import fill_from_env, read_password
from conveyor.kit.sql import Dialect

# SQLSTATE classes and codes a retry may cure: connection failures, a restarting server,
# serialization failures and deadlocks.
_RETRIABLE_CLASSES = ("08",)
_RETRIABLE_CODES = {"40001", "40P01", "57P01", "57P02", "57P03", "53300"}
# drivers do not always carry the SQLSTATE of a lost connection: these messages say it
_RETRIABLE_MESSAGES = ("server closed the connection", "terminating connection", "connection to server was lost",
                       "no connection to the server", "could not receive data from server", "could not send data to server",
                       "the database system is shutting down", "the database system is starting up", "connection reset")


#: unset connection keys take libpq's variables, as psql does, where the config is built (the driver)
_LIBPQ_ENV = {"host": ("PGHOST", "127.0.0.1"), "port": ("PGPORT", "5432"), "user": ("PGUSER", "postgres"),
              "dbname": ("PGDATABASE", "postgres")}


@dataclass
class PgConnConfig:
    #: keys an unset value of which is taken from the environment where the config is built:
    #: ``conveyor submit`` builds it where the user runs it and sends these values with the job
    ENVIRONMENT_KEYS: ClassVar[tuple[str, ...]] = tuple(_LIBPQ_ENV)

    #: null (the default): $PGHOST, else 127.0.0.1 (libpq's variables, as psql reads them)
    host: str | None = None
    #: null: $PGPORT, else 5432
    port: int | None = None
    #: null: $PGUSER, else postgres
    user: str | None = None
    #: null: $PGDATABASE, else postgres
    dbname: str | None = None
    #: the environment variable holding the password (read where the connection opens)
    password_env: str = "PGPASSWORD"
    #: or a file holding it (first line), read where the connection opens
    password_file: str | None = None
    connect_timeout: int = 10
    #: extra libpq settings, e.g. {sslmode: require}
    options: dict[str, str] | None = None

    def __post_init__(self) -> None:
        """Unset connection keys from libpq's variables, once, on the driver (workers get the values)."""
        fill_from_env(self, _LIBPQ_ENV)

    def password(self) -> str | None:
        return read_password(self.password_env, self.password_file, "PGPASSWORD")

    def password_hint(self) -> str:
        """Where this process looked for the password: the hint of an authentication error. The
        process may not be the user's (a Ray worker, or the driver of a submitted job), so it says
        which host it ran on rather than pointing at a variable the user's own shell has."""
        import socket

        here = f"{socket.gethostname()} (pid {os.getpid()}), where this connection opened"
        if self.password_file:
            return f"check the user, and the password in {self.password_file} as read on {here}"
        if self.password_env and self.password_env in os.environ:
            return f"check the user, and the password in ${self.password_env} as set on {here}"
        return (f"${self.password_env or 'PGPASSWORD'} is not set on {here}: set it there, list it in runtime.forward_env "
                "(Ray; conveyor submit hands it over), use password_file, or a ~/.pgpass there")

    def where(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def conninfo(self) -> dict[str, Any]:
        """Keyword arguments for psycopg.connect (the password included, never logged)."""
        kw: dict[str, Any] = {
            "host": self.host, "port": self.port, "user": self.user, "dbname": self.dbname,
            "connect_timeout": self.connect_timeout, "application_name": "conveyor", "client_encoding": CLIENT_ENCODING,
        }
        pw = self.password()
        if pw is not None:
            kw["password"] = pw
        kw.update(self.options or {})
        return kw

    def uri(self) -> str:
        """A libpq URI for ADBC (the password included, never logged)."""
        pw = self.password()
        auth = quote(self.user, safe="") + (":" + quote(pw, safe="") if pw is not None else "")
        params = {"connect_timeout": str(self.connect_timeout), "application_name": "conveyor", "client_encoding": CLIENT_ENCODING,
                  **(self.options or {})}
        query = "&".join(f"{quote(k)}={quote(str(v))}" for k, v in params.items())
        return f"postgresql://{auth}@{quote(self.host)}:{self.port}/{quote(self.dbname, safe='')}?{query}"

    def subprocess_env(self) -> dict[str, str]:
        """The environment for a psql subprocess: libpq variables, the password included."""
        env = dict(os.environ)
        env.update(PGHOST=self.host, PGPORT=str(self.port), PGUSER=self.user, PGDATABASE=self.dbname,
                   PGCONNECT_TIMEOUT=str(self.connect_timeout), PGAPPNAME="conveyor", PGCLIENTENCODING=CLIENT_ENCODING)
        pw = self.password()
        if pw is not None:
            env["PGPASSWORD"] = pw
        # ``options`` as libpq's own variables (sslmode: PGSSLMODE, options: PGOPTIONS, ...): psql connects as the
        # other connections do (a psql given only the variables above read with another search_path, without TLS, ...)
        names = libpq_variables()
        env.update({names[k]: str(v) for k, v in (self.options or {}).items() if k in names})
        return env

    def options_without_variable(self) -> list[str]:
        """The ``options`` that no libpq variable carries (keepalives, sslpassword, ...): a psql cannot be given them."""
        names = libpq_variables()
        return [k for k in (self.options or {}) if k not in names]

    def scrub(self, text: str) -> str:
        """``text`` with the password masked where it stands as a value, never inside a word."""
        try:
            pw = self.password()
        except ConfigError:
            return text
        return scrub_value(text, pw, quote(pw, safe="") if pw else None)


@functools.cache
def libpq_variables() -> dict[str, str]:
    """libpq's connection keywords and the environment variable of each that has one (its own table)."""
    from psycopg import pq

    return {o.keyword.decode(): o.envvar.decode() for o in pq.Conninfo.get_defaults() if o.envvar}


def first_line(exc: BaseException) -> str:
    """The message's first line; where it ends on a colon (ADBC's 'Error occurred writing COPY
    data:'), the lines after it, up to the first that says something, go with it; and for a COPY
    error, the column PostgreSQL names in its context ('column n', never the value)."""
    primary, context = _diagnostics(exc)
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    text = lines[0]
    for more in lines[1:]:
        if not text.endswith(":"):
            break
        text = f"{text} {more}"
    if primary and getattr(exc, "diag", None) is None:  # ADBC: the server's message, not libpq's wrapping of it
        text = primary
    found = re.search(r"COPY \S+, line (\d+), column ([^:\s]+)", context)
    if found and "column" not in text:
        text = f"{text} (column {found.group(2)}, line {found.group(1)} of the partition's COPY)"
    return text


def sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None)
    if state:
        return str(state)
    diag = getattr(exc, "diag", None)
    return getattr(diag, "sqlstate", None) if diag is not None else None


def translate(exc: BaseException, conf: PgConnConfig, doing: str, partition: str | None = None) -> ConveyorError:
    """A psycopg or ADBC error as one Conveyor error, classified and scrubbed of secrets."""
    if isinstance(exc, ConveyorError):
        return exc
    state = sqlstate(exc) or ""
    msg = conf.scrub(first_line(exc))
    msg = msg.removeprefix("IO: ").removeprefix("INVALID_ARGUMENT: ").removeprefix("INVALID_DATA: ")
    where = f"postgres {conf.host}:{conf.port}/{conf.dbname}"
    text = f"{where}: {doing}: {msg}"
    if state.startswith("28") or "password authentication failed" in msg or "no password supplied" in msg:
        return ConnectError(text, hint=conf.password_hint())
    if state == "3D000" or re.search(r'database "[^"]*" does not exist', msg):  # the server is up; the database is not there
        found = re.search(r'database "[^"]*" does not exist', msg)
        return ConnectError(f"{where}: {found.group(0) if found else msg}",
                            hint=f"check dbname (or $PGDATABASE): the server at {conf.host}:{conf.port} answered, and has no such database "
                                 "(psql -l lists them)")
    if "no partition of relation" in msg:  # a row outside every partition's bounds, and no DEFAULT partition
        return TransferError(text, partition=partition, retriable=False,  # PostgreSQL's detail names the key's value: left out
                             hint="add a partition that covers these keys, or a DEFAULT partition; with pg_partman, "
                                  "partman.run_maintenance() makes the partitions its premake setting asks for, and "
                                  "a default partition takes the rest")
    if state == "42601":
        return ConfigError(text, hint="check the SQL of the query")
    if state.startswith(("42P01", "3F000", "42703", "42704")):
        return SchemaError(text, hint="check the schema, table and column names")
    if (state.startswith("08") or "connection to server" in msg or "Connection refused" in msg or "could not connect" in msg
            or "failed to resolve host" in msg or "could not translate host name" in msg):
        if partition is None:
            return ConnectError(text, hint=f"is the server running and reachable at {conf.host}:{conf.port}?")
        return TransferError(text, partition=partition, retriable=True)
    retriable = state.startswith(_RETRIABLE_CLASSES) or state in _RETRIABLE_CODES or any(m in msg.lower() for m in _RETRIABLE_MESSAGES)
    return TransferError(text, partition=partition, retriable=retriable)


def _diagnostics(exc: BaseException) -> tuple[str, str]:
    """The server's own message and its context (``COPY t, line 2, column m: ...``) of a psycopg or
    ADBC error, '' where it has none: ADBC's text wraps the message in libpq's ("Failed to execute COPY statement:
    PGRES_FATAL_ERROR ERROR: ...") and leaves the context on a line of its own."""
    diag = getattr(exc, "diag", None)
    if diag is not None:  # psycopg
        return diag.message_primary or "", diag.context or ""
    details = dict(getattr(exc, "details", None) or ())  # ADBC: [(b'PG_DIAG_...', b'...')]
    text = lambda key: (details.get(key) or b"").decode(errors="replace").split("\n", 1)[0]  # noqa: E731
    return text(b"PG_DIAG_MESSAGE_PRIMARY"), text(b"PG_DIAG_CONTEXT")


#: the storage parameters of a scratch table Conveyor drops at the end (a stage): no autovacuum worker analysing it, which
#: the DROP would wait for (the server's deadlock_timeout) and the copy out of it would share the CPU with
SCRATCH_STORAGE = " WITH (autovacuum_enabled = off, toast.autovacuum_enabled = off)"


#: every connection's client encoding (psycopg, ADBC, DuckDB's extension, psql, pg_dump): what Arrow's strings are, and one
#: encoding at both ends of a COPY relayed between two servers, whatever each database's own encoding is (text is converted
#: to it and back by the servers; a character the target's encoding lacks is refused there, by name)
CLIENT_ENCODING = "UTF8"


def connect(conf: PgConnConfig, autocommit: bool = False, partition: str | None = None) -> Any:
    """A psycopg connection, or a ConnectError naming the server (not the password). Inside a task
    (``partition`` given) a lost or refused connection is a retriable TransferError instead: a
    server restarting while a partition starts is cured by the retry, as one restarting mid-COPY is."""
    import psycopg

    try:
        info = conf.conninfo()
        if reuse.active():  # the process of a running job's driver: a connection of an earlier step, made clean
            key = ("postgres", tuple(sorted((k, str(v)) for k, v in info.items())))
            con = reuse.take(key)
            if con is not None and not con.closed:
                con.idle = False
                con.autocommit = autocommit
                return con
            con = _reusable().connect(autocommit=autocommit, prepare_threshold=None, **info)  # nothing prepared outlives a step
            con.reuse_key = key
            return con
        return psycopg.connect(autocommit=autocommit, **info)
    except psycopg.Error as exc:
        raise translate(exc, conf, "cannot connect", partition) from None


_REUSABLE: Any = None


def _reusable() -> Any:
    """psycopg's connection, whose close() hands it back for reuse while a job runs (kit/reuse.py)."""
    global _REUSABLE
    if _REUSABLE is None:
        import psycopg

        class Reusable(psycopg.Connection):  # type: ignore[type-arg]
            reuse_key: Any = None
            #: handed back (a second close() of it is a no-op, as for a closed connection)
            idle = False

            def close(self) -> None:
                if self.idle:
                    return
                self.idle = True  # before another thread can take it from the idle list
                if self.reuse_key is None or not reuse.give_back(self.reuse_key, self, _clean):
                    self.idle = False
                    super().close()

            def really_close(self) -> None:
                super().close()

        _REUSABLE = Reusable
    return _REUSABLE


def _clean(con: Any) -> bool:
    """A connection whose transaction is rolled back (as closing it would), reset to a new session's state
    (settings, advisory locks, temporary tables, prepared statements: ``DISCARD ALL``); anything else is
    not reused."""
    from psycopg.pq import TransactionStatus

    if con.closed or con.broken:
        return False
    if con.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        con.rollback()  # what closing it would have done
    if con.info.transaction_status != TransactionStatus.IDLE:
        return False
    con.autocommit = True
    con.execute("DISCARD ALL")
    return True


# ADBC's PostgreSQL driver reads the server's whole type catalogue whenever a database object is
# made (about 50 ms of client CPU here, for every partition). Connections of one job in one process
# share a database object instead, through a template connection cloned per partition; the type
# catalogue is then the one read when the job's first connection opened. A few jobs' templates are
# kept per process (a Ray worker may serve several jobs), the oldest closed first.
_TEMPLATES: OrderedDict[tuple[str, str], Any] = OrderedDict()
_TEMPLATES_LOCK = threading.Lock()
_MAX_TEMPLATES = 4


def adbc_connect(conf: PgConnConfig, partition: str | None = None, scope: str | None = None) -> Any:
    """An ADBC connection (autocommit off: one transaction until commit or rollback).

    With ``scope`` (a job's load id: every table of a job over several), connections share one ADBC database object per server.
    """
    import adbc_driver_manager
    import adbc_driver_postgresql.dbapi as pgdbapi

    uri = conf.uri()
    try:
        if scope is None:
            return pgdbapi.connect(uri)
        with _TEMPLATES_LOCK:
            template = _TEMPLATES.get((uri, scope))
            if template is None:
                template = _TEMPLATES[(uri, scope)] = pgdbapi.connect(uri)
                while len(_TEMPLATES) > _MAX_TEMPLATES:
                    _close_quietly(_TEMPLATES.popitem(last=False)[1])
            else:
                _TEMPLATES.move_to_end((uri, scope))
            return template.adbc_clone()
    except adbc_driver_manager.Error as exc:
        raise translate(exc, conf, "cannot connect", partition) from None


def _close_quietly(con: Any) -> None:
    with contextlib.suppress(Exception):
        con.close()


@atexit.register
def close_adbc_templates() -> None:
    """Close the shared ADBC connections of this process."""
    with _TEMPLATES_LOCK:
        while _TEMPLATES:
            _close_quietly(_TEMPLATES.popitem()[1])


def ident(*names: str) -> str:
    """A quoted, optionally qualified identifier: ident("public", "Orders") -> "public"."Orders"."""
    return ".".join('"' + n.replace('"', '""') + '"' for n in names)


def literal(value: Any) -> str:
    """A value as an SQL literal, quoted by psycopg (for partition bounds rendered into COPY)."""
    from psycopg import sql

    return sql.Literal(value).as_string(None)


def row_hash_sql(columns: tuple[str, ...] | list[str]) -> str:
    """A 64-bit hash of a row's text (the given columns, in order), as a bigint."""
    cols = ", ".join(ident(c) for c in columns)
    return f"('x' || left(md5(ROW({cols})::text), 16))::bit(64)::bigint"


class PgDialect(Dialect):
    """PostgreSQL's: literals rendered (COPY takes no parameters), percentile_disc for quantiles."""

    name = "postgres"
    binds = False

    def quote(self, name: str) -> str:
        return ident(name)

    def literal(self, value: Any) -> str:
        return literal(value)

    def quantiles(self, column: str, fractions: str, relation: str) -> str | None:
        return f"SELECT percentile_disc(ARRAY[{fractions}]) WITHIN GROUP (ORDER BY {column}) FROM {relation}"


PG_DIALECT = PgDialect()
