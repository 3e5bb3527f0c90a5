"""ClickHouse: connection settings, its HTTP interface, errors, and the SQL dialect.

Every statement goes over ClickHouse's HTTP interface (port 8123 by default; ``secure: true`` for
HTTPS): rows in Native blocks both ways (``conveyor/connectors/clickhouse/native.py``), small answers as
TSV. The password travels in a header (``X-ClickHouse-Key``), never in a URL or a message.
"""

from __future__ import annotations

import datetime as dt
import decimal
import http.client
import urllib.parse
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from conveyor.errors import ConnectError, ConveyorError, SchemaError, TransferError, first_line
from conveyor.kit.credentials import ScrubsPassword, fill_from_env, read_password
from conveyor.kit.sql import Dialect

_CH_ENV = {"host": ("CLICKHOUSE_HOST", "127.0.0.1"), "port": ("CLICKHOUSE_HTTP_PORT", "8123"), "user": ("CLICKHOUSE_USER", "default"),
           "database": ("CLICKHOUSE_DATABASE", "default")}
# server error codes a retry may cure: timeouts, too many parts or queries, network, memory
_RETRIABLE = ("Code: 159,", "Code: 164,", "Code: 202,", "Code: 209,", "Code: 210,", "Code: 241,", "Code: 252,", "Code: 425,")


def qident(name: str) -> str:
    """A ClickHouse identifier, backquoted (backslash and backquote escaped)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: Any) -> str:
    """A value as a ClickHouse literal (strings quoted with backslash escapes)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, decimal.Decimal)):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.datetime):
        return "'" + value.strftime("%Y-%m-%d %H:%M:%S") + "'"
    if isinstance(value, dt.date):
        return "'" + value.isoformat() + "'"
    text = value.decode() if isinstance(value, bytes) else str(value)
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ClickHouseDialect(Dialect):
    name = "clickhouse"
    binds = False

    def quote(self, name: str) -> str:
        return qident(name)

    def literal(self, value: Any) -> str:
        return literal(value)

    def quantiles(self, column: str, fractions: str, relation: str) -> str | None:
        return f"SELECT quantiles({fractions})({column}) FROM {relation}"

    def count_where(self, cond: str) -> str:
        return f"countIf({cond})"


CH_DIALECT = ClickHouseDialect()


