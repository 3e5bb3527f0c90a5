"""What the ADBC source and sink share: their configs, loading the driver by name, one
connection with the driver's errors mapped onto Conveyor's, and the dialect (see the package's
docstring for what the connector does)."""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ConfigError, ConnectError, ConveyorError, PluginError, SchemaError, TransferError, first_line, scrub_value
from conveyor.kit.sql import Dialect


@dataclass
class AdbcConfig:
    #: the driver's short name: sqlite, postgresql, flightsql, snowflake, ...
    driver: str = "???"
    #: the driver's URI (a file for sqlite); put secrets in it only as ${oc.env:VAR}
    uri: str = ""
    #: database options passed to the driver (e.g. {adbc.flight.sql.authorization_header: ...})
    db_kwargs: dict[str, str] = field(default_factory=dict)


@dataclass
class AdbcSourceConfig(AdbcConfig):
    table: str | None = None
    db_schema: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")


@dataclass
class AdbcSinkConfig(AdbcConfig):
    table: str = "???"
    db_schema: str | None = None
    #: columns whose values may change type by the database's own conversion; ["*"]: every column.
    #: By default a type change that could alter a value is refused (conveyor/kit/casts.py); SQLite,
    #: whose columns have affinities rather than types, is not judged
    allow_cast: list[str] = field(default_factory=list)


def _module(driver: str) -> Any:
    name = f"adbc_driver_{driver.replace('-', '_')}"
    try:
        return importlib.import_module(f"{name}.dbapi")
    except ModuleNotFoundError:
        raise PluginError(f"adbc driver {driver!r} is not installed",
                          hint=f"pip install adbc-driver-{driver.replace('_', '-')}") from None


def qident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class AdbcBase:
    config: AdbcConfig

    def _connect(self, partition: str | None = None) -> Any:
        import adbc_driver_manager

        dbapi = _module(self.config.driver)
        extra = {"db_kwargs": dict(self.config.db_kwargs)} if self.config.db_kwargs else {}
        try:
            conn = dbapi.connect(self.config.uri, **extra)
        except adbc_driver_manager.Error as exc:
            raise self._translate(exc, "cannot connect", partition) from None
        except TypeError:
            raise ConfigError(f"{self._where()}: this driver takes no db_kwargs", key="db_kwargs") from None
        if self.config.driver == "sqlite":  # several writers wait their turn instead of failing
            cur = conn.cursor()
            cur.execute("PRAGMA busy_timeout = 60000")
            cur.fetchall()
            cur.close()
        return conn

    def _where(self) -> str:
        return f"adbc {self.config.driver}"

    def _translate(self, exc: BaseException, doing: str, partition: str | None = None) -> ConveyorError:
        if isinstance(exc, ConveyorError):
            return exc
        text = first_line(exc)
        text = scrub_value(text, *_secrets(self.config.db_kwargs))
        msg = f"{self._where()}: {doing}: {text}"
        low = text.lower()
        if "unauthenticated" in low or "authentication" in low or "password" in low:
            return ConnectError(msg, hint="check the credentials")
        if doing == "cannot connect" or "unavailable" in low or "connection refused" in low:
            if partition is None:
                return ConnectError(msg, hint="check the uri and that the server is running")
            return TransferError(msg, partition=partition, retriable=True)
        if "no such table" in low or "does not exist" in low or "not found" in low:
            return SchemaError(msg, hint="check the table / query")
        return TransferError(msg, partition=partition, retriable="locked" in low or "busy" in low)

    def _run(self, sql: str, params: list[Any] | None = None, doing: str = "query") -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cur = conn.cursor()
            try:
                cur.execute(sql, parameters=params or None)
                return cur.fetchall() if cur.description else []
            except Exception as exc:
                raise self._translate(exc, doing) from None
            finally:
                cur.close()
        finally:
            with contextlib.suppress(Exception):
                conn.commit()
            conn.close()


class AdbcDialect(Dialect):
    """Standard SQL with the driver's placeholders ("?", or "$1" for postgresql)."""

    def __init__(self, driver: str) -> None:
        self.name = f"adbc {driver}"
        self.numbered = driver == "postgresql"

    def placeholder(self, i: int) -> str:
        return f"${i}" if self.numbered else "?"


def _secrets(kwargs: dict[str, Any]) -> list[str]:
    """Values a driver message must not show: every option's value, and a URI's password."""
    from urllib.parse import unquote, urlsplit

    out = [str(v) for v in kwargs.values() if v]
    for v in out[:]:
        if "://" in v:
            try:
                pw = urlsplit(v).password
            except ValueError:
                pw = None
            if pw:
                out += [pw, unquote(pw)]
    return out

