"""The PostgreSQL sink's Arrow path: which encoder writes each column, and the two writers.

In prepare, :func:`plan_arrow` decides per column the Arrow type it is cast to (or that
PostgreSQL casts it, through a temp table) and the encoder: pgpq (binary COPY encoded in native
code, about a third of ADBC's client CPU) where it encodes every column for its target type, else
ADBC's ``adbc_ingest``. In the task, :func:`write_pgpq` / :func:`write_adbc` write one partition
in one transaction, exactly once (``commits.Attempt``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres import commits
from conveyor.connectors.postgres.common import PgConnConfig, adbc_connect, connect, ident, literal, sqlstate, translate
from conveyor.connectors.postgres.encoding import _cast_plan, _ingest_schema, _storage, _wire_sql, _wire_type, choose_writer, insert_from_temp
from conveyor.connectors.postgres.types import PgColumn
from conveyor.core import INFINITY_DAYS, INFINITY_TICKS, Partition, SinkPlan, WriteStats
from conveyor.errors import TransferError
from conveyor.kit.arrowutil import CountingBatches


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
    #: create / replace making a new table, sink.definition: the PostgreSQL source table's definition
    #: (TableDefinition), built on the staged table with the primary key
    definition: Any = None
    #: schema_drift=evolve: the columns prepare added to the target (dropped again by a run that leaves nothing)
    added: tuple[str, ...] = ()
    #: sink.routing=leaves: the target's partition tree (parttree.Tree), each row COPYed into its leaf
    route: Any = None
    #: the Arrow bytes a routed partition holds before it COPYs every leaf's share (routing_buffer_mb)
    route_buffer: int = 64 << 20
    #: (source column, target column, n, target type) of each varchar(n) / char(n) column whose
    #: values' lengths are checked before the COPY (types.text_length_limit; arrowutil.length_checked)
    lengths: tuple[tuple[str, str, int, str], ...] = ()
    #: time(n) / timestamp(n) targets whose values' fractional seconds are checked before the COPY, which would round them
    #: (encoding.fraction_limits; arrowutil.fraction_checked)
    fractions: tuple[tuple[str, str, int, str], ...] = ()


def plan_arrow(config: PgConnConfig, writer: str, scope: str, schema: Any, pairs: list[tuple[str, str]], table: str,
               where: str, tcols: list[PgColumn], forced: Sequence[str]) -> tuple[tuple[Any, ...], str, str, tuple[Any, ...] | None]:
    """(casts, writer, why not pgpq, pgpq types) for loading ``schema`` into ``table`` (qualified)."""
    casts = _cast_plan(config, scope, schema, pairs, table, where, tcols, forced)
    chosen, why, types = choose_writer(writer, schema, pairs, casts, tcols, where)
    return casts, chosen, why, types


# --- the writers: one partition, one transaction ----------------------------------------------------


def write_adbc(config: PgConnConfig, scope: str, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
    """ADBC's COPY writer (adbc_ingest), through a temp table where PostgreSQL casts a column."""
    import pyarrow as pa

    load: PgLoad = plan.own
    attempt = commits.Attempt(load.once, part.key, plan.expecting)
    pairs = list(zip(plan.source_columns, plan.columns))
    out_schema = _ingest_schema(plan.schema, pairs, load.casts)
    # errors raised while reading or casting are kept: the driver would only wrap them
    counted = CountingBatches(_no_infinity(_cast_batches(iter(batches), pairs, load.casts, out_schema, part.key), part.key))
    reader = pa.RecordBatchReader.from_batches(out_schema, counted)
    conn = adbc_connect(config, part.key, scope)
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
            with _casts_named(config, load, plan, part):
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
            with _casts_named(config, load, plan, part):
                stored = con.execute(insert_from_temp(plan.columns, load.target_types, _table(load, plan), temp)).rowcount
        return stored, counted.bytes, counted.rows

    try:
        return attempt.run(con, con.execute, lambda sql: con.execute(sql).fetchone(), body, cause=lambda: counted.error)
    finally:
        con.close()