@dataclass
class ClickHouseConnConfig(ScrubsPassword):
    ENVIRONMENT_KEYS: ClassVar[tuple[str, ...]] = tuple(_CH_ENV)

    #: null: $CLICKHOUSE_HOST, else 127.0.0.1
    host: str | None = None
    #: the HTTP interface's port; null: $CLICKHOUSE_HTTP_PORT, else 8123
    port: int | None = None
    #: null: $CLICKHOUSE_USER, else default
    user: str | None = None
    #: null: $CLICKHOUSE_DATABASE, else default
    database: str | None = None
    #: the environment variable holding the password, read where the connection opens
    password_env: str = "CLICKHOUSE_PASSWORD"
    #: or a file holding it (first line), read where the connection opens
    password_file: str | None = None
    #: HTTPS instead of HTTP
    secure: bool = False
    connect_timeout: int = 10
    #: seconds a statement may wait for the server's answer
    timeout: int = 3600
    #: server settings sent with every statement, e.g. {max_threads: 4}
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fill_from_env(self, _CH_ENV)

    def password(self) -> str | None:
        return read_password(self.password_env, self.password_file, "CLICKHOUSE_PASSWORD")

    def where(self) -> str:
        return f"clickhouse {self.user}@{self.host}:{self.port}/{self.database}"

    def translate(self, exc: BaseException, doing: str, partition: str | None = None) -> ConveyorError:
        """A server or network error as one Conveyor error, classified and scrubbed of the password."""
        if isinstance(exc, ConveyorError):
            return exc
        msg = self.scrub(first_line(exc)).replace("e.displayText() = ", "")
        text = f"{self.where()}: {doing}: {msg}"
        if "Code: 516" in msg or "Code: 192" in msg or "Code: 193" in msg or "Authentication failed" in msg or "Wrong password" in msg:
            return ConnectError(text, hint=f"check the user and the password in ${self.password_env or 'CLICKHOUSE_PASSWORD'} "
                                           "(or password_file) where this connection opened")
        if "Code: 60," in msg or "Code: 81," in msg or "doesn't exist" in msg:
            return SchemaError(text, hint="check the database and table names")
        if isinstance(exc, OSError) and partition is None:
            return ConnectError(text, hint=f"is the server's HTTP interface running and reachable at {self.host}:{self.port}?")
        return TransferError(text, partition=partition, retriable=isinstance(exc, OSError) or any(m in msg for m in _RETRIABLE))

    def _connection(self, plain: bool = False) -> http.client.HTTPConnection:
        """``plain``: an HTTP/1.0 request, whose reply comes without chunked framing (a reply of rows read in
        large reads, not parsed chunk by chunk in Python)."""
        if plain:
            cls = _Https10 if self.secure else _Http10
        else:
            cls = http.client.HTTPSConnection if self.secure else http.client.HTTPConnection
        return cls(self.host or "127.0.0.1", int(self.port or 8123), timeout=self.connect_timeout)

    def _target(self, sql: str | None, settings: dict[str, Any] | None) -> str:
        params = {"database": self.database or "default", **{k: str(v) for k, v in {**self.settings, **(settings or {})}.items()}}
        if sql is not None:
            params["query"] = sql
        return "/?" + urllib.parse.urlencode(params)

    def _headers(self) -> dict[str, str]:
        return {"X-ClickHouse-User": self.user or "default", "X-ClickHouse-Key": self.password() or ""}

    @contextmanager
    def response(self, sql: str, body: Iterable[bytes] | bytes | None = None, settings: dict[str, Any] | None = None,
                 doing: str = "running SQL", partition: str | None = None) -> Any:
        """The server's reply to ``sql`` (with ``body``: the statement's data, e.g. Native blocks of an INSERT), open."""
        con = self._connection(plain=body is None)
        try:
            try:
                if body is None:  # the statement in the body: no URL length limit
                    con.request("POST", self._target(None, settings), body=sql.encode(), headers=self._headers())
                elif isinstance(body, bytes):
                    con.request("POST", self._target(sql, settings), body=body, headers=self._headers())
                else:
                    con.request("POST", self._target(sql, settings), body=body, headers=self._headers(), encode_chunked=True)
                con.sock.settimeout(self.timeout)
                resp = con.getresponse()
            except ConveyorError:
                raise
            except Exception as exc:
                raise self.translate(exc, doing, partition) from None
            if resp.status != 200:
                raise self.translate(RuntimeError(resp.read().decode(errors="replace")), doing, partition)
            yield resp
        finally:
            con.close()

    def run(self, *statements: str, doing: str = "running SQL", partition: str | None = None,
            settings: dict[str, Any] | None = None) -> list[list[str]]:
        """Statements one after another; the last one's rows as TSV fields (unescaped text; a NULL reads ``N``: cast in SQL)."""
        rows: list[list[str]] = []
        for sql in statements:
            with self.response(sql, doing=doing, partition=partition, settings=settings) as resp:
                text = resp.read().decode()
            rows = [[_unescape(f) for f in line.split("\t")] for line in text.splitlines()]
        return rows

    def values(self, sql: str, doing: str = "running SQL") -> list[tuple[Any, ...]]:
        """A query's rows as Python values, typed by the columns' ClickHouse types (small answers only: planning)."""
        with self.response(sql + " FORMAT TSVWithNamesAndTypes", doing=doing) as resp:
            lines = resp.read().decode().splitlines()
        if len(lines) < 2:
            return []
        types = lines[1].split("\t")
        return [tuple(_value(f, t) for f, t in zip(line.split("\t"), types)) for line in lines[2:]]

    def server_zone(self) -> str:
        return self.run("SELECT timezone()", doing="reading the server's time zone")[0][0]


class _Http10(http.client.HTTPConnection):
    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"


class _Https10(http.client.HTTPSConnection):
    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f"}.get(nxt, nxt))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _value(text: str, typ: str) -> Any:
    """One TSV field of a planning answer as a Python value."""
    if text == "\\N":
        return None
    base = typ.removeprefix("Nullable(").removesuffix(")") if typ.startswith("Nullable(") else typ
    if base.startswith("Array("):
        body = text[1:-1]
        item = base[6:-1]
        return [] if not body else [_value(v.strip("'"), item) for v in body.split(",")]
    if base.startswith(("Int", "UInt")):
        return int(text)
    if base.startswith("Float"):
        return float(text)
    if base.startswith("Decimal"):
        return decimal.Decimal(text)
    if base == "Date":
        return dt.date.fromisoformat(text)
    if base.startswith("DateTime"):
        return dt.datetime.fromisoformat(text)
    return _unescape(text)
