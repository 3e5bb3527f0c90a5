"""PostgreSQL source: a table or a query, read through binary COPY by ADBC's libpq driver.

ADBC decodes the binary COPY stream into Arrow in native code. Types it has no Arrow
type for (inet, money, ranges, geometric, ...) are read as their text form; numeric(p,s)
becomes decimal(p,s); numeric without a precision is read as PostgreSQL prints it (text),
since an Arrow decimal has a fixed scale and no NaN. Every partition of a job reads one
snapshot, exported by the driver for the duration of the job.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.postgres import changes, duckdecode, passthrough
from conveyor.connectors.postgres.common import PG_DIALECT, PgConnConfig, adbc_connect, connect, ident, literal, row_hash_sql, translate
from conveyor.connectors.postgres.types import PgColumn, numeric_arrow_type, read_arrow_type, read_columns
from conveyor.core import (
    INFINITY,
    INFINITY_DAYS,
    INFINITY_TICKS,
    DeferredSchema,
    ForeignKey,
    JobOptions,
    NativeStream,
    PageRange,
    Partition,
    SentBatches,
    SourceInfo,
    SourceTable,
    WholeSource,
)
from conveyor.errors import ConfigError, PlanningError, SchemaError, TransferError
from conveyor.kit.arrowutil import rebatch
from conveyor.kit.casts import TEXT_OF
from conveyor.kit.sql import SqlSource, pick_tables

_HEAP_KINDS = {"r": "table", "m": "materialized view", "p": "partitioned table"}
_KIND_NAMES = {"v": "view", "f": "foreign table", "p": "partitioned table", "m": "materialized view", "r": "table"}


SPECIAL_VALUES = ("error", "null", "clamp")
DECODERS = ("auto", "duckdb", "adbc")


@dataclass
class PostgresSourceConfig(PgConnConfig):
    #: read a table (schema + table) ...
    schema: str = "public"
    table: str | None = None
    #: ... or any query (ctid needs a table)
    query: str | None = None
    #: ... or several tables, all read in one snapshot: names or patterns (schema.table, a table of
    #: ``schema``, ``*`` and ``?`` as in shell globs: [tpch.*]); each gets its own target and partitions
    tables: list[str] = field(default_factory=list)
    #: with tables: names or patterns to leave out
    exclude: list[str] = field(default_factory=list)
    #: all partitions read one exported snapshot (consistent while the table is written to)
    snapshot: bool = True
    #: dates and timestamps Arrow cannot hold (infinity, -infinity, timestamps after
    #: 294247-01-10): error (default) names the column; null writes NULL; clamp writes the latest /
    #: earliest value both can hold. Into a sink that keeps infinity (PostgreSQL, DuckDB), the
    #: default passes infinity and -infinity on exactly.
    special_values: str | None = "error"
    #: what decodes PostgreSQL's binary COPY into Arrow (not used where the sink takes the COPY stream
    #: as it is): duckdb (DuckDB's postgres extension, C++, about 3x less CPU), adbc (ADBC's reader), or
    #: auto: duckdb where its decoding is exactly ADBC's for every column and the extension loads, else adbc
    decoder: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if sum(map(bool, (self.table, self.query, self.tables))) != 1:
            raise ValueError("set exactly one of table, query or tables")
        if self.exclude and not self.tables:
            raise ValueError("exclude goes with tables")
        if self.special_values is None:  # special_values=null on the command line is YAML's null: the policy named null
            self.special_values = "null"
        if self.special_values not in SPECIAL_VALUES:
            raise ValueError(f"special_values: {self.special_values!r} is not one of {', '.join(SPECIAL_VALUES)}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder: {self.decoder!r} is not one of {', '.join(DECODERS)}")


def _scan_count(cur: Any, relid: int, first: bool = False) -> int:
    """ADBC's cursor: what :func:`duckdecode.scan_count` asks on DuckDB's connection."""
    if first:
        cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    cur.execute(f"SELECT pg_stat_get_xact_tuples_returned({int(relid)}::oid)")
    return int(cur.fetchone()[0])


class PostgresSource(SqlSource):
    """Reads a PostgreSQL table or query as Arrow batches; serves every partition method."""

    config_class = PostgresSourceConfig
    dialect = PG_DIALECT

    def __init__(self, config: PostgresSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.columns: tuple[PgColumn, ...] = ()
        self.snapshot_id: str | None = None
        #: what the exported snapshot saw (changes.mark): kept by the run's manifest, so a resume can tell
        #: whether the partitions it finished still hold those rows
        self.snapshot_mark: dict[str, Any] | None = None
        #: the sink keeps infinity (core.INFINITY): pass it on instead of refusing it
        self.keep_infinity = False
        #: incremental.cursor: only the rows of this window are planned, read, counted and checksummed
        self.window = None
        #: the Arrow schema read() yields, made the first time it is read (it imports pyarrow, which a
        #: pass-through never needs); shared with this source's copies (session, keeping, windowed)
        self._schema: Any = None
        #: the decoder that yields the batches (set by describe)
        self.decoder = "adbc"
        #: the server's version number (set by describe; 0: not known)
        self.server_version = 0
        #: the table's oid and kind (pg_class.relkind), set by describe (None: a query), and whether
        #: the server counts the rows each scan returns (pg_stat_get_xact_tuples_returned)
        self.relid: int | None = None
        self.relkind = ""
        self.scan_stats = False

    def keeping(self, kinds: tuple[str, ...]) -> PostgresSource:
        """This source, passing on the special values a sink keeps (only under the default policy)."""
        kept = copy.copy(self)
        kept.keep_infinity = INFINITY in kinds and self.config.special_values == "error"
        return kept

    # --- describing --------------------------------------------------------------------------

    @property
    def relation(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    def _from(self) -> str:
        if self.config.table:
            return ident(self.config.schema, self.config.table)
        return f"({self.config.query}) AS _conveyor_q"

    def _relation_info(self, con: Any) -> tuple[str, str | None, int, float]:
        row = con.execute(
            "SELECT c.relkind, am.amname, c.oid, c.reltuples FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_am am ON am.oid = c.relam "
            "WHERE n.nspname = %s AND c.relname = %s",
            [self.config.schema, self.config.table],
        ).fetchone()
        if row is None:
            raise SchemaError(f"postgres source: table {self.relation} does not exist",
                              hint=f"check source.schema and source.table on {self.config.where()}")
        return row[0], row[1], row[2], row[3]

    def describe(self) -> SourceInfo:
        con = connect(self.config, autocommit=True)
        try:
            self.server_version = con.info.server_version
            estimate, size, keys = None, None, ((), ())
            if self.config.table:
                kind, _, oid, reltuples = self._relation_info(con)
                self.relid, self.relkind = int(oid), kind
                keys = _keys(con, oid)
                estimate = int(reltuples) if reltuples and reltuples > 0 else None
                # and whether the server counts each scan's rows for the read's own transaction (not every
                # server that speaks PostgreSQL's protocol has the function, or counts: track_counts)
                size, self.scan_stats = con.execute(
                    "SELECT coalesce((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree(%s::oid) WHERE isleaf), "
                    "pg_table_size(%s::oid))::bigint, to_regprocedure('pg_catalog.pg_stat_get_xact_tuples_returned(oid)') "
                    "IS NOT NULL AND current_setting('track_counts', true) = 'on'", [oid, oid]).fetchone()
                label = f"postgres {_KIND_NAMES.get(kind, 'relation')} {self.relation}"
            else:
                label = "postgres query"
            try:
                self.columns = tuple(read_columns(con, f"SELECT * FROM {self._from()} LIMIT 0"))
            except Exception as exc:
                raise translate(exc, self.config, "describing the source") from None
        finally:
            con.close()
        self._schema = DeferredSchema(self._arrow_schema, [c.name for c in self.columns])
        self.decoder, reader = self._pick_decoder()
        return SourceInfo(schema=self._schema, label=label, estimated_rows=estimate, estimated_bytes=size,
                          native=passthrough.offer(self.columns), reader=reader, primary_key=keys[0], foreign_keys=keys[1],
                          reads_count=self._counted_kinds(), checksums=True)

    @property
    def schema(self) -> Any:
        """The Arrow schema of the batches ``read`` yields (describe first; made on first use)."""
        if self._schema is None:
            self.describe()
        made = self._schema
        return made.get() if isinstance(made, DeferredSchema) else made  # a made one travels made (pickled)

    def _pick_decoder(self) -> tuple[str, str]:
        """(decoder, what the job's log says of it): DuckDB's where it is exact and loads."""
        asked = self.config.decoder
        if asked == "adbc":
            return "adbc", "Arrow batches decoded by ADBC's COPY reader (source.decoder=adbc)"
        unfit = duckdecode.unfit_column(self.columns)
        if unfit is not None:
            if asked == "duckdb":
                raise SchemaError(f"source.decoder=duckdb: column {unfit.name} ({unfit.type_sql}) is not decoded exactly by "
                                  "DuckDB's postgres extension", hint="use source.decoder=auto or adbc")
            return "adbc", (f"Arrow batches decoded by ADBC's COPY reader (column {unfit.name}, {unfit.type_sql}, "
                            "is not one DuckDB's decoder reads exactly)")
        why = duckdecode.unavailable()
        if why is not None:
            if asked == "duckdb":
                raise ConfigError(f"source.decoder=duckdb: DuckDB's postgres extension does not load: {why}",
                                  hint="pip install 'conveyor[postgres]' (duckdb-extension-postgres, the same version as duckdb), "
                                       "or source.decoder=adbc")
            return "adbc", f"Arrow batches decoded by ADBC's COPY reader (DuckDB's postgres extension does not load: {why})"
        return "duckdb", f"Arrow batches decoded by DuckDB's postgres extension (source.decoder={asked})"

    def _arrow_schema(self) -> Any:
        """The Arrow schema of the batches ``read`` yields (ADBC's, with numerics as decimals): from
        the columns' PostgreSQL types where every one has a known Arrow type (no ADBC connection,
        ~0.1 s of a job's start), else as ADBC's driver reads them."""
        import pyarrow as pa

        known = [read_arrow_type(col) for col in self.columns]
        if all(t is not None for t in known):
            return pa.schema([pa.field(col.name, t, metadata=_text_of(col)) for col, t in zip(self.columns, known)])
        return self._adbc_schema()

    def _adbc_schema(self) -> Any:
        """The Arrow schema of the batches ``read`` yields, as ADBC's driver reads the columns (numerics as decimals)."""
        import pyarrow as pa

        conn = adbc_connect(self.config, scope=self.options.run_id)
        try:
            cur = conn.cursor()
            try:
                cur.execute(f"SELECT {self._select_list()} FROM {self._from()} LIMIT 0")
                raw = cur.fetch_arrow_table().schema
            except Exception as exc:
                raise translate(exc, self.config, "describing the source") from None
            finally:
                cur.close()
        finally:
            conn.close()
        return pa.schema([pa.field(col.name, numeric_arrow_type(col) or field.type, metadata=_text_of(col))
                          for col, field in zip(self.columns, raw)])

    def _select_list(self) -> str:
        return ", ".join(c.select_expr() for c in self.columns)

    # --- the snapshot every partition reads -----------------------------------------------------

    @contextlib.contextmanager
    def session(self) -> Iterator[PostgresSource]:
        """Export a snapshot and hold it open for the job; yields the copy tasks receive."""
        if not self.config.snapshot:
            yield self
            return
        # autocommit: the transaction is the BEGIN below (without it psycopg opens a default one
        # first, and the server ignores this BEGIN with a warning in its log)
        con = connect(self.config, autocommit=True)
        try:
            con.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # the mark first: its statement takes the snapshot, and reads the transactions then running right after
            seen = changes.mark(con, self._literal_table() if self.config.table else None)
            snap = con.execute("SELECT pg_export_snapshot()").fetchone()[0]
            shipped = copy.copy(self)
            shipped.snapshot_id, shipped.snapshot_mark = snap, seen
            yield shipped
        finally:
            con.close()  # ends the exporting transaction (and with it the snapshot)

    # --- several tables in one job (source.tables) ----------------------------------------------

    def many(self) -> bool:
        return bool(self.config.tables)

    def tables(self) -> list[SourceTable]:
        """The tables ``source.tables`` matches (less ``exclude``), largest first, in the job's snapshot."""
        rows = self._rows("SELECT n.nspname, c.relname, pg_table_size(c.oid), c.relkind IN ('r', 'p') FROM pg_class c "
                          "JOIN pg_namespace n ON n.oid = c.relnamespace "
                          "WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition AND n.nspname NOT IN "
                          "('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'")
        return pick_tables([(SourceTable(n, r, int(b or 0)), t) for n, r, b, t in rows], self.config.tables, self.config.exclude,
                           self.config.schema, self.config.where())

    def for_table(self, table: SourceTable, options: JobOptions) -> PostgresSource:
        """This source for one of its tables, reading in its snapshot."""
        one = PostgresSource(dataclasses.replace(self.config, schema=table.schema, table=table.name, tables=[], exclude=[]), options)
        one.snapshot_id, one.snapshot_mark = self.snapshot_id, self.snapshot_mark
        return one

    # --- resume: are the partitions a stopped run finished unchanged? (changes.py) ----------------

    def change_mark(self) -> dict[str, Any] | None:
        """What this run's snapshot saw of the table (None for a query: its rows have no versions to compare)."""
        if not self.config.table:
            return None
        mark = self.snapshot_mark
        if mark is None or "files" not in mark:  # snapshot=false (each partition reads its own, all later), or one of several tables
            con = connect(self.config, autocommit=True)
            try:
                for stmt in self.begin_snapshot_sql():
                    con.execute(stmt)
                taken = changes.mark(con, self._literal_table())
            finally:
                con.close()
            mark = {**(mark or taken), "files": taken["files"]}
        return mark

    def changed_since(self, mark: Any, parts: Any, rows: Any) -> list[str] | None:
        """The partitions of ``parts`` that no longer hold the ``rows`` loaded from them under ``mark``."""
        if not self.config.table or not mark or "xmax" not in mark:
            return None
        return changes.changed(self, mark, parts, rows)

    def _literal_table(self) -> str:
        return literal(ident(self.config.schema, self.config.table or ""))

    def count_where(self, parts: list[Partition], cond: str) -> list[tuple[int, int]]:
        """(rows, rows where ``cond``) of each partition, in the job's snapshot, in one reading of them."""
        if self._page_ranges(parts):
            return [(row[0], row[1]) for row in self._per_range(f"count(*), count(*) FILTER (WHERE {cond})", parts)]
        out: list[tuple[int, int]] = []
        for i in range(0, len(parts), 100):
            exprs = ", ".join(f"count(*) FILTER (WHERE {c}), count(*) FILTER (WHERE ({c}) AND {cond})" for c in self._conds(parts[i:i + 100]))
            row = self._rows(f"SELECT {exprs} FROM {self._from()}")[0]
            out += [(int(row[j]), int(row[j + 1])) for j in range(0, len(row), 2)]
        return out

    # --- capabilities for the strategies --------------------------------------------------------

    def ctid_pages(self) -> int:
        return self.ctid_pages_sampled(0, 0)[0]

    def ctid_pages_sampled(self, target: int, min_pages: int) -> tuple[int, list[tuple[int, int]]]:
        """The table's pages; and where ``target`` and at least ``min_pages`` pages, the live rows of
        about ``target`` pages spread evenly over the table (every k-th page, empty ones included:
        TABLESAMPLE's random pages fall unevenly into the ranges, and made an even table look 1.12x
        uneven), each counted by a TID range scan of its page, on the same connection. PostgreSQL 14+
        (older servers have no TID range scan: no sample); not of a partitioned table (its leaves'
        pages share one page range). Not in the job's snapshot: a sample only weighs the ranges, whose
        bounds cover every page whatever it says. JIT off for it: the planner's estimate of the
        per-page scans (a range's share of the table each) crosses jit_above_cost, and compiling
        cost more than the scans."""
        if not self.config.table:
            raise PlanningError("strategy=ctid needs a table, and the source is a query",
                                hint="use strategy=rangeid, ntile or random with a distribute_key, or none")
        con = connect(self.config, autocommit=True)
        try:
            kind, am, oid, _ = self._relation_info(con)
            if kind not in _HEAP_KINDS or (am not in (None, "heap")):
                what = f"a {am} table" if am not in (None, "heap") else f"a {_KIND_NAMES.get(kind, 'relation')}"
                raise PlanningError(f"strategy=ctid: {self.relation} is {what}, which has no ctid page ranges",
                                    hint="use strategy=rangeid or ntile with strategy.distribute_key=<column>, or none")
            # a partitioned table: each leaf has its own pages, and one page range covers them all
            row = con.execute(
                "SELECT greatest(pg_relation_size(%s::oid), coalesce(max(pg_relation_size(relid)), 0)) "
                "/ current_setting('block_size')::int FROM pg_partition_tree(%s::oid) WHERE isleaf",
                [oid, oid],
            ).fetchone()
            pages = int(row[0] or 0)
            if not target or kind not in ("r", "m") or pages < max(min_pages, 1) or con.info.server_version < 140000:
                return pages, []
            step = max(1, pages // target)
            con.execute("SET jit = off")
            sample = con.execute(
                f"SELECT p, (SELECT count(*) FROM {self._from()} WHERE ctid >= format('(%%s,0)', p)::tid "
                "AND ctid < format('(%%s,0)', p + 1)::tid) FROM generate_series(%s::bigint, %s::bigint, %s::bigint) AS p",
                [step // 2, pages - 1, step]).fetchall()
            return pages, [(int(page), int(n)) for page, n in sample]
        finally:
            con.close()

    def _column(self, name: str) -> PgColumn:
        if not self.columns:
            self.describe()
        for col in self.columns:
            if col.name == name:
                return col
        raise SchemaError(f"postgres source: distribute_key {name!r} is not a column of {self.relation if self.config.table else 'the query'}",
                          hint=f"columns are: {', '.join(c.name for c in self.columns)}")

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a planning query, read in the job's snapshot when one is held (so a plan sees
        exactly the rows the partitions and the verification see)."""
        con = connect(self.config, autocommit=True)
        try:
            if self.snapshot_id:
                for stmt in self.begin_snapshot_sql():
                    con.execute(stmt)
            return con.execute(sql, params).fetchall()
        except Exception as exc:
            raise translate(exc, self.config, "planning") from None
        finally:
            con.close()  # ends the snapshot's read-only transaction

    # SqlSource's questions (key stats, quantiles, values, counts) asked in PostgreSQL's dialect

    def _relation(self) -> str:
        cond = self._window_sql()
        return f"(SELECT * FROM {self._from()} WHERE {cond}) AS _conveyor_w" if cond else self._from()

    # --- incremental loads ----------------------------------------------------------------------

    # cursor_max and windowed: SqlSource's (the planning relation is the table until a window is set);
    # the window itself goes into where() below, so ctid ranges keep reading the table

    def _check_cursor(self, column: str) -> None:
        """A cursor is an integer, date, timestamp or numeric column of the source, refused by name otherwise."""
        if not self.columns:
            self.describe()
        col = next((c for c in self.columns if c.name == column), None)
        if col is None:
            raise SchemaError(f"incremental.cursor: {column!r} is not a column of {self.relation if self.config.table else 'the query'}",
                              hint=f"columns are: {', '.join(c.name for c in self.columns)}")
        if col.kind != "integer" and col.typname not in ("date", "timestamp", "timestamptz", "numeric"):
            raise SchemaError(f"incremental.cursor: column {column!r} is {col.type_sql}: a cursor is a timestamp, a date or an "
                              "increasing integer", hint="pick an updated_at / id column")

    def _window_sql(self) -> str:
        w = self.window
        if w is None:
            return ""
        if w.empty:
            return "false"
        q = ident(w.column)
        return (f"{q} > {literal(w.low)} AND " if w.low is not None else "") + f"{q} <= {literal(w.high)}"


    def _key_kind(self, column: str) -> str:
        return self._column(column).kind

    def _sample(self) -> str:
        """About 200,000 sampled rows for tables (TABLESAMPLE SYSTEM), all rows for queries."""
        if not self.config.table or self.window is not None:
            return ""
        est = self._rows("SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                          [ident(self.config.schema, self.config.table or "")])[0][0]
        if not est or est <= 200_000:
            return ""
        return f"TABLESAMPLE SYSTEM ({min(100.0, 100.0 * 200_000 / est):.6f}) REPEATABLE (42)"

    def _predicate(self, part: Partition, first: int = 1) -> tuple[str, list[Any]]:
        return self.where(part), []

    # --- reading -------------------------------------------------------------------------------

    def where(self, part: Partition) -> str:
        """The partition as a WHERE clause (empty for the whole source), within the incremental window."""
        base, window = self._where(part).removeprefix(" WHERE "), self._window_sql()
        if not window:
            return f" WHERE {base}" if base else ""
        return f" WHERE ({base}) AND ({window})" if base else f" WHERE {window}"

    def _where(self, part: Partition) -> str:
        if isinstance(part, WholeSource):
            return ""
        if isinstance(part, PageRange):
            if not self.config.table:
                raise PlanningError("a ctid partition needs a table source")
            cond = f"ctid >= '({part.start},0)'::tid"
            if part.stop is not None:
                cond += f" AND ctid < '({part.stop},0)'::tid"
            return f" WHERE {cond}"
        return SqlSource._predicate(self, part)[0]

    def _snapshot_query(self, sql: str) -> tuple[Any, ...]:
        """One row, read in the job's snapshot (so counts agree with what the tasks read)."""
        con = connect(self.config, autocommit=True)
        try:
            for stmt in self.begin_snapshot_sql():
                con.execute(stmt)
            return con.execute(sql).fetchone()
        except Exception as exc:
            raise translate(exc, self.config, "verifying") from None
        finally:
            con.close()  # ends the snapshot's read-only transaction

    def _conds(self, parts: list[Partition]) -> list[str]:
        return [self.where(p).removeprefix(" WHERE ") or "true" for p in parts]

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        """Each partition's row count, in the job's snapshot (page ranges: see :meth:`_per_range`)."""
        if self._page_ranges(parts):
            return [row[0] for row in self._per_range("count(*)", parts)]
        return super().count_rows(parts)

    def _page_ranges(self, parts: list[Partition]) -> bool:
        """ctid partitions, on a server with TID range scans (PostgreSQL 14+)."""
        return bool(parts) and all(isinstance(p, PageRange) for p in parts) and self.server_version >= 140000

    def _per_range(self, exprs: str, parts: list[PageRange]) -> list[tuple[int, ...]]:
        """``exprs`` (aggregates) over each page range, one SELECT per range UNION ALL-ed: each reads
        only its own pages (a TID range scan), and the server's parallel workers share them out, so
        the whole costs one table's reading whatever the number of ranges. One scan with a FILTER per
        range compares every row with every range: verify=count of TPC-H lineitem SF1 took 1.2 CPU-s
        with 8 ranges and 1.75 with 32 (0.6-0.9 s), against 0.6 CPU-s (0.33 s) this way."""
        out: dict[int, tuple[int, ...]] = {}
        for i in range(0, len(parts), 200):
            sql = " UNION ALL ".join(f"SELECT {j}, {exprs} FROM {self._from()}{self.where(p)}" for j, p in enumerate(parts[i:i + 200], i))
            for j, *values in self._rows(sql):
                out[j] = tuple(int(v) for v in values)
        return [out[j] for j in range(len(parts))]

    def checksums(self, parts: list[Partition], columns: tuple[str, ...]) -> list[tuple[int, int]]:
        """(rows, sum of 64-bit row hashes) per partition: rows compared as PostgreSQL prints them."""
        h = row_hash_sql(columns)
        if self._page_ranges(parts):
            return self._per_range(f"count(*), coalesce(sum({h}), 0)", parts)  # (rows, hash sum) each
        out: list[tuple[int, int]] = []
        for i in range(0, len(parts), 100):
            conds = self._conds(parts[i:i + 100])
            exprs = ", ".join(f"count(*) FILTER (WHERE {c}), coalesce(sum({h}) FILTER (WHERE {c}), 0)" for c in conds)
            row = self._snapshot_query(f"SELECT {exprs} FROM {self._from()}")
            out += [(int(row[j]), int(row[j + 1])) for j in range(0, len(row), 2)]
        return out

    def select_sql(self, part: Partition, columns: str | None = None) -> str:
        return f"SELECT {columns or self._select_list()} FROM {self._from()}{self.where(part)}"

    def begin_snapshot_sql(self) -> list[str]:
        """The statements that start a task's transaction on the job's snapshot."""
        if not self.snapshot_id:
            return ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"]
        return ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", f"SET TRANSACTION SNAPSHOT {literal(self.snapshot_id)}"]

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[NativeStream]:
        """The partition as PostgreSQL's binary COPY stream (the pass-through), in the job's snapshot."""
        return passthrough.export(self.config, self.select_sql(part, ", ".join(ident(c) for c in columns)),
                                  self.begin_snapshot_sql(), part.key)

    def warm_up(self) -> None:
        """DuckDB's decoder made ready (the extension loaded, the server attached: ~0.15 s here) while the
        job plans and prepares, when it is the one the reads will use."""
        if self.decoder == "duckdb" and (self.config.decoder == "duckdb" or duckdecode.unavailable() is None):
            duckdecode.warm(self.config)

    def read(self, part: Partition) -> Iterator[Any]:
        if self.decoder == "duckdb":
            if self.config.decoder == "duckdb" or duckdecode.unavailable() is None:
                return SentBatches(lambda sent: self._read_duckdb(part, sent))
            # auto, and this worker cannot load the extension: ADBC's batches are the same (test_decoder.py)
        return SentBatches(lambda sent: self._read_adbc(part, sent))

    def _read_adbc(self, part: Partition, sent: SentBatches) -> Iterator[Any]:
        """The partition decoded by ADBC's COPY reader, in the job's snapshot; ``sent.sent`` as on DuckDB's."""
        sql = self.select_sql(part)
        relid = self.relid if self._scan_counts(part) else None
        conn = adbc_connect(self.config, part.key, self.options.run_id)
        cur = conn.cursor()
        try:
            try:
                # ADBC opened a transaction (autocommit is off): pin it to the job's snapshot
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                if self.snapshot_id:
                    cur.execute(f"SET TRANSACTION SNAPSHOT {literal(self.snapshot_id)}")
                before = _scan_count(cur, relid, first=True) if relid is not None else 0
                cur.execute(sql)
                reader = cur.fetch_record_batch()
            except Exception as exc:
                raise translate(exc, self.config, f"reading {part.key}", part.key) from None
            yield from rebatch(self._convert(reader, part.key), self.options.batch_size)
            if relid is not None:
                try:
                    sent.sent = _scan_count(cur, relid) - before
                except Exception as exc:
                    raise translate(exc, self.config, f"reading {part.key}", part.key) from None
        finally:
            with contextlib.suppress(Exception):  # a killed connection cannot roll back; it is gone anyway
                cur.close()
                conn.rollback()
            conn.close()

    def _read_duckdb(self, part: Partition, sent: SentBatches) -> Iterator[Any]:
        """The partition decoded by DuckDB's postgres extension, in the job's snapshot, cast to ADBC's
        schema; ``sent.sent``: the rows the server's scan returned, where :meth:`_scan_counts`."""
        import pyarrow as pa

        numerics = [c for c in self.columns if c.typname == "numeric" and c.native and not c.unconstrained_numeric]
        relid = self.relid if self._scan_counts(part) else None
        try:
            with duckdecode.connection(self.config, self.snapshot_id) as con:
                before = duckdecode.scan_count(con, relid, first=True) if relid is not None else 0
                reader = duckdecode.batches(con, self.nan_refusing_sql(part, numerics), self.options.batch_size)
                for batch in reader:
                    arrays = []
                    for col, arr, field in zip(self.columns, batch.columns, self.schema):
                        if col.typname in _OUT_OF_RANGE and not col.elem and col.native:
                            arr = arr.cast(field.type)
                            if not duckdecode.in_range(col.typname, arr, _OUT_OF_RANGE[col.typname][0]):
                                arr = self._special(col, duckdecode.as_adbc_infinity(col.typname, arr), part.key)
                        if arr.type != field.type:
                            arr = arr.cast(field.type)  # same values (tz name, int width): safe casts, refused if not
                        arrays.append(arr)
                    if batch.num_rows:
                        yield pa.RecordBatch.from_arrays(arrays, schema=self.schema)
                if relid is not None:
                    sent.sent = duckdecode.scan_count(con, relid) - before
        except TransferError:
            raise
        except Exception as exc:
            hit = _NAN_SEEN.search(str(exc))
            if hit and int(hit.group(1)) < len(numerics):
                col = numerics[int(hit.group(1))]
                raise _unfit_decimal(col, numeric_arrow_type(col), "NaN", part.key) from None
            raise translate(exc, self.config, f"reading {part.key}", part.key) from None

    def _counted_kinds(self) -> tuple[str, ...]:
        """The partitions whose reads report their server's scan count (SourceInfo.reads_count): a table's
        whole heap (a sequential scan), and a page range where the server has TID range scans (14+); on a
        server that counts scans, when the job verifies counts."""
        if self.options.verify == "none" or not self.scan_stats or self.relkind not in ("r", "m"):
            return ()
        return (WholeSource.kind, PageRange.kind) if self.server_version >= 140000 else (WholeSource.kind,)

    def _scan_counts(self, part: Partition) -> bool:
        """Whether the rows the server's scan returns for ``part`` are the rows its query sends, so
        that the scan's count (``pg_stat_get_xact_tuples_returned``) is the partition's source count:
        a table's whole heap (a sequential scan) or a page range (a TID range scan, PostgreSQL 14+),
        no incremental window (a filter above the scan: it returns rows the query drops), on a server
        that counts scans (describe asks). Only when the job verifies counts."""
        return self.window is None and part.kind in self._counted_kinds()

    def nan_refusing_sql(self, part: Partition, numerics: list[PgColumn]) -> str:
        """The partition's query for DuckDB's decoder, which reads a numeric NaN as 0: the server refuses
        the read at a NaN in ``numerics`` instead, naming the column by its index there (the error
        ``_NAN_SEEN`` finds). The check is a filter that never drops a row (0 <> 1), not a column:
        a computed column makes PostgreSQL project every row (+1.1-2.2 s of the server's CPU on
        lineitem, SF1, against 0-0.5 s for the filter). Written as ``<> 1``, which the planner
        estimates to keep 99.5% of the rows (an ``IS NULL`` of the same CASE: 0.5%, so a whole
        table's read was planned as a Gather over a Parallel Seq Scan, where the plain query has a
        Seq Scan). It sees only the rows the job reads, whatever order the planner gives the
        conditions: outside the incremental window the CASE stops before any comparison (a
        partition's bounds need no such guard: every row is some partition's); a query's own filters
        are fenced off (OFFSET 0: a projection again, as the flags cost). Only the branch that met a
        NaN casts text to int (its text holds the column's value, so the planner cannot fold it
        ahead): a CASE of text cast for every row cost the server 0.09 CPU-s more of the check's
        ~0.6 s on lineitem, SF1 (4 numeric columns, 4 alternating runs of its count)."""
        if not numerics:
            return self.select_sql(part)
        whens = " ".join(f"WHEN {ident(c.name)} = 'NaN' THEN ('{_NAN_MARK}{i}' || {ident(c.name)})::int"
                         for i, c in enumerate(numerics))
        if not self.config.table:
            return f"SELECT * FROM ({self.select_sql(part)} OFFSET 0) AS _conveyor_rows WHERE (CASE {whens} ELSE 0 END) <> 1"
        window = self._window_sql()
        guard = f"WHEN ({window}) IS NOT TRUE THEN 0 " if window else ""
        check = f"(CASE {guard}{whens} ELSE 0 END) <> 1"
        where = self.where(part).removeprefix(" WHERE ")
        return f"SELECT {self._select_list()} FROM {self._from()} WHERE " + (f"({where}) AND {check}" if where else check)

    def _convert(self, reader: Any, key: str) -> Iterator[Any]:
        """numeric text -> decimal, extension metadata stripped; column by column, never per row."""
        import pyarrow as pa
        import pyarrow.compute as pc

        targets = [numeric_arrow_type(c) for c in self.columns]
        schema = None
        try:
            for batch in reader:
                arrays = []
                for col, arr, target in zip(self.columns, batch.columns, targets):
                    if col.typname in _OUT_OF_RANGE and not col.elem:
                        arr = self._special(col, arr, key)
                    if target is not None:
                        storage = arr.storage if isinstance(arr.type, pa.BaseExtensionType) else arr
                        try:
                            arr = pc.cast(storage, target)
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                            raise _unfit_decimal(col, target, exc, key) from None
                    arrays.append(arr)
                if schema is None:
                    schema = pa.schema([pa.field(c.name, a.type, metadata=_text_of(c)) for c, a in zip(self.columns, arrays)])
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        except TransferError:
            raise
        except Exception as exc:
            raise translate(exc, self.config, f"reading {key}", key) from None

    def _special(self, col: PgColumn, arr: Any, key: str) -> Any:
        """Dates and timestamps Arrow cannot hold: refused by name, or NULL / clamped as configured."""
        import pyarrow as pa
        import pyarrow.compute as pc

        low, inf, neg_inf = _OUT_OF_RANGE[col.typname]
        ints = arr.view(pa.int32() if col.typname == "date" else pa.int64())
        smallest = pc.min(ints).as_py()
        if smallest is None or smallest >= low:
            return arr  # the usual case: one pass over the column, nothing to do
        if self.keep_infinity:
            top = INFINITY_DAYS if col.typname == "date" else INFINITY_TICKS
            ints = pc.if_else(pc.equal(ints, inf), top, pc.if_else(pc.equal(ints, neg_inf), -top, ints)).cast(ints.type)
            bad = pc.and_(pc.less(ints, low), pc.not_equal(ints, -top))
            if not pc.any(bad).as_py():
                return ints.view(arr.type)
        else:
            bad = pc.less(ints, low)
        if self.config.special_values == "error":
            first = ints.filter(bad)[0].as_py()
            what = {inf: "infinity", neg_inf: "-infinity"}.get(first, "a timestamp after 294247-01-10")
            raise TransferError(
                f"postgres column {col.name} ({col.type_sql}) holds {what}, which Arrow (and Parquet, DuckDB) cannot hold",
                partition=key, hint="set source.special_values=null or clamp, filter or cast it in source.query, "
                                    "or (PostgreSQL to PostgreSQL) use sink.copy_path=passthrough, which keeps it")
        if self.config.special_values == "null":
            return pc.if_else(bad, pa.scalar(None, arr.type), arr)
        high, lowest = _CLAMP["date" if col.typname == "date" else "timestamp"]
        clamped = pc.if_else(pc.equal(ints, neg_inf), lowest, high).cast(ints.type)
        return pc.if_else(bad, clamped, ints).view(arr.type)


def _unfit_decimal(col: PgColumn, target: Any, why: Any, key: str) -> TransferError:
    """A numeric value with no Arrow decimal form (NaN, Infinity, too many digits), refused by name:
    ADBC's path finds it casting the text, DuckDB's path when the server fails at a NaN."""
    return TransferError(f"postgres column {col.name} ({col.type_sql}): a value does not fit {target}: {why}", partition=key,
                         hint="NaN and Infinity have no Arrow decimal form; cast the column to text or float8 in source.query")


#: the text the server fails to read as an integer at a numeric NaN (nan_refusing_sql), with the column's index
_NAN_MARK = "conveyor-nan-"
_NAN_SEEN = re.compile(re.escape(_NAN_MARK) + r"(\d+)")

# ADBC reads PostgreSQL's dates and timestamps by adding the 1970-2000 offset, which wraps around
# for infinity, -infinity and timestamps after 294247-01-10: every such value lands below PostgreSQL's
# earliest (4714-11-24 BC), where no real value can be. Below that bound: (infinity, -infinity).
_OUT_OF_RANGE = {"date": (-2440588, -2147472692, -2147472691),
                 "timestamp": (-210866803200000000, -9222425352054775809, -9222425352054775808),
                 "timestamptz": (-210866803200000000, -9222425352054775809, -9222425352054775808)}
_CLAMP = {"date": (2145042905, -2440588),  # 5874897-12-31, 4714-11-24 BC
          "timestamp": (2**63 - 2, -210866803200000000)}  # 294247-01-10 04:00:54.775806 (DuckDB's latest), 4714-11-24 BC


def _text_of(col: PgColumn) -> dict[bytes, bytes] | None:
    """Field metadata for a column read as PostgreSQL's text form of its type (kept by Parquet): the
    cast policy then knows the text is, say, an inet, and loads it into an inet column as it is."""
    if col.unconstrained_numeric or not col.native:
        return {TEXT_OF: col.typname.encode()}
    return None


def _keys(con: Any, oid: int) -> tuple[tuple[str, ...], tuple[ForeignKey, ...]]:
    """A table's primary key columns and its foreign keys (columns in key order)."""
    rows = con.execute(
        "SELECT c.contype, (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(c.conkey) WITH ORDINALITY k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum), rn.nspname, r.relname, "
        "(SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(c.confkey) WITH ORDINALITY k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum), c.confupdtype, c.confdeltype "
        "FROM pg_constraint c LEFT JOIN pg_class r ON r.oid = c.confrelid LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace "
        "WHERE c.conrelid = %s AND c.contype IN ('p', 'f') ORDER BY c.conname", [oid]).fetchall()
    primary = next((tuple(cols) for kind, cols, *_ in rows if kind == "p"), ())
    foreign = tuple(ForeignKey(tuple(cols), nsp, rel, tuple(ref), _fk_actions(upd, dele))
                    for kind, cols, nsp, rel, ref, upd, dele in rows if kind == "f")
    return primary, foreign


_FK_ACTIONS = {"r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}  # "a": NO ACTION, the default


def _fk_actions(on_update: str, on_delete: str) -> str:
    return " ".join(f"ON {what} {_FK_ACTIONS[code]}" for what, code in (("UPDATE", on_update), ("DELETE", on_delete))
                    if code in _FK_ACTIONS)
