"""The PostgreSQL sink's Arrow path: which encoder writes each column, and the two writers.

In prepare, :func:`plan_arrow` decides per column the Arrow type it is cast to (or that
PostgreSQL casts it, through a temp table) and the encoder: pgpq (binary COPY encoded in native
code, about a third of ADBC's client CPU) where it encodes every column for its target type, else
ADBC's ``adbc_ingest``. In the task, :func:`write_pgpq` / :func:`write_adbc` write one partition
in one transaction, exactly once (``commits.Attempt``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres import commits
from conveyor.connectors.postgres.common import PgConnConfig, adbc_connect, connect, ident, literal, translate
from conveyor.connectors.postgres.types import PgColumn, adbc_field, text_length_limit
from conveyor.core import INFINITY_DAYS, INFINITY_TICKS, Partition, SinkPlan, WriteStats
from conveyor.errors import ConveyorError, SchemaError, TransferError
from conveyor.kit.arrowutil import CountingBatches
from conveyor.kit.casts import ColumnType


@dataclass(frozen=True)
class PgLoad:
    """The PostgreSQL sink's own plan (``SinkPlan.own``): exactly-once rules and, on the Arrow path,
    the encoder and each column's cast."""

    once: commits.Once
    #: "pgpq" | "adbc" on the Arrow path; None on the pass-through
    writer: str | None = None
    #: per column: the Arrow type it is cast to, or None where PostgreSQL casts it (via a temp table)
    casts: tuple[Any, ...] = ()
    #: the target columns' SQL types
    target_types: tuple[str, ...] = ()
    #: for pgpq: the Arrow type each column is encoded as
    pgpq_types: tuple[Any, ...] | None = None
    #: append with verify=checksum: (rows, hash sum) of the target before the load
    checksum_before: tuple[int, int] = (0, 0)
    #: load_mode=merge: keys, updated columns, what happens to rows the source lacks
    merge: Any = None
    #: append into a table partitioned by range: (column, ((lower, upper, table), ...)) of the partitions
    #: in the target's schema, so a source partition aligned with one is written straight into it
    leaves: tuple[str, tuple[tuple[Any, Any, str], ...]] | None = None
    #: incremental.cursor: the window this load reads; its upper end becomes the committed cursor
    window: Any = None
    #: create / replace making a new table: the source's primary key, added to the staged table
    #: after its rows (one index build instead of one insert per row) and before it is swapped in
    primary_key: tuple[str, ...] = ()
    #: sink.routing=leaves: the target's partition tree (routing.Tree), each row COPYed into its leaf
    route: Any = None
    #: the Arrow bytes a routed partition holds before it COPYs every leaf's share (routing_buffer_mb)
    route_buffer: int = 64 << 20
    #: (source column, target column, n, target type) of each varchar(n) / char(n) column whose
    #: values' lengths are checked before the COPY (types.text_length_limit; arrowutil.length_checked)
    lengths: tuple[tuple[str, str, int, str], ...] = ()


def plan_arrow(config: PgConnConfig, writer: str, run_id: str, schema: Any, pairs: list[tuple[str, str]], table: str,
               where: str, tcols: list[PgColumn], forced: Sequence[str]) -> tuple[tuple[Any, ...], str, str, tuple[Any, ...] | None]:
    """(casts, writer, why not pgpq, pgpq types) for loading ``schema`` into ``table`` (qualified)."""
    casts = _cast_plan(config, run_id, schema, pairs, table, where, tcols, forced)
    chosen, why, types = choose_writer(writer, schema, pairs, casts, tcols, where)
    return casts, chosen, why, types


def choose_writer(writer: str, schema: Any, pairs: list[tuple[str, str]], casts: tuple[Any, ...],
                   tcols: list[PgColumn], where: str) -> tuple[str, str, tuple[Any, ...] | None]:
    """pgpq where it can encode every column for its target type, else ADBC; why not pgpq;
    and, for pgpq, the Arrow type each column is encoded as."""
    if writer == "adbc":
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
    if writer == "pgpq":
        raise SchemaError(f"{where}: writer=pgpq is not possible: {why}", hint="use sink.writer=auto or adbc")
    return "adbc", why, None