@contextlib.contextmanager
def _casts_named(config: PgConnConfig, load: PgLoad, plan: SinkPlan, part: Partition) -> Iterator[None]:
    """The INSERT that moves a partition from its temp table, PostgreSQL casting some columns: a value a cast refuses
    (an enum label the target's type lacks, text no type takes) is an error naming those columns and their types, which
    PostgreSQL's own message does not (no COPY context there)."""
    try:
        yield
    except Exception as exc:
        cast = [f"{t} to {ty}" for t, c, ty in zip(plan.columns, load.casts, load.target_types) if c is None]
        if not (sqlstate(exc) or "").startswith("22") or not cast:
            raise
        err = translate(exc, config, f"writing {part.key} into {load.once.target}", part.key)
        err.message = f"{err.message} (in PostgreSQL's cast of column {'; column '.join(cast)})"
        err.args = (err.message,)
        raise err from None


def _no_infinity(batches: Iterator[Any], key: str) -> Iterator[Any]:
    """Batches for ADBC's writer, refused by column name at a date or timestamp that is infinity or
    -infinity (core.INFINITY: a source that keeps them, DuckDB's): the writer cannot write them, and
    failed with 'Error occurred writing COPY data:' and nothing after it. pgpq writes them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def items(arr: Any) -> tuple[Any, bool]:
        """The dates or timestamps of a column, or of the lists it holds (at any depth), and whether they were in lists."""
        listed = False
        while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
            arr, listed = pc.list_flatten(arr), True
        return arr, listed

    for batch in batches:
        for field, column in zip(batch.schema, batch.columns):
            arr, listed = items(column)
            if not (pa.types.is_date32(arr.type) or pa.types.is_timestamp(arr.type)) or arr.null_count == len(arr):
                continue
            ints = arr.view(pa.int32() if pa.types.is_date32(arr.type) else pa.int64())
            top = INFINITY_DAYS if pa.types.is_date32(arr.type) else INFINITY_TICKS
            low, high = pc.min_max(ints).values()
            if high.as_py() == top or low.as_py() == -top:
                what = "infinity" if high.as_py() == top else "-infinity"
                if listed:  # (PostgreSQL's date out of range, naming no column; no writer here takes it in an array)
                    raise TransferError(f"column {field.name} ({field.type}) holds {what} in an array, which Conveyor's COPY "
                                        "writers cannot write", partition=key,
                                        hint="filter those rows in the source, or load the column as text (a source query's ::text)")
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


# --- Arrow casting, column by column -------------------------------------------------------------


def _int_scalar(value: int, typ: Any) -> Any:
    """An int32/int64 Arrow scalar made from its bytes: ``pa.scalar(value)`` (and a compute function given a Python
    int) makes pyarrow import pandas where it is installed, ~0.15 s and ~40 MB of a process that never needed it."""
    import struct

    import pyarrow as pa

    return pa.Array.from_buffers(typ, 1, [None, pa.py_buffer(struct.pack("<i" if typ == pa.int32() else "<q", value))])[0]


def _to_pg_epoch(batch: Any, wire: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = []
    for arr, out in zip(batch.columns, wire):
        if arr.type != out.type:
            ints = arr.view(out.type)
            days = out.type == pa.int32()
            offset, top = (10957, INFINITY_DAYS) if days else (946684800000000, INFINITY_TICKS)
            shifted = pc.subtract(ints, _int_scalar(offset, out.type))  # wraps, never raises
            bottom = _int_scalar(-top - 1, out.type)  # PostgreSQL's -infinity
            arr = pc.if_else(pc.equal(ints, _int_scalar(top, out.type)), ints,
                             pc.if_else(pc.equal(ints, _int_scalar(-top, out.type)), bottom, shifted))
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=wire)


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


