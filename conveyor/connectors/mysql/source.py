"""The MySQL / MariaDB source.

Rows travel through DuckDB's mysql extension (C++; the ``duckdb-extension-mysql`` wheel, installed
offline): a partition's SELECT runs on the server and its result is decoded into Arrow batches
(``mysql_query``). Planning uses PyMySQL (a few small statements; no rows pass through Python).

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
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.mysql import textcopy
from conveyor.connectors.mysql.common import MYSQL_DIALECT, MySqlConnConfig, _duck_connection, qident
from conveyor.connectors.mysql.feed import MySqlChangeFeed
from conveyor.core import JobOptions, Partition, SourceInfo, TableDefinition
from conveyor.errors import ConveyorError, SchemaError, TransferError
from conveyor.kit import duckext
from conveyor.kit.arrowutil import rebatch
from conveyor.kit.sql import SqlSource


@dataclass
class MySqlSourceConfig(MySqlConnConfig):
    #: read a table ...
    table: str | None = None
    #: ... or any query
    query: str | None = None
    #: zero dates ('0000-00-00', '2024-00-15': MySQL without NO_ZERO_DATE) have no Arrow form: error (the
    #: default) names the column; null reads them as NULL
    zero_dates: str | None = "error"

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")
        if self.zero_dates is None:  # zero_dates=null on the command line is YAML's null: the policy named null
            self.zero_dates = "null"
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
    #: a text column's character set where it is not utf8mb4 / utf8 (e.g. ascii): the COPY text stream converts it
    #: (CONCAT with the utf8mb4 rest of the line is refused: "Illegal mix of collations")
    other_charset: str = ""

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


class MySqlSource(MySqlChangeFeed, SqlSource):
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
                self._cols = self._charsets(cur, self._cols)
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
        key, made = self._definition() if conf.table else ((), None)
        return SourceInfo(schema=self._schema, label=label, estimated_rows=estimate, estimated_bytes=size,
                          reader="Arrow batches decoded by DuckDB's mysql extension", native=textcopy.offer(self._cols),
                          primary_key=key, definition=made)

    def _charsets(self, cur: Any, cols: tuple[MyColumn, ...]) -> tuple[MyColumn, ...]:
        """``cols`` with the character set each text column is stored in where it is not utf8mb4 / utf8 (the result's
        metadata gives the connection's). CHARSET() names an expression's, rows or not: one query over no row."""
        text = [c for c in cols if c.text]
        if not text:
            return cols
        cur.execute(f"SELECT {', '.join(f'CHARSET(t.{qident(c.name)})' for c in text)} FROM (SELECT 1) AS one "
                    f"LEFT JOIN (SELECT * FROM {self._from()} LIMIT 0) AS t ON TRUE")
        found = dict(zip((c.name for c in text), cur.fetchone() or ()))
        return tuple(dataclasses.replace(c, other_charset=str(found[c.name])) if str(found.get(c.name) or "utf8mb4")
                     not in ("utf8mb4", "utf8mb3", "utf8", "binary") else c for c in cols)

    def _definition(self) -> tuple[tuple[str, ...], TableDefinition]:
        """The table's primary key (its columns in the key's order) and its definition, from information_schema: NOT NULL
        and comments, which a sink of another engine carries, and what it does not (defaults, AUTO_INCREMENT, other
        indexes, triggers: MySQL's SQL, said)."""
        table = MYSQL_DIALECT.literal(self.config.table)
        where = f"table_schema = DATABASE() AND table_name = {table}"
        cols = self._rows(f"SELECT column_name, is_nullable, column_comment, column_default, extra FROM information_schema.columns "
                          f"WHERE {where} ORDER BY ordinal_position")
        key = self._rows(f"SELECT column_name FROM information_schema.key_column_usage WHERE {where} AND constraint_name = 'PRIMARY' "
                         "ORDER BY ordinal_position")
        comment, indexes, triggers = self._rows(
            f"SELECT (SELECT table_comment FROM information_schema.tables WHERE {where}), "
            f"(SELECT count(DISTINCT index_name) FROM information_schema.statistics WHERE {where} AND index_name <> 'PRIMARY'), "
            f"(SELECT count(*) FROM information_schema.triggers WHERE event_object_schema = DATABASE() AND event_object_table = {table})")[0]
        names = {c.name for c in self._cols}
        left = [f"column {c}'s AUTO_INCREMENT" for c, _, _, _, extra in cols if "auto_increment" in str(extra).lower()]
        left += [f"{n} {what} (MySQL's SQL)" for n, what in ((int(indexes or 0), "other index(es)"), (int(triggers or 0), "trigger(s)")) if n]
        made = TableDefinition(
            "mysql", self.config.table, not_null=tuple(c for c, nullable, *_ in cols if nullable == "NO" and c in names),
            comment=comment or None, column_comments=tuple((c, text) for c, _, text, *_ in cols if text and c in names),
            defaults=tuple((c, str(default)) for c, _, _, default, _ in cols if default not in (None, "NULL") and c in names),
            not_carried=tuple(left))
        return tuple(r[0] for r in key), made

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[Any]:
        """The partition as lines of PostgreSQL's COPY text, written by the server (``textcopy.py``)."""
        if self._schema is None:
            self.describe()
        sql = textcopy.select_sql(self._cols, columns, self._from(), self._predicate(part)[0], self.config.zero_dates or "error")
        return textcopy.export(self.config, sql, part.key)

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

    def key_values(self, column: str, limit: int | None = None) -> list[tuple[Any, int]]:
        self._key_kind(column)
        q = qident(column)
        rows = self._rows(f"SELECT {q}, count(*) FROM {self._relation()} GROUP BY {q} ORDER BY {q}"  # NULL sorts first in MySQL
                          + (f" LIMIT {int(limit)}" if limit is not None else ""))
        return [(r[0], int(r[1])) for r in rows]


def _arrow_type(col: MyColumn, read: Any) -> Any:
    """The Arrow type a column's batches carry: DuckDB's, with text as strings and TIMESTAMP as UTC."""
    import pyarrow as pa

    if col.text and (pa.types.is_binary(read) or pa.types.is_large_binary(read)):
        return pa.string()
    if col.code in (7, 12) and pa.types.is_timestamp(read):
        # the unit that keeps the column's fractional digits (DATETIME(0) as seconds, (3) as milliseconds): a
        # target's precision is judged against the source's, and a DATETIME(0) copy must not look finer than it is
        unit = "s" if col.scale == 0 else "ms" if col.scale == 3 else read.unit
        return pa.timestamp(unit, tz="UTC" if col.code == 7 else None)
    if col.code == 1:
        return pa.uint8() if col.flags & 32 else pa.int8()
    return read


# PyMySQL's field type codes -> MySQL type names (those the source treats specially, and the usual ones)
_FIELD_TYPES = {0: "decimal", 1: "tinyint", 2: "smallint", 3: "int", 4: "float", 5: "double", 7: "timestamp", 8: "bigint",
                9: "mediumint", 10: "date", 11: "time", 12: "datetime", 13: "year", 15: "varchar", 16: "bit", 245: "json",
                246: "decimal", 247: "enum", 248: "set", 249: "blob", 250: "blob", 251: "blob", 252: "blob", 253: "varchar",
                254: "char", 255: "geometry"}


# --- sink ------------------------------------------------------------------------------------------