def _cast_plan(config: PgConnConfig, run_id: str, schema: Any, pairs: list[tuple[str, str]], table: str, where: str,
               tcols: list[PgColumn], forced: Sequence[str] = ()) -> tuple[Any, ...]:
    """Per column, the Arrow type to cast to, or None where PostgreSQL must cast (via a temp
    table): where Arrow cannot, and for the columns of ``sink.allow_cast`` (PostgreSQL's rules).
    The target's Arrow fields are ADBC's driver's, known from the column types where they are
    built in (no connection, ~0.1 s of a job's start); a connection asks the driver for the rest,
    and checks on a temp table what PostgreSQL must cast."""
    types = [c.type_sql for c in tcols]
    known = [adbc_field(c) for c in tcols]
    casts = arrow_casts(schema, pairs, known, forced) if all(f is not None for f in known) else None
    if casts is not None and all(c is not None for c in casts):
        return casts
    conn = adbc_connect(config, scope=run_id)
    cur = conn.cursor()
    try:
        if casts is None:  # a column only the driver can type
            cols = ", ".join(ident(t) for _, t in pairs)
            cur.execute(f"SELECT {cols} FROM {table} LIMIT 0")
            casts = arrow_casts(schema, pairs, list(cur.fetch_arrow_table().schema), forced)
        if any(c is None for c in casts):
            _probe(cur, schema, pairs, casts, types, table, where)
        return casts
    except ConveyorError:
        raise
    except Exception as exc:
        raise translate(exc, config, f"checking types of {where}") from None
    finally:
        cur.close()
        conn.rollback()
        conn.close()


def arrow_casts(schema: Any, pairs: list[tuple[str, str]], targets: list[Any], forced: Sequence[str]) -> tuple[Any, ...]:
    return tuple(None if t in forced else _arrow_cast_target(schema.field(s).type, target)
                 for (s, t), target in zip(pairs, targets))


def _probe(cur: Any, schema: Any, pairs: list[tuple[str, str]], casts: tuple[Any, ...], types: list[str],
           table: str, where: str) -> None:
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

    reason = fails(insert_from_temp([t for _, t in pairs], types, table, "_conveyor_probe"))
    if reason is None:
        return
    which = ""
    for (s, t), cast, ty in zip(pairs, casts, types):  # name the column PostgreSQL cannot cast
        if cast is None and fails(f"SELECT {ident(t)}::{ty} FROM pg_temp._conveyor_probe") is not None:
            which = f"column {s} ({_plain(schema.field(s).type)} -> {ty}): "
            break
    raise SchemaError(f"{where}: {which}PostgreSQL cannot cast it: {reason}",
                      hint="cast the column in source.query, or change the target column's type")


def insert_from_temp(columns: Sequence[str], types: Sequence[str], table: str, temp: str) -> str:
    """Move a partition from its temp table into ``table`` (qualified), PostgreSQL casting where Arrow could not."""
    cols = ", ".join(ident(t) for t in columns)
    exprs = ", ".join(f"{ident(t)}::{ty}" for t, ty in zip(columns, types))  # a no-op where types agree
    return f"INSERT INTO {table} ({cols}) SELECT {exprs} FROM pg_temp.{ident(temp)}"


# --- the writers: one partition, one transaction ----------------------------------------------------


