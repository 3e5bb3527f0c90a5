"""PostgreSQL sink: binary COPY from Arrow batches (ADBC), or a binary COPY pass-through.

Each partition is written in one transaction, so a failed or retried partition leaves
nothing. Load modes:

- append: COPY into the target, one transaction per partition.
- truncate: COPY into an UNLOGGED staging table copied from the target's definition; at
  the end, in one transaction, TRUNCATE the target and INSERT the staged rows.
- create: COPY into a new staging table made from the source schema, renamed to the target
  at the end (fails, before any row moves, if the target exists).
- replace: like create (or, if the target exists, a staging table LIKE the target INCLUDING
  ALL), then DROP the old target and rename the staging table in one transaction.

A failed run drops the staging table: the target is as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.arrowutil import CountingBatches
from conveyor.casts import ColumnType, check_casts
from conveyor.connectors.postgres import commits
from conveyor.connectors.postgres.common import (
    PgConnConfig,
    adbc_connect,
    connect,
    ident,
    literal,
    row_hash_sql,
    sqlstate,
    translate,
)
from conveyor.connectors.postgres.types import PgColumn, column_ddl, read_columns
from conveyor.core import (
    INFINITY,
    INFINITY_DAYS,
    INFINITY_TICKS,
    JobOptions,
    Partition,
    PrepareRequest,
    SinkCapabilities,
    SinkPlan,
    WriteStats,
    cancel_requested,
)
from conveyor.errors import Cancelled, ConveyorError, SchemaError, TransferError
from conveyor.log import warn
from conveyor.mapping import TargetColumn, map_columns

COPY_PATHS = ("auto", "arrow", "passthrough")
WRITERS = ("auto", "pgpq", "adbc")
_CHUNK = 1 << 20


@dataclass
class PostgresSinkConfig(PgConnConfig):
    schema: str = "public"
    table: str = "???"
    #: create / replace make the new table UNLOGGED (faster, not crash-safe, not replicated)
    unlogged: bool = False
    #: auto: pass a PostgreSQL source's binary COPY stream through untouched when the column
    #: types are identical, else Arrow; arrow: always decode to Arrow; passthrough: require it
    copy_path: str = "auto"
    #: the Arrow path's binary COPY encoder. auto: pgpq where it encodes every column (it costs
    #: about a third of ADBC's client CPU), else ADBC; pgpq: require it; adbc: ADBC's adbc_ingest
    writer: str = "auto"
    #: run ANALYZE on the target after the load
    analyze: bool = False
    #: record each partition's commit in <schema>._conveyor_commits, in the partition's own
    #: transaction: retries and resumes never load a partition twice. false: no marker table (then
    #: a partition retried after a lost worker, or resumed after a killed driver, may load twice)
    commit_markers: bool = True
    #: columns whose values may change type by PostgreSQL's own cast (e.g. timestamp -> timestamptz
    #: in the session's TimeZone, text -> integer); ["*"]: every column. By default a type change that
    #: could alter a value is refused before anything moves (see conveyor/casts.py for the rules)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.copy_path not in COPY_PATHS:
            raise ValueError(f"copy_path: {self.copy_path!r} is not one of {', '.join(COPY_PATHS)}")
        if self.writer not in WRITERS:
            raise ValueError(f"writer: {self.writer!r} is not one of {', '.join(WRITERS)}")


@dataclass(frozen=True)
class _Target:
    exists: bool
    relkind: str = ""
    columns: tuple[PgColumn, ...] = ()
    mapping: tuple[TargetColumn, ...] = ()


class PostgresSink:
    config_class = PostgresSinkConfig
    capabilities = SinkCapabilities(transactional=True)

    def __init__(self, config: PostgresSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    @property
    def name(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    def _qualified(self, table: str | None = None) -> str:
        return ident(self.config.schema, table or self.config.table)

    def _stage(self) -> str:
        return commits.stage_name(self.options.run_id)

    def _target(self, con: Any) -> _Target:
        row = con.execute(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            [self.config.schema, self.config.table],
        ).fetchone()
        if row is None:
            return _Target(False)
        cols = read_columns(con, f"SELECT * FROM {self._qualified()} LIMIT 0")
        meta = con.execute(
            "SELECT a.attname, a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' "
            "FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            [self._qualified()],
        ).fetchall()
        mapping = tuple(TargetColumn(name, c.type_sql, not notnull, bool(hasdef)) for (name, notnull, hasdef), c in zip(meta, cols))
        return _Target(True, row[0], tuple(cols), mapping)

    def _check_access(self, con: Any, target: _Target, where: str) -> None:
        """What the load needs, checked before anything is created: the schema exists, the target
        is a table, and this role may do what the load mode does (not found out after staging)."""
        mode, schema, user = self.options.load_mode, self.config.schema, self.config.user
        on = self.config.where()
        if not con.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone():
            raise SchemaError(f"{where}: schema {schema} does not exist on {on}",
                              hint=f"create it (CREATE SCHEMA {ident(schema)}) or set sink.schema")
        if target.exists and target.relkind not in ("r", "p"):
            kind = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}.get(target.relkind, "not a table")
            raise SchemaError(f"{where} is {kind}: Conveyor loads tables", hint="point sink.table at the table behind it")
        may_create, = con.execute("SELECT has_schema_privilege(%s, 'CREATE')", [schema]).fetchone()
        needs = []
        if mode != "append" and not may_create:
            needs.append(f"CREATE on schema {schema} (for the staging table)")
        if self.config.commit_markers and not may_create and not con.execute(
                "SELECT to_regclass(%s) IS NOT NULL", [f"{ident(schema)}.{commits.MARKERS}"]).fetchone()[0]:
            needs.append(f"CREATE on schema {schema} (for {commits.MARKERS}, or set sink.commit_markers=false)")
        if target.exists:
            privileges = {"append": ("INSERT",), "truncate": ("INSERT", "TRUNCATE")}.get(mode, ())
            for privilege in privileges:
                if not con.execute("SELECT has_table_privilege(%s, %s)", [self._qualified(), privilege]).fetchone()[0]:
                    needs.append(f"{privilege} on {self.name}")
            if mode == "replace" and not con.execute(
                    "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = %s::regclass",
                    [self._qualified()]).fetchone()[0]:
                needs.append(f"ownership of {self.name} (replace drops it)")
        if needs:
            raise SchemaError(f"{where}: role {user} lacks {'; '.join(needs)}",
                              hint="grant it, or connect as a role that has it (sink.user)")
        if target.exists and mode in ("replace", "truncate"):
            self._check_dependents(con, mode, where)

    def _check_dependents(self, con: Any, mode: str, where: str) -> None:
        """What would make the final swap fail after the whole load: views on the table (replace
        drops it) and foreign keys of other tables pointing at it (replace and truncate)."""
        oid = self._qualified()
        refs = [r[0] for r in con.execute(
            "SELECT format('%%s (%%s)', conname, conrelid::regclass) FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = %s::regclass AND conrelid <> confrelid ORDER BY 1", [oid]).fetchall()]
        views = [] if mode != "replace" else [r[0] for r in con.execute(
            "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid "
            "JOIN pg_class v ON v.oid = w.ev_class WHERE d.refobjid = %s::regclass AND v.oid <> d.refobjid ORDER BY 1",
            [oid]).fetchall()]
        found = ([f"views {', '.join(views)} depend on it"] if views else []) + (
            [f"foreign keys point at it: {', '.join(refs)}"] if refs else [])
        if found:
            alternative = "load_mode=truncate keeps the table (and its views)" if mode == "replace" and not refs else \
                "load_mode=append, or drop the foreign keys first"
            raise SchemaError(f"{where}: load_mode={mode} cannot swap it in: {'; '.join(found)}", hint=alternative)

    # --- prepare ------------------------------------------------------------------------------

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        mode, schema = self.options.load_mode, request.schema
        where = f"postgres table {self.name}"
        con = connect(self.config, autocommit=True)
        stage_created = False
        try:
            commits.hold_guard(self.config, self.options.run_id)
            for stale in commits.drop_stale(con, self.config.schema, self.name):
                warn(f"removed a staging table left by a run that is gone: {stale.describe()}")
            target = self._target(con)
            self._check_access(con, target, where)
            if mode in ("append", "truncate") and not target.exists:
                raise SchemaError(f"{where} does not exist on {self.config.where()}",
                                  hint="create it first, or use load_mode=create or replace")
            if mode == "create" and target.exists:
                raise SchemaError(f"{where} already exists", hint="use load_mode=replace, truncate or append")
            if mode == "replace" and target.relkind == "p":
                raise SchemaError(f"{where} is partitioned: replace would lose its partitions", hint="use load_mode=truncate")
            source_cols = dict((c.name, c) for c in (request.info.detail("postgres_columns") or ()))
            write_table = self.config.table
            if mode in ("create", "replace") and not target.exists:
                ddl = ", ".join(f"{ident(f.name)} {column_ddl(f, source_cols.get(f.name))}" for f in schema)
                unlogged = "UNLOGGED " if self.config.unlogged else ""
                con.execute(f"CREATE {unlogged}TABLE {self._qualified(self._stage())} ({ddl})")
                commits.label_stage(con, self.config.schema, self.options.run_id, self.name)
                pairs = [(n, n) for n in schema.names]
                write_table, stage_created = self._stage(), True
            else:
                pairs = map_columns(schema.names, target.mapping, self.options.map_method, where)
                if mode in ("truncate", "replace"):
                    like = "INCLUDING DEFAULTS" if mode == "truncate" else "INCLUDING ALL"
                    unlogged = "UNLOGGED " if mode == "truncate" or self.config.unlogged else ""
                    using = self._access_method(con) if mode == "replace" else ""
                    con.execute(f"CREATE {unlogged}TABLE {self._qualified(self._stage())} (LIKE {self._qualified()} {like}){using}")
                    commits.label_stage(con, self.config.schema, self.options.run_id, self.name)
                    write_table, stage_created = self._stage(), True
            if self.config.commit_markers:
                commits.ensure_markers(con, self.config.schema)
            plan = self._plan(request, pairs, write_table, where, con)
            if mode == "append" and self.options.verify != "none":  # what was there, to compare what was added
                n, h = con.execute(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) FROM {self._qualified()}"
                                   if self.options.verify == "checksum" else f"SELECT count(*), 0 FROM {self._qualified()}").fetchone()
                plan = dataclasses.replace(plan, details=(*plan.details, ("rows_before", n), ("checksum_before", (n, h))))
        except BaseException as exc:
            if stage_created:
                with contextlib.suppress(Exception):
                    con.execute(f"DROP TABLE IF EXISTS {self._qualified(self._stage())}")
            commits.release_guard(self.options.run_id)
            if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
                raise
            raise translate(exc, self.config, f"preparing {where}") from None
        finally:
            con.close()
        return plan

    def _plan(self, request: PrepareRequest, pairs: list[tuple[str, str]], write_table: str, where: str, con: Any) -> SinkPlan:
        target_cols = {c.name: c for c in read_columns(con, f"SELECT * FROM {self._qualified(write_table)} LIMIT 0")}
        tcols = [target_cols[t] for _, t in pairs]
        forced = self._check_casts(request, pairs, tcols, where)
        native, reason = self._negotiate(request, pairs, tcols)
        casts: tuple[Any, ...] = ()
        writer, pgpq_types = None, None
        if native is None:
            casts = self._cast_plan(request.schema, pairs, write_table, where, [c.type_sql for c in tcols], forced)
            writer, why, pgpq_types = self._choose_writer(request.schema, pairs, casts, tcols)
            reason = f"{reason}; {writer} encoder" + (f" ({why})" if why else "")
            if forced:
                reason += f"; cast by PostgreSQL (sink.allow_cast): {', '.join(forced)}"
        return SinkPlan(
            target=f"{self.config.where()} {self.name}",
            write_target=write_table,
            load_mode=self.options.load_mode,
            columns=tuple(t for _, t in pairs),
            source_columns=tuple(s for s, _ in pairs),
            schema=request.schema,
            native=native,
            path_reason=reason,
            details=(("casts", casts), ("target_types", tuple(c.type_sql for c in tcols)),
                     ("writer", writer), ("pgpq_types", pgpq_types), ("guard", self.options.run_id),
                     ("markers", self.config.commit_markers), ("load_id", self.options.load)),
            keeps=(INFINITY,) if writer == "pgpq" else (),
        )

    def _check_casts(self, request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn], where: str) -> list[str]:
        """Refuse, before anything moves, a column whose values the target type would change
        (conveyor/casts.py); the target columns ``sink.allow_cast`` lets PostgreSQL cast anyway."""
        src_cols = {c.name: c for c in (request.info.detail("postgres_columns") or ())}
        sources = []
        for s, _ in pairs:
            f = request.schema.field(s)
            col = src_cols.get(s)
            if col is not None:
                sources.append(_pg_column_type(col, f.type, as_text=col.unconstrained_numeric or not col.native))
            else:
                sources.append(ColumnType.of_field(f))
        targets = [_pg_column_type(c, None) for c in tcols]
        return check_casts(pairs, sources, targets, where, self.config.allow_cast)

    def _choose_writer(self, schema: Any, pairs: list[tuple[str, str]], casts: tuple[Any, ...],
                       tcols: list[PgColumn]) -> tuple[str, str, tuple[Any, ...] | None]:
        """pgpq where it can encode every column for its target type, else ADBC; why not pgpq;
        and, for pgpq, the Arrow type each column is encoded as."""
        if self.config.writer == "adbc":
            return "adbc", "writer=adbc", None
        why = ""
        try:
            import pgpq  # noqa: F401
        except ImportError:
            why = "pgpq is not installed (pip install 'conveyor[postgres]')"
        types: list[Any] = []
        if not why:
            for (s, _), cast, col in zip(pairs, casts, tcols):
                src = _plain(schema.field(s).type)
                if cast is None and _pgpq_encodes(src, _TEXT_OID):
                    types.append(src)  # into a text column of a temp table, cast by PostgreSQL
                    continue
                types.append(_pgpq_type(src, cast, col.type_oid))
                if types[-1] is None:
                    why = f"column {s}: pgpq does not encode {_plain(cast or schema.field(s).type)} as {col.type_sql}"
                    break
        if not why:
            return "pgpq", "", tuple(types)
        if self.config.writer == "pgpq":
            raise SchemaError(f"postgres table {self.name}: writer=pgpq is not possible: {why}", hint="use sink.writer=auto or adbc")
        return "adbc", why, None

    def explain_path(self, request: PrepareRequest) -> str:
        """Which path a run would take (for ``conveyor plan``); reads the target, changes nothing."""
        con = connect(self.config, autocommit=True)
        try:
            target = self._target(con)
            self._check_access(con, target, f"postgres table {self.name}")
        finally:
            con.close()
        if target.exists and self.options.load_mode not in ("create",):
            pairs = map_columns(request.schema.names, target.mapping, self.options.map_method, f"postgres table {self.name}")
            by_name = {c.name: c for c in target.columns}
            tcols = [by_name[t] for _, t in pairs]
            self._check_casts(request, pairs, tcols, f"postgres table {self.name}")
        else:  # a new table gets the source's built-in types
            pairs = [(n, n) for n in request.schema.names]
            src = {c.name: c for c in (request.info.detail("postgres_columns") or ())}
            tcols = [src[n] if n in src and src[n].type_oid < 16384 else PgColumn(n, 0, -1, "", "", "", "") for n in request.schema.names]
        return self._negotiate(request, pairs, tcols)[1]

    def _negotiate(self, request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn]) -> tuple[str | None, str]:
        """Pass the binary COPY stream through when both ends are PostgreSQL with identical types."""
        from conveyor.connectors.postgres.source import PostgresSource

        mode = self.config.copy_path
        if mode == "arrow":
            return None, "arrow: copy_path=arrow"
        why = None
        src_cols = {c.name: c for c in (request.info.detail("postgres_columns") or ())}
        if not isinstance(request.source, PostgresSource) or not src_cols:
            why = "the source is not PostgreSQL"
        elif shutil.which("psql") is None:
            why = "psql (PostgreSQL's client) is not installed"
        else:
            for (s, _), t in zip(pairs, tcols):
                sc = src_cols[s]
                same = sc.type_oid == t.type_oid and sc.type_oid < 16384 and sc.typtype == "b"
                same = same or (sc.typtype == "e" and t.typtype == "e" and sc.typname == t.typname)
                if not same:
                    why = f"column {s}: {sc.type_sql} -> {t.type_sql} differ"
                    break
        if why is None:
            differ = [f"{s} {src_cols[s].type_sql} -> {t.type_sql}" for (s, _), t in zip(pairs, tcols)
                      if src_cols[s].type_sql != t.type_sql]
            if differ:  # same types, other typmods: PostgreSQL checks each value against the target's
                return "pgcopy-binary", ("pass-through: PostgreSQL binary COPY stream, same column types; typmods differ "
                                         f"(each value checked by PostgreSQL): {', '.join(differ)}")
            return "pgcopy-binary", "pass-through: PostgreSQL binary COPY stream, identical column types"
        if mode == "passthrough":
            raise SchemaError(f"copy_path=passthrough is not possible: {why}", hint="use sink.copy_path=auto or arrow")
        return None, f"arrow: {why}"

    def _cast_plan(self, schema: Any, pairs: list[tuple[str, str]], write_table: str, where: str, types: list[str],
                   forced: Sequence[str] = ()) -> tuple[Any, ...]:
        """Per column, the Arrow type to cast to, or None where PostgreSQL must cast (via a temp
        table): where Arrow cannot, and for the columns of ``sink.allow_cast`` (PostgreSQL's rules)."""
        conn = adbc_connect(self.config, scope=self.options.run_id)
        cur = conn.cursor()
        try:
            cols = ", ".join(ident(t) for _, t in pairs)
            cur.execute(f"SELECT {cols} FROM {self._qualified(write_table)} LIMIT 0")
            target_schema = cur.fetch_arrow_table().schema
            casts = tuple(None if t in forced else _arrow_cast_target(schema.field(s).type, target_schema.field(i))
                          for i, (s, t) in enumerate(pairs))
            if any(c is None for c in casts):
                self._probe(cur, schema, pairs, casts, types, write_table, where)
            return casts
        except ConveyorError:
            raise
        except Exception as exc:
            raise translate(exc, self.config, f"checking types of {where}") from None
        finally:
            cur.close()
            conn.rollback()
            conn.close()

    def _probe(self, cur: Any, schema: Any, pairs: list[tuple[str, str]], casts: tuple[Any, ...], types: list[str],
               write_table: str, where: str) -> None:
        """PostgreSQL must cast some columns: check it can, on an empty temp table, then roll back."""
        import adbc_driver_manager
        import pyarrow as pa

        empty = pa.Table.from_batches([], schema=_ingest_schema(schema, pairs, casts))

        def fails(sql: str) -> str | None:
            cur.adbc_ingest("_conveyor_probe", empty, mode="create", temporary=True)
            try:
                cur.execute(sql)
            except adbc_driver_manager.Error as exc:
                return str(exc).splitlines()[0].split("ERROR:", 1)[-1].strip()
            finally:
                cur.connection.rollback()  # the temp table goes with it
            return None

        reason = fails(self._insert_from_temp([t for _, t in pairs], types, write_table, "_conveyor_probe"))
        if reason is None:
            return
        which = ""
        for (s, t), cast, ty in zip(pairs, casts, types):  # name the column PostgreSQL cannot cast
            if cast is None and fails(f"SELECT {ident(t)}::{ty} FROM pg_temp._conveyor_probe") is not None:
                which = f"column {s} ({_plain(schema.field(s).type)} -> {ty}): "
                break
        raise SchemaError(f"{where}: {which}PostgreSQL cannot cast it: {reason}",
                          hint="cast the column in source.query, or change the target column's type")

    def _insert_from_temp(self, columns: Sequence[str], types: Sequence[str], write_table: str, temp: str) -> str:
        """Move a partition from its temp table into the target, PostgreSQL casting where Arrow could not."""
        cols = ", ".join(ident(t) for t in columns)
        exprs = ", ".join(f"{ident(t)}::{ty}" for t, ty in zip(columns, types))  # a no-op where types agree
        return f"INSERT INTO {self._qualified(write_table)} ({cols}) SELECT {exprs} FROM pg_temp.{ident(temp)}"

    # --- write -------------------------------------------------------------------------------

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        import pyarrow as pa

        if plan.detail("writer") == "pgpq":
            return self._write_pgpq(plan, part, batches)
        start = time.perf_counter()
        pairs = list(zip(plan.source_columns, plan.columns))
        casts = plan.detail("casts")
        out_schema = _ingest_schema(plan.schema, pairs, casts)
        # errors raised while reading or casting are kept: the driver would only wrap them
        counted = CountingBatches(_cast_batches(iter(batches), pairs, casts, out_schema, part.key))
        reader = pa.RecordBatchReader.from_batches(out_schema, counted)
        conn = adbc_connect(self.config, part.key, self.options.run_id)
        cur = conn.cursor()

        def fetch(sql: str) -> Any:
            cur.execute(sql)
            return cur.fetchone()

        try:
            before = self._committed_before(plan, part, fetch)
            if before is not None:
                conn.rollback()
                return WriteStats(part.key, before, 0, time.perf_counter() - start, already_committed=True)
            if all(c is not None for c in casts):
                cur.adbc_ingest(plan.write_target, reader, mode="append", db_schema_name=self.config.schema)
            else:
                temp = f"_conveyor_in_{part.index}"
                cur.adbc_ingest(temp, reader, mode="create", temporary=True)
                cur.execute(self._insert_from_temp(plan.columns, plan.detail("target_types"), plan.write_target, temp))
            self._seal(plan, part, counted.rows, cur.execute, fetch)
            conn.commit()
        except BaseException as exc:
            if _marker_conflict(exc):
                return self._raced(conn, plan, part, start)
            # the source or a cast may have failed inside the driver, which only wrapped the error
            raise self._failed(conn, exc, part, counted.error) from None
        finally:
            cur.close()
            conn.close()
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def _write_pgpq(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        """Encode batches to binary COPY with pgpq (native code) and stream them through psycopg."""
        import pyarrow as pa
        from pgpq import ArrowToPostgresBinaryEncoder

        start = time.perf_counter()
        pairs = list(zip(plan.source_columns, plan.columns))
        types = plan.detail("pgpq_types")
        out_schema = pa.schema([pa.field(t, ty) for (_, t), ty in zip(pairs, types)])
        counted = CountingBatches(_cast_batches(iter(batches), pairs, types, out_schema, part.key))
        wire = pa.schema([pa.field(t, _wire_type(ty)) for (_, t), ty in zip(pairs, types)])
        encoder = ArrowToPostgresBinaryEncoder(wire)
        con = connect(self.config)
        try:
            before = self._committed_before(plan, part, lambda sql: con.execute(sql).fetchone())
            if before is not None:
                con.rollback()
                return WriteStats(part.key, before, 0, time.perf_counter() - start, already_committed=True)
            cols = ", ".join(ident(c) for c in plan.columns)
            casts = plan.detail("casts")
            temp = f"_conveyor_in_{part.index}" if any(c is None for c in casts) else None
            into = self._qualified(plan.write_target) if temp is None else f"pg_temp.{ident(temp)}"
            if temp is not None:  # PostgreSQL casts these text columns: through a temp table
                temp_types = ["text" if c is None else ty for c, ty in zip(casts, plan.detail("target_types"))]
                con.execute(f"CREATE TEMP TABLE {into} ({', '.join(f'{ident(c)} {ty}' for c, ty in zip(plan.columns, temp_types))}) "
                            "ON COMMIT DROP")
            with con.cursor() as cur:
                with cur.copy(f"COPY {into} ({cols}) FROM STDIN (FORMAT binary)") as cp:
                    cp.write(encoder.write_header())
                    for batch in counted:
                        cp.write(encoder.write_batch(_to_pg_epoch(batch, wire)))
                    cp.write(encoder.finish())
            if temp is not None:
                con.execute(self._insert_from_temp(plan.columns, plan.detail("target_types"), plan.write_target, temp))
            self._seal(plan, part, counted.rows, con.execute, lambda sql: con.execute(sql).fetchone())
            con.commit()
        except BaseException as exc:
            if _marker_conflict(exc):
                return self._raced(con, plan, part, start)
            raise self._failed(con, exc, part, counted.error) from None
        finally:
            con.close()
        return WriteStats(part.key, counted.rows, counted.bytes, time.perf_counter() - start)

    def write_native(self, plan: SinkPlan, source: Any, part: Partition) -> WriteStats:
        """Relay the source's binary COPY stream: psql reads it, this process forwards 1 MiB chunks."""
        start = time.perf_counter()
        con = connect(self.config)
        try:
            before = self._committed_before(plan, part, lambda sql: con.execute(sql).fetchone())
        except BaseException as exc:
            con.close()
            raise self._failed(con, exc, part) from None
        if before is not None:
            con.rollback()
            con.close()
            return WriteStats(part.key, before, 0, time.perf_counter() - start, already_committed=True)
        src_cols = ", ".join(ident(c) for c in plan.source_columns)
        copy_out = f"COPY ({source.select_sql(part, src_cols)}) TO STDOUT (FORMAT binary)"
        args = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        for stmt in [*source.begin_snapshot_sql(), copy_out, "COMMIT"]:
            args += ["-c", stmt]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=source.config.subprocess_env())
        nbytes, tail = 0, b""
        try:
            cols = ", ".join(ident(c) for c in plan.columns)
            with con.cursor() as cur:
                with cur.copy(f"COPY {self._qualified(plan.write_target)} ({cols}) FROM STDIN (FORMAT binary)") as cp:
                    assert proc.stdout is not None
                    while chunk := proc.stdout.read(_CHUNK):
                        if cancel_requested():
                            raise Cancelled(f"partition {part.key}: cancelled")
                        cp.write(chunk)
                        nbytes += len(chunk)
                        tail = (tail + chunk)[-2:]
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    if proc.wait() != 0 or tail != b"\xff\xff":
                        msg = source.config.scrub(err.strip().splitlines()[-1] if err.strip() else f"psql exited {proc.returncode}")
                        raise TransferError(f"postgres source {source.config.where()}: reading {part.key}: {msg}",
                                            partition=part.key, retriable="connection" in msg or "terminat" in msg)
                rows = cur.rowcount
            self._seal(plan, part, rows, con.execute, lambda sql: con.execute(sql).fetchone())
            con.commit()
        except BaseException as exc:
            if proc.poll() is None:
                proc.kill()
            if _marker_conflict(exc):
                return self._raced(con, plan, part, start)
            raise self._failed(con, exc, part) from None
        finally:
            con.close()
            proc.wait()
        return WriteStats(part.key, rows, nbytes, time.perf_counter() - start)

    def leftovers(self, remove: bool) -> list[str]:
        """Conveyor's staging tables in the target's schema; with ``remove``, drop those whose run is gone."""
        con = connect(self.config, autocommit=True)
        try:
            found = commits.stages(con, self.config.schema)
            if remove:
                dropped = {s.name for s in commits.drop_stale(con, self.config.schema)}
                return [("dropped " if s.name in dropped else "kept (in use) ") + s.describe() for s in found]
            return [s.describe() for s in found]
        except Exception as exc:
            raise translate(exc, self.config, "listing staging tables") from None
        finally:
            con.close()

    # --- exactly once -------------------------------------------------------------------------------

    def _committed_before(self, plan: SinkPlan, part: Partition, fetch: Any) -> int | None:
        """Rows of this partition committed under the plan's load id by an earlier attempt or run."""
        if not plan.detail("markers"):
            return None
        row = fetch(commits.marker_rows_sql(self.config.schema, plan.detail("load_id"), self.name, part.key))
        return None if row is None else int(row[0])

    def _seal(self, plan: SinkPlan, part: Partition, rows: int, execute: Any, fetch: Any) -> None:
        """Just before commit: the driver must still hold the run, and the marker joins the transaction."""
        guard = plan.detail("guard")
        if guard and not fetch(commits.driver_alive_sql(guard))[0]:
            # retriable: a target that restarted drops the driver's lock for a moment (it takes it again);
            # a driver that is really gone stays gone, and every retry rolls back the same way
            raise TransferError(f"partition {part.key}: the run's driver is gone: rolled back instead of committing",
                                partition=part.key, retriable=True,
                                hint="resume the run: committed partitions are not loaded again")
        if plan.detail("markers"):
            execute(commits.marker_insert_sql(self.config.schema, plan.detail("load_id"), self.name, part.key, rows))

    def _raced(self, conn: Any, plan: SinkPlan, part: Partition, start: float) -> WriteStats:
        """Another attempt committed this partition first: this one rolls back and reports that one's rows."""
        with contextlib.suppress(Exception):
            conn.rollback()
        return WriteStats(part.key, (self.committed(plan) or {}).get(part.key, 0), 0, time.perf_counter() - start,
                          already_committed=True)

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} committed into this target under the plan's load id (None: no markers kept)."""
        if not plan.detail("markers"):
            return None
        con = connect(self.config, autocommit=True)
        try:
            return commits.committed(con, self.config.schema, plan.detail("load_id"), self.name)
        except Exception as exc:
            raise translate(exc, self.config, "reading commit markers") from None
        finally:
            con.close()

    def _failed(self, conn: Any, exc: BaseException, part: Partition, cause: BaseException | None = None) -> BaseException:
        """Roll the partition's transaction back; the error to raise (the original where one is known)."""
        with contextlib.suppress(Exception):
            conn.rollback()
        if cause is not None:
            return cause
        if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
            return exc
        err = translate(exc, self.config, f"writing {part.key} into {self.name}", part.key)
        # the staging table is ours: the user knows the target ('relation "_conveyor_stage_..."')
        err.message = err.message.replace(f'relation "{self._stage()}"', f'relation "{self.config.table}" (staged)')
        return err

    # --- verification ---------------------------------------------------------------------------

    def _one(self, sql: str) -> tuple[Any, ...]:
        con = connect(self.config, autocommit=True)
        try:
            return con.execute(sql).fetchone()
        except Exception as exc:
            raise translate(exc, self.config, "verifying") from None
        finally:
            con.close()

    def count_rows(self, plan: SinkPlan) -> int:
        return int(self._one(f"SELECT count(*) FROM {self._qualified(plan.write_target)}")[0])

    def checksum(self, plan: SinkPlan) -> str:
        n, h = self._one(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) FROM {self._qualified(plan.write_target)}")
        n0, h0 = plan.detail("checksum_before") or (0, 0)
        return f"{n - n0}:{h - h0}"

    # --- finalize / abort -----------------------------------------------------------------------

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        con = connect(self.config)
        try:
            if plan.write_target != self.config.table:
                stage = self._qualified(plan.write_target)
                if plan.load_mode == "truncate":
                    cols = ", ".join(ident(c) for c in plan.columns)
                    con.execute(f"TRUNCATE {self._qualified()}")
                    con.execute(f"INSERT INTO {self._qualified()} ({cols}) SELECT {cols} FROM {stage}")
                    con.execute(f"DROP TABLE {stage}")
                else:
                    if plan.load_mode == "replace" and con.execute("SELECT to_regclass(%s) IS NOT NULL", [self._qualified()]).fetchone()[0]:
                        self._keep_identity(con, plan.write_target)
                        con.execute(f"DROP TABLE {self._qualified()}")
                    con.execute(f"ALTER TABLE {stage} RENAME TO {ident(self.config.table)}")
                    self._rename_stage_indexes(con, plan.write_target)
                if plan.detail("markers"):  # a staged load is visible whole: its markers served their purpose
                    commits.forget(con, self.config.schema, plan.detail("load_id"), self.name)
            con.commit()
            if self.config.analyze:
                con.execute(f"ANALYZE {self._qualified()}")
                con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            raise translate(exc, self.config, f"finalizing {self.name}") from None
        finally:
            con.close()
            commits.release_guard(self.options.run_id)

    def _access_method(self, con: Any) -> str:
        """' USING <am>' for a target that is not a heap table (a columnar one): replace keeps it."""
        row = con.execute("SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.oid = %s::regclass",
                          [self._qualified()]).fetchone()
        return f" USING {ident(row[0])}" if row and row[0] != "heap" else ""

    def _keep_identity(self, con: Any, stage: str) -> None:
        """Replace: the new table takes the old one's owner, privileges and comment (LIKE copies
        columns, defaults, constraints, indexes and column comments, not these)."""
        owner, comment = con.execute(
            "SELECT pg_get_userbyid(c.relowner), obj_description(c.oid, 'pg_class') FROM pg_class c WHERE c.oid = %s::regclass",
            [self._qualified()]).fetchone()
        staged = self._qualified(stage)
        grants = con.execute(  # grantee 0 is PUBLIC; names unquoted, quoted below
            "SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, a.is_grantable "
            "FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = %s::regclass AND a.grantee <> c.relowner",
            [self._qualified()]).fetchall()
        for privilege, grantee, grantable in grants:
            who = "PUBLIC" if grantee is None else ident(grantee)
            con.execute(f"GRANT {privilege} ON {staged} TO {who}" + (" WITH GRANT OPTION" if grantable else ""))
        if comment is not None:
            con.execute(f"COMMENT ON TABLE {staged} IS {literal(comment)}")
        if con.execute("SELECT pg_has_role(%s, 'MEMBER')", [owner]).fetchone()[0]:
            con.execute(f"ALTER TABLE {staged} OWNER TO {ident(owner)}")

    def _rename_stage_indexes(self, con: Any, stage: str) -> None:
        """Indexes made by LIKE ... INCLUDING ALL carry the staging table's name: give them the target's."""
        rows = con.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = %s::regclass AND c.relname LIKE %s",
            [self._qualified(), stage.replace("_", "\\_") + "%"],
        ).fetchall()
        for (name,) in rows:
            new = _index_name(self.config.table, name[len(stage):])
            con.execute(f"ALTER INDEX {ident(self.config.schema, name)} RENAME TO {ident(new)}")

    def abort(self, plan: SinkPlan) -> None:
        try:
            if plan.write_target == self.config.table:
                return
            con = connect(self.config, autocommit=True)
            try:
                con.execute(f"DROP TABLE IF EXISTS {self._qualified(plan.write_target)}")
                if plan.detail("markers"):
                    commits.forget(con, self.config.schema, plan.detail("load_id"), self.name)
            finally:
                con.close()
        finally:
            commits.release_guard(self.options.run_id)


