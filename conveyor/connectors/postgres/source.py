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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.postgres import changes, definition, duckdecode, passthrough, reading
from conveyor.connectors.postgres.common import PG_DIALECT, PgConnConfig, adbc_connect, connect, ident, literal, translate
from conveyor.connectors.postgres.feed import PgChangeFeed
from conveyor.connectors.postgres.migration import PgSchemaExport
from conveyor.connectors.postgres.planning import KIND_NAMES, PgPlanning, relation_info
from conveyor.connectors.postgres.types import PgColumn, numeric_arrow_type, read_arrow_type, read_columns
from conveyor.core import (
    INFINITY,
    DeferredSchema,
    ForeignKey,
    JobOptions,
    NativeStream,
    Partition,
    SourceInfo,
    SourceTable,
)
from conveyor.errors import ConfigError, SchemaError
from conveyor.kit.sql import pick_tables

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


class PostgresSource(PgPlanning, PgChangeFeed, PgSchemaExport):
    """Reads a PostgreSQL table or query as Arrow batches; serves every partition method."""

    config_class = PostgresSourceConfig
    dialect = PG_DIALECT

    def __init__(self, config: PostgresSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.columns: tuple[PgColumn, ...] = ()
        self.snapshot_id: str | None = None
        #: a snapshot exported elsewhere that the job reads in (a sync job's: its slot's position), instead of one of its own
        self.imported_snapshot: str | None = None
        #: what the exported snapshot saw (changes.mark): kept by the run's manifest, so a resume can tell
        #: whether the partitions it finished still hold those rows
        self.snapshot_mark: dict[str, Any] | None = None
        #: the sink keeps infinity (core.INFINITY): pass it on instead of refusing it
        self.keep_infinity = False
        #: beside another PostgreSQL in ``conveyor verify``: numerics and arrays read as their text (``comparing``)
        self.text_compared = False
        #: the job's ``columns``: only these are read (a column left out is never read, its values never checked)
        self.selected: tuple[str, ...] = ()
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

    def comparing(self, other: Any) -> PostgresSource:
        """This source as ``conveyor verify`` reads it beside ``other``: beside another PostgreSQL, its numerics and arrays
        are read as their text (NaN, several dimensions: values Arrow cannot hold), and JSON as jsonb prints it (a json
        copied into a jsonb column has its keys in jsonb's order), as the other end reads its own."""
        if not isinstance(other, PostgresSource):
            return self
        texts = copy.copy(self)
        texts.text_compared = True
        return texts

    def selecting(self, columns: tuple[str, ...]) -> PostgresSource:
        """This source reading only ``columns`` (the job's ``columns``), where the relation has every one of them."""
        chosen = copy.copy(self)
        chosen.selected = tuple(columns)
        return chosen

    def keeping(self, kinds: tuple[str, ...]) -> PostgresSource:
        """This source, passing on the special values a sink keeps (only under the default policy)."""
        kept = copy.copy(self)
        kept.keep_infinity = INFINITY in kinds and self.config.special_values == "error"
        return kept

    # --- describing --------------------------------------------------------------------------

    def describe(self) -> SourceInfo:
        con = connect(self.config, autocommit=True)
        try:
            self.server_version = con.info.server_version
            estimate, size, keys, made = None, None, ((), ()), None
            if self.config.table:
                kind, _, oid, reltuples = relation_info(con, self.config)
                self.relid, self.relkind = int(oid), kind
                keys = _keys(con, oid)
                made = definition.read(con, oid) if kind in ("r", "p") else None
                estimate = int(reltuples) if reltuples and reltuples > 0 else None
                # and whether the server counts each scan's rows for the read's own transaction (not every
                # server that speaks PostgreSQL's protocol has the function, or counts: track_counts)
                size, self.scan_stats = con.execute(
                    "SELECT coalesce((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree(%s::oid) WHERE isleaf), "
                    "pg_table_size(%s::oid))::bigint, to_regprocedure('pg_catalog.pg_stat_get_xact_tuples_returned(oid)') "
                    "IS NOT NULL AND current_setting('track_counts', true) = 'on'", [oid, oid]).fetchone()
                label = f"postgres {KIND_NAMES.get(kind, 'relation')} {self.relation}"
                children = con.execute("SELECT coalesce(array_length(array_agg(inhrelid), 1), 0) FROM pg_inherits WHERE inhparent = %s",
                                       [oid]).fetchone()[0] if kind == "r" else 0
                if children:
                    label += f" (its own rows: its {children} inheritance children are tables of their own)"
            else:
                label = "postgres query"
            try:
                self.columns = tuple(read_columns(con, f"SELECT * FROM {self.from_sql()} LIMIT 0"))
                if self.selected and set(self.selected) <= {c.name for c in self.columns}:
                    self.columns = tuple(c for c in self.columns if c.name in self.selected)
                if self.relid is not None:
                    self.columns = _collated(con, self.relid, self.columns)
                if self.text_compared:
                    self.columns = tuple(dataclasses.replace(c, as_text=True) if c.typname in ("numeric", "json", "jsonb") or c.elem
                                         else c for c in self.columns)
            except Exception as exc:
                raise translate(exc, self.config, "describing the source") from None
        finally:
            con.close()
        self._schema = DeferredSchema(self._arrow_schema, [c.name for c in self.columns])
        if made is not None and any(c.collation for c in self.columns):
            made = dataclasses.replace(made, collations=tuple((c.name, c.collation) for c in self.columns if c.collation))
        self.decoder, reader = self._pick_decoder()
        return SourceInfo(schema=self._schema, label=label, estimated_rows=estimate, estimated_bytes=size,
                          native=passthrough.offer(self.columns, self.config), reader=reader, primary_key=keys[0], foreign_keys=keys[1],
                          definition=made, reads_count=reading.counted_kinds(self), checksums=True)

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
        return "duckdb", (f"Arrow batches decoded by DuckDB's postgres extension (source.decoder={asked}); "
                          f"columns by route: {duckdecode.routes(self.columns)}")

    def _arrow_schema(self) -> Any:
        """The Arrow schema of the batches ``read`` yields (ADBC's, with numerics as decimals): from
        the columns' PostgreSQL types where every one has a known Arrow type (no ADBC connection,
        ~0.1 s of a job's start), else as ADBC's driver reads them."""
        import pyarrow as pa

        known = [read_arrow_type(col) for col in self.columns]
        if all(t is not None for t in known):
            return pa.schema([pa.field(col.name, t, metadata=reading.text_of(col)) for col, t in zip(self.columns, known)])
        return self._adbc_schema()

    def _adbc_schema(self) -> Any:
        """The Arrow schema of the batches ``read`` yields, as ADBC's driver reads the columns (numerics as decimals)."""
        import pyarrow as pa

        conn = adbc_connect(self.config, scope=self.options.load)
        try:
            cur = conn.cursor()
            try:
                cur.execute(f"SELECT {self.select_list()} FROM {self.from_sql()} LIMIT 0")
                raw = cur.fetch_arrow_table().schema
            except Exception as exc:
                raise translate(exc, self.config, "describing the source") from None
            finally:
                cur.close()
        finally:
            conn.close()
        return pa.schema([pa.field(col.name, numeric_arrow_type(col) or field.type, metadata=reading.text_of(col))
                          for col, field in zip(self.columns, raw)])

    def select_list(self) -> str:
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
            if self.imported_snapshot:
                con.execute(f"SET TRANSACTION SNAPSHOT {literal(self.imported_snapshot)}")
            # the mark first: its statement takes the snapshot, and reads the transactions then running right after
            seen = changes.mark(con, self._literal_table() if self.config.table else None)
            snap = self.imported_snapshot or con.execute("SELECT pg_export_snapshot()").fetchone()[0]
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

    def select_sql(self, part: Partition, columns: str | None = None) -> str:
        return f"SELECT {columns or self.select_list()} FROM {self.from_sql()}{self.where(part)}"

    def export_native(self, part: Partition, columns: tuple[str, ...]) -> contextlib.AbstractContextManager[NativeStream]:
        """The partition as PostgreSQL's binary COPY stream (the pass-through), in the job's snapshot."""
        return passthrough.export(self.config, self.select_sql(part, ", ".join(ident(c) for c in columns)),
                                  self.begin_snapshot_sql(), part.key)

    def read(self, part: Partition) -> Iterator[Any]:
        return reading.read(self, part)

    def warm_up(self) -> None:
        """DuckDB's decoder made ready (the extension loaded, the server attached: ~0.15 s here) while the
        job plans and prepares, when it is the one the reads will use."""
        if self.decoder == "duckdb" and (self.config.decoder == "duckdb" or duckdecode.unavailable() is None):
            duckdecode.warm(self.config)

def _collated(con: Any, oid: int, columns: tuple[PgColumn, ...]) -> tuple[PgColumn, ...]:
    """The columns, each with its collation where it is not its type's default (a table made from them takes it)."""
    import dataclasses

    found = dict(con.execute(
        "SELECT a.attname, quote_ident(n.nspname) || '.' || quote_ident(c.collname) FROM pg_attribute a JOIN pg_type t ON "
        "t.oid = a.atttypid JOIN pg_collation c ON c.oid = a.attcollation JOIN pg_namespace n ON n.oid = c.collnamespace "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attcollation <> 0 AND a.attcollation <> t.typcollation",
        [oid]).fetchall())
    return tuple(dataclasses.replace(col, collation=found[col.name]) if col.name in found else col for col in columns) if found else columns


def _keys(con: Any, oid: int) -> tuple[tuple[str, ...], tuple[ForeignKey, ...]]:
    """A table's primary key columns and its foreign keys (columns in key order)."""
    rows = con.execute(
        "SELECT c.contype, (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(c.conkey) WITH ORDINALITY k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum), rn.nspname, r.relname, "
        "(SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(c.confkey) WITH ORDINALITY k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum), c.confupdtype, c.confdeltype, c.condeferrable, "
        "c.condeferred "
        "FROM pg_constraint c LEFT JOIN pg_class r ON r.oid = c.confrelid LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace "
        "WHERE c.conrelid = %s AND c.contype IN ('p', 'f') ORDER BY c.conname", [oid]).fetchall()
    primary = next((tuple(cols) for kind, cols, *_ in rows if kind == "p"), ())
    foreign = tuple(ForeignKey(tuple(cols), nsp, rel, tuple(ref), _fk_actions(upd, dele, deferrable, deferred))
                    for kind, cols, nsp, rel, ref, upd, dele, deferrable, deferred in rows if kind == "f")
    return primary, foreign


_FK_ACTIONS = {"r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}  # "a": NO ACTION, the default


def _fk_actions(on_update: str, on_delete: str, deferrable: bool = False, deferred: bool = False) -> str:
    """The clauses after REFERENCES that carry the key's actions and when it is checked."""
    out = [f"ON {what} {_FK_ACTIONS[code]}" for what, code in (("UPDATE", on_update), ("DELETE", on_delete)) if code in _FK_ACTIONS]
    if deferrable:
        out.append("DEFERRABLE INITIALLY DEFERRED" if deferred else "DEFERRABLE")
    return " ".join(out)