def write_adbc(config: PgConnConfig, run_id: str, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
    """ADBC's COPY writer (adbc_ingest), through a temp table where PostgreSQL casts a column."""
    import pyarrow as pa

    load: PgLoad = plan.own
    attempt = commits.Attempt(load.once, part.key, plan.expecting)
    pairs = list(zip(plan.source_columns, plan.columns))
    out_schema = _ingest_schema(plan.schema, pairs, load.casts)
    # errors raised while reading or casting are kept: the driver would only wrap them
    counted = CountingBatches(_no_infinity(_cast_batches(iter(batches), pairs, load.casts, out_schema, part.key), part.key))
    reader = pa.RecordBatchReader.from_batches(out_schema, counted)
    conn = adbc_connect(config, part.key, run_id)
    cur = conn.cursor()

    def fetch(sql: str) -> Any:
        cur.execute(sql)
        return cur.fetchone()

    def body() -> tuple[int, int, int]:
        into = _table(load, plan)
        counts = fetch(_INSERTED_SQL.format(table=literal(into))) if all(c is not None for c in load.casts) else None
        if counts is not None and counts[1] == "on":
            # ADBC's ingest returns the rows it sent; what the target stored is the server's own count of
            # the rows this transaction inserted into it (its leaves, for a partitioned table)
            cur.adbc_ingest(plan.write_target, reader, mode="append", db_schema_name=load.once.schema)
            stored = int(fetch(_INSERTED_SQL.format(table=literal(into)))[0]) - int(counts[0])
        else:  # through a temp table (PostgreSQL casts a column, or the server counts nothing): the INSERT's count
            temp = f"_conveyor_in_{part.index}"
            cur.adbc_ingest(temp, reader, mode="create", temporary=True)
            cur.execute(insert_from_temp(plan.columns, load.target_types, into, temp))
            stored = cur.rowcount
        return stored, counted.bytes, counted.rows

    try:
        # the source or a cast may have failed inside the driver, which only wrapped the error
        return attempt.run(conn, cur.execute, fetch, body, cause=lambda: counted.error)
    finally:
        cur.close()
        conn.close()


def write_pgpq(config: PgConnConfig, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
    """Encode batches to binary COPY with pgpq (native code) and stream them through psycopg."""
    import pyarrow as pa
    from pgpq import ArrowToPostgresBinaryEncoder

    load: PgLoad = plan.own
    attempt = commits.Attempt(load.once, part.key, plan.expecting)
    pairs = list(zip(plan.source_columns, plan.columns))
    types = load.pgpq_types or ()
    out_schema = pa.schema([pa.field(t, ty) for (_, t), ty in zip(pairs, types)])
    counted = CountingBatches(_cast_batches(iter(batches), pairs, types, out_schema, part.key))
    wire = pa.schema([pa.field(t, _wire_type(ty)) for (_, t), ty in zip(pairs, types)])
    encoder = ArrowToPostgresBinaryEncoder(wire)
    con = connect(config, partition=part.key)

    def body() -> tuple[int, int, int]:
        cols = ", ".join(ident(c) for c in plan.columns)
        if load.route is not None and plan.write_target == load.once.table:
            return _routed_copy(con, load, cols, counted, wire), counted.bytes, counted.rows
        temp = f"_conveyor_in_{part.index}" if any(c is None for c in load.casts) else None
        into = _table(load, plan) if temp is None else f"pg_temp.{ident(temp)}"
        if temp is not None:  # PostgreSQL casts these columns from their own type: through a temp table
            temp_types = [_wire_sql(ty) if c is None else tt for c, ty, tt in zip(load.casts, types, load.target_types)]
            con.execute(f"CREATE TEMP TABLE {into} ({', '.join(f'{ident(c)} {ty}' for c, ty in zip(plan.columns, temp_types))}) "
                        "ON COMMIT DROP")
        with con.cursor() as cur:
            freeze = ", FREEZE" if load.once.freeze and temp is None else ""
            with cur.copy(f"COPY {into} ({cols}) FROM STDIN (FORMAT binary{freeze})") as cp:
                cp.write(encoder.write_header())
                for batch in counted:
                    cp.write(encoder.write_batch(_to_pg_epoch(batch, wire)))
                cp.write(encoder.finish())
            stored = cur.rowcount  # the rows COPY stored (a row a trigger skipped is not counted)
        if temp is not None:
            stored = con.execute(insert_from_temp(plan.columns, load.target_types, _table(load, plan), temp)).rowcount
        return stored, counted.bytes, counted.rows

    try:
        return attempt.run(con, con.execute, lambda sql: con.execute(sql).fetchone(), body, cause=lambda: counted.error)
    finally:
        con.close()


def _no_infinity(batches: Iterator[Any], key: str) -> Iterator[Any]:
    """Batches for ADBC's writer, refused by column name at a date or timestamp that is infinity or
    -infinity (core.INFINITY: a source that keeps them, DuckDB's): the writer cannot write them, and
    failed with 'Error occurred writing COPY data:' and nothing after it. pgpq writes them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        for field, arr in zip(batch.schema, batch.columns):
            if not (pa.types.is_date32(field.type) or pa.types.is_timestamp(field.type)) or arr.null_count == len(arr):
                continue
            ints = arr.view(pa.int32() if pa.types.is_date32(field.type) else pa.int64())
            top = INFINITY_DAYS if pa.types.is_date32(field.type) else INFINITY_TICKS
            low, high = pc.min_max(ints).values()
            if high.as_py() == top or low.as_py() == -top:
                what = "infinity" if high.as_py() == top else "-infinity"
                raise TransferError(f"column {field.name} ({field.type}) holds {what}, which ADBC's COPY writer cannot write",
                                    partition=key, hint="use sink.writer=auto or pgpq (it writes PostgreSQL's infinity), or filter the "
                                                        "rows in the source")
        yield batch


def _routed_copy(con: Any, load: PgLoad, cols: str, batches: Iterable[Any], wire: Any) -> int:
    """Each batch's rows grouped by the partition they belong to (routing.Router) and held; when the
    held batches pass ``route_buffer`` bytes, and at the end, each partition's rows are COPYed into
    it (one COPY per partition per flush; everything held is let go at once, so memory is the
    buffer). Returns the rows the target took (the COPY tags' sum)."""
    from pgpq import ArrowToPostgresBinaryEncoder

    from conveyor.connectors.postgres.routing import Router

    router = Router(load.route)
    names = load.route.destinations
    held: dict[int, list[Any]] = {}
    taken = total = 0
    with con.cursor() as cur:

        def flush() -> None:
            nonlocal taken, total
            for dest, parts in sorted(held.items()):
                encoder = ArrowToPostgresBinaryEncoder(wire)  # it keeps up to ~1 MiB until finish(): one per COPY
                with cur.copy(f"COPY {names[dest]} ({cols}) FROM STDIN (FORMAT binary)") as cp:
                    cp.write(encoder.write_header())
                    for rows in parts:
                        cp.write(encoder.write_batch(rows))
                    cp.write(encoder.finish())
                taken += cur.rowcount
            held.clear()
            total = 0

        for batch in batches:
            batch = _to_pg_epoch(batch, wire)
            for dest, rows in router.split(batch):
                held.setdefault(dest, []).append(rows)
            total += batch.nbytes
            if total > load.route_buffer:
                flush()
        flush()
    return taken


#: (rows this transaction inserted into a table and its leaves, whether the server counts them): the
#: server's own account of what an ADBC ingest stored (pg_stat_get_xact_tuples_inserted)
_INSERTED_SQL = ("SELECT coalesce(sum(pg_stat_get_xact_tuples_inserted(r)), 0), current_setting('track_counts') FROM "
                 "(SELECT relid FROM pg_partition_tree({table}::regclass) WHERE isleaf UNION SELECT {table}::regclass) AS t(r)")


def _table(load: PgLoad, plan: SinkPlan) -> str:
    return ident(load.once.schema, plan.write_target)


def pg_column_type(col: PgColumn, arrow: Any, as_text: bool = False) -> ColumnType:
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


def _wire_sql(typ: Any) -> str:
    """The PostgreSQL type whose binary COPY form pgpq writes for the Arrow type ``typ``: a temp table's
    column, cast into the target by PostgreSQL (text for strings; numeric for a decimal of another scale)."""
    import pyarrow as pa

    if pa.types.is_decimal(typ):
        return "numeric"
    if pa.types.is_timestamp(typ):
        return "timestamptz" if typ.tz else "timestamp"
    if pa.types.is_fixed_size_binary(typ):
        return "uuid"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return "bytea"
    names = {"bool": "bool", "int16": "int2", "int32": "int4", "int64": "int8", "float": "float4", "double": "float8",
             "date32[day]": "date", "time64[us]": "time"}
    return names.get(str(typ), "text")


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


def length_limits(pairs: Sequence[tuple[str, str]], sources: dict[str, PgColumn], tcols: Sequence[PgColumn],
                  forced: Sequence[str]) -> tuple[tuple[str, str, int, str], ...]:
    """PgLoad.lengths: the varchar(n) / char(n) columns whose values are checked before the COPY (not
    the ones ``sink.allow_cast`` hands to PostgreSQL's own cast)."""
    limits = [(s, t, text_length_limit(sources.get(s), col), col.type_sql) for (s, t), col in zip(pairs, tcols) if t not in forced]
    return tuple((s, t, n, typ) for s, t, n, typ in limits if n is not None)