def _index_name(table: str, suffix: str) -> str:
    """An index name for ``table`` + ``suffix`` within PostgreSQL's 63 bytes: the table part is
    shortened, as PostgreSQL itself does, so the suffix (``_pkey``) stays and the name never
    equals the table's own (a 63-byte table name once made ``(table + "_pkey")[:63]`` collide)."""
    room = 63 - len(suffix.encode())
    head = table.encode()[:room].decode(errors="ignore")
    return head + suffix


def _marker_conflict(exc: BaseException) -> bool:
    """Two attempts at one partition: the second's marker collides with the first's committed one."""
    return sqlstate(exc) == "23505" and commits.MARKERS in str(exc)


def _pg_column_type(col: PgColumn, arrow: Any, as_text: bool = False) -> ColumnType:
    db = f"enum:{col.typname}" if col.typtype == "e" else col.typname
    return ColumnType(arrow, db=db, sql=col.type_sql, typmod=col.typmod, as_text=as_text)


# --- Arrow casting, column by column -------------------------------------------------------------


def _storage(arr: Any) -> Any:
    import pyarrow as pa

    return arr.storage if isinstance(arr.type, pa.BaseExtensionType) else arr


def _arrow_cast_target(src: Any, target_field: Any) -> Any:
    """The Arrow type a source column is cast to for ADBC's COPY writer; None: PostgreSQL casts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tgt = target_field.type
    meta = {k.decode(): v.decode() for k, v in (target_field.metadata or {}).items()}
    if isinstance(tgt, pa.BaseExtensionType) and tgt.extension_name == "arrow.opaque":
        if meta.get("POSTGRESQL:type") != "numeric":
            return None  # inet, money, ...: PostgreSQL parses the text
        typmod = int(meta.get("POSTGRESQL:typmod", "-1"))
        if typmod >= 0:
            p, s = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
            tgt = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
        elif pa.types.is_decimal(src):
            return src
        else:
            return None
    check_src = src.storage_type if isinstance(src, pa.BaseExtensionType) else src
    check_tgt = tgt.storage_type if isinstance(tgt, pa.BaseExtensionType) else tgt
    if pa.types.is_integer(check_src) and pa.types.is_decimal(check_tgt) and check_tgt.precision - check_tgt.scale < 20:
        return None  # Arrow wants room for the widest integer even when every value fits: PostgreSQL checks each
    if isinstance(src, pa.BaseExtensionType) and src == tgt:
        return tgt
    if isinstance(tgt, pa.BaseExtensionType) and tgt.extension_name == "arrow.uuid" and not pa.types.is_fixed_size_binary(check_src):
        return None
    if _is_binary(check_src) != _is_binary(check_tgt):
        return None  # bytes are not parsed as numbers or text here: PostgreSQL decides (and refuses)
    try:
        pc.cast(pa.array([], check_src), check_tgt)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None
    return tgt


def _is_binary(typ: Any) -> bool:
    import pyarrow.types as t

    return bool(t.is_binary(typ) or t.is_large_binary(typ) or t.is_fixed_size_binary(typ)
                or (hasattr(t, "is_binary_view") and t.is_binary_view(typ)))


# pgpq picks its PostgreSQL encoding from the Arrow type; binary COPY input must then be exactly
# what the target column's type reads: these are the pairs that agree (checked in the type tests).
_TEXT_OID = 25
_PGPQ_TEXT = {_TEXT_OID, 1042, 1043, 114}  # text, char(n), varchar(n), json: the binary form is the text
_PGPQ_EXACT = {16: "bool", 21: "int16", 23: "int32", 20: "int64", 700: "float", 701: "double", 1082: "date32[day]",
               1083: "time64[us]"}


def _pgpq_encodes(typ: Any, oid: int) -> bool:
    import pyarrow.types as t

    if oid in _PGPQ_TEXT:
        return bool(t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ))
    if oid == 17:  # bytea
        return bool(t.is_binary(typ) or t.is_large_binary(typ))
    if oid == 2950:  # uuid: 16 raw bytes
        return bool(t.is_fixed_size_binary(typ) and typ.byte_width == 16)
    if oid == 1700:  # numeric
        return bool(t.is_decimal(typ) and typ.bit_width <= 128)
    if oid in (1114, 1184):  # timestamp, timestamptz: microseconds since 2000 (UTC for timestamptz)
        return bool(t.is_timestamp(typ) and typ.unit != "ns" and (typ.tz is None) == (oid == 1114))
    return str(typ) == _PGPQ_EXACT.get(oid)


def _pgpq_type(src: Any, cast: Any, oid: int) -> Any:
    """The Arrow type pgpq encodes a column as for a target of type ``oid`` (the source's own
    where it already fits, else the cast target), or None where pgpq cannot write that type."""
    src = _plain(src)
    if _pgpq_encodes(src, oid):
        return src
    if cast is None:
        return None
    cast = _plain(cast)
    return cast if _pgpq_encodes(cast, oid) else None


# Dates and timestamps go to pgpq as PostgreSQL's own integers (days / microseconds since
# 2000-01-01, the binary COPY form of date, timestamp and timestamptz), so that infinity and
# -infinity (core.INFINITY) reach PostgreSQL's: pgpq refuses them. Other values out of
# PostgreSQL's range wrap around here and PostgreSQL refuses them ("date out of range").
def _wire_type(typ: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_date32(typ):
        return pa.int32()
    if pa.types.is_timestamp(typ) and typ.unit == "us":
        return pa.int64()
    return typ


def _to_pg_epoch(batch: Any, wire: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = []
    for arr, out in zip(batch.columns, wire):
        if arr.type != out.type:
            ints = arr.view(out.type)
            days = out.type == pa.int32()
            offset, top = (10957, INFINITY_DAYS) if days else (946684800000000, INFINITY_TICKS)
            shifted = pc.subtract(ints, pa.scalar(offset, out.type))  # wraps, never raises
            bottom = pa.scalar(-top - 1, out.type)  # PostgreSQL's -infinity
            arr = pc.if_else(pc.equal(ints, top), ints, pc.if_else(pc.equal(ints, -top), bottom, shifted))
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=wire)


def _plain(typ: Any) -> Any:
    import pyarrow as pa

    return typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ


def _ingest_schema(schema: Any, pairs: Sequence[tuple[str, str]], casts: Sequence[Any]) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field(t, c if c is not None else schema.field(s).type) for (s, t), c in zip(pairs, casts)])


def _cast_batches(batches: Iterator[Any], pairs: Sequence[tuple[str, str]], casts: Sequence[Any], out_schema: Any, key: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        arrays = []
        for (s, t), target in zip(pairs, casts):
            arr = batch.column(s)
            if target is not None and arr.type != target:
                try:
                    if isinstance(target, pa.BaseExtensionType):
                        arr = pa.ExtensionArray.from_storage(target, pc.cast(_storage(arr), target.storage_type))
                    else:
                        arr = pc.cast(_storage(arr), target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TransferError(f"column {s} -> {t}: a value does not fit {target}: {exc}", partition=key,
                                        hint="cast it in the source, or widen the target column") from None
            arrays.append(arr)
        yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
