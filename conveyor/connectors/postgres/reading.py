"""The PostgreSQL source's Arrow read path: a partition decoded from binary COPY by DuckDB's postgres
extension or by ADBC's COPY reader (``source.decoder``), in the job's snapshot, to the one Arrow schema
the source describes; special values (infinity, out-of-range timestamps, numeric NaN) refused by name or
handled as ``source.special_values`` says, column by column (never per row); and the rows the server's
scan returned, where that is the partition's count (``SentBatches.sent``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, Protocol

from conveyor.connectors.postgres import duckdecode
from conveyor.connectors.postgres.common import adbc_connect, ident, literal, translate
from conveyor.connectors.postgres.types import PgColumn, numeric_arrow_type
from conveyor.core import INFINITY_DAYS, INFINITY_TICKS, CursorWindow, JobOptions, PageRange, Partition, SentBatches, WholeSource
from conveyor.errors import TransferError
from conveyor.kit.arrowutil import rebatch
from conveyor.kit.casts import TEXT_OF


class Readable(Protocol):
    """What the read path takes of :class:`~conveyor.connectors.postgres.source.PostgresSource`: what
    ``describe`` found (the decoder, the relation, the columns, whether its scan counts can be read)
    and how the source words a partition's query."""

    config: Any
    options: JobOptions
    columns: tuple[PgColumn, ...]
    decoder: str
    keep_infinity: bool
    relid: int | None
    relkind: str
    scan_stats: bool
    server_version: int
    snapshot_id: str | None
    window: CursorWindow | None

    @property
    def schema(self) -> Any: ...

    def select_list(self) -> str: ...

    def select_sql(self, part: Partition, columns: str | None = None) -> str: ...

    def from_sql(self) -> str: ...

    def where(self, part: Partition) -> str: ...

    def window_sql(self) -> str: ...


def read(src: Readable, part: Partition) -> SentBatches:
    """The partition's batches, by the decoder ``describe`` chose."""
    if src.decoder == "duckdb":
        if src.config.decoder == "duckdb" or duckdecode.unavailable() is None:
            return SentBatches(lambda sent: read_duckdb(src, part, sent))
        # auto, and this worker cannot load the extension: ADBC's batches are the same (test_decoder.py)
    return SentBatches(lambda sent: read_adbc(src, part, sent))


def counted_kinds(src: Readable) -> tuple[str, ...]:
    """The partitions whose reads report their server's scan count (SourceInfo.reads_count): a table's
    whole heap (a sequential scan), and a page range where the server has TID range scans (14+); on a
    server that counts scans, when the job verifies counts."""
    if src.options.verify == "none" or not src.scan_stats or src.relkind not in ("r", "m"):
        return ()
    return (WholeSource.kind, PageRange.kind) if src.server_version >= 140000 else (WholeSource.kind,)


def scan_counts(src: Readable, part: Partition) -> bool:
    """Whether the rows the server's scan returns for ``part`` are the rows its query sends, so
    that the scan's count (``pg_stat_get_xact_tuples_returned``) is the partition's source count:
    a table's whole heap (a sequential scan) or a page range (a TID range scan, PostgreSQL 14+),
    no incremental window (a filter above the scan: it returns rows the query drops), on a server
    that counts scans (describe asks). Only when the job verifies counts."""
    return src.window is None and part.kind in counted_kinds(src)


def _scan_count(cur: Any, relid: int, first: bool = False) -> int:
    """ADBC's cursor: what :func:`duckdecode.scan_count` asks on DuckDB's connection."""
    if first:
        cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    cur.execute(f"SELECT pg_stat_get_xact_tuples_returned({int(relid)}::oid)")
    return int(cur.fetchone()[0])


def read_adbc(src: Readable, part: Partition, sent: SentBatches) -> Iterator[Any]:
    """The partition decoded by ADBC's COPY reader, in the job's snapshot; ``sent.sent`` as on DuckDB's."""
    arrays = _array_columns(src)
    sql = refusing_sql(src, part, [], arrays)
    relid = src.relid if scan_counts(src, part) else None
    conn = adbc_connect(src.config, part.key, src.options.load)
    cur = conn.cursor()
    try:
        try:
            # ADBC opened a transaction (autocommit is off): pin it to the job's snapshot
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if src.snapshot_id:
                cur.execute(f"SET TRANSACTION SNAPSHOT {literal(src.snapshot_id)}")
            before = _scan_count(cur, relid, first=True) if relid is not None else 0
            cur.execute(sql)
            reader = cur.fetch_record_batch()
        except Exception as exc:
            raise _refused(exc, [], arrays, part.key) or translate(exc, src.config, f"reading {part.key}", part.key) from None
        yield from rebatch(convert(src, reader, part.key, arrays), src.options.batch_size)
        if relid is not None:
            try:
                sent.sent = _scan_count(cur, relid) - before
            except Exception as exc:
                raise translate(exc, src.config, f"reading {part.key}", part.key) from None
    finally:
        with contextlib.suppress(Exception):  # a killed connection cannot roll back; it is gone anyway
            cur.close()
            conn.rollback()
        conn.close()


def read_duckdb(src: Readable, part: Partition, sent: SentBatches) -> Iterator[Any]:
    """The partition decoded by DuckDB's postgres extension, in the job's snapshot, each column by its
    route (:func:`duckdecode.route`) and cast to ADBC's schema; ``sent.sent``: the rows the server's
    scan returned, where :meth:`_scan_counts`."""
    import pyarrow as pa

    routes = [duckdecode.route(c) for c in src.columns]
    numerics = [c for c, r in zip(src.columns, routes) if c.typname == "numeric" and c.native and not c.unconstrained_numeric
                and r is not None and r.decimal is None]
    arrays = _array_columns(src)
    relid = src.relid if scan_counts(src, part) else None
    select = ", ".join(r.select for r in routes if r is not None)
    try:
        with duckdecode.connection(src.config, src.snapshot_id) as con:
            before = duckdecode.scan_count(con, relid, first=True) if relid is not None else 0
            reader = duckdecode.batches(con, refusing_sql(src, part, numerics, arrays, select), src.options.batch_size)
            for batch in reader:
                if batch.num_rows:
                    yield pa.RecordBatch.from_arrays([_duck_column(src, col, arr, field.type, r, part.key) for col, arr, field, r
                                                      in zip(src.columns, batch.columns, src.schema, routes)], schema=src.schema)
            if relid is not None:
                sent.sent = duckdecode.scan_count(con, relid) - before
    except TransferError:
        raise
    except Exception as exc:
        raise _refused(exc, numerics, arrays, part.key) or translate(exc, src.config, f"reading {part.key}", part.key) from None


def _duck_column(src: Readable, col: PgColumn, arr: Any, typ: Any, route: Any, key: str) -> Any:
    """One column of DuckDB's batch as ADBC gives it: its route's fix-up, DuckDB's infinities as ADBC's
    (then ``source.special_values``, as on ADBC's path), the same values in ADBC's Arrow type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if route.pad is not None:
        arr = duckdecode.pad(arr, route.pad)
    if route.decimal is not None:
        try:
            arr = pc.cast(arr, route.decimal)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise _unfit_decimal(col, route.decimal, exc, key) from None
    kind = col.elem or col.typname
    if kind in _OUT_OF_RANGE and (col.native or col.typtype == "d"):
        arr = duckdecode.conform(arr, typ)
        values = arr.values if col.elem else arr
        if not duckdecode.in_range(kind, values, _OUT_OF_RANGE[kind][0]):
            values = special(src, col, duckdecode.as_adbc_infinity(kind, values), key, kind)
            arr = duckdecode.relist(arr, values, typ) if col.elem else values
    return duckdecode.conform(arr, typ)  # same values (tz name, int width, bool8): safe casts, refused if not


def _array_columns(src: Readable) -> list[PgColumn]:
    """The array columns read as Arrow lists (not as their text form)."""
    return [c for c in src.columns if c.elem and c.native]


def _refused(exc: Exception, numerics: list[PgColumn], arrays: list[PgColumn], key: str) -> TransferError | None:
    """The error the server raised at a value :func:`refusing_sql` refuses, by its column (None: another error)."""
    text = str(exc)
    hit = _NAN_SEEN.search(text)
    if hit and int(hit.group(1)) < len(numerics):
        col = numerics[int(hit.group(1))]
        return _unfit_decimal(col, numeric_arrow_type(col), "NaN", key)
    hit = _ARRAY_SEEN.search(text)
    if hit and int(hit.group(1)) < len(arrays):
        col = arrays[int(hit.group(1))]
        return TransferError(
            f"postgres column {col.name} ({col.type_sql}) holds an array of {hit.group(2)} dimension(s) or one whose indexes do not "
            "start at 1, which an Arrow list cannot hold as it is (it would be flattened, its bounds lost)", partition=key,
            hint=f"read it as text ({col.name}::text in source.query), or reshape it there (e.g. unnest); PostgreSQL to PostgreSQL: "
                 "sink.copy_path=passthrough keeps it")
    return None


def refusing_sql(src: Readable, part: Partition, numerics: list[PgColumn], arrays: list[PgColumn], select: str | None = None) -> str:
    """The partition's query, made to fail on the server at a value the Arrow read would change without
    a word: a numeric NaN in ``numerics`` (DuckDB's decoder reads it as 0), and in ``arrays`` an array
    of more than one dimension or whose indexes do not start at 1 (both decoders flatten it into one
    list and drop its bounds; PostgreSQL does not hold an array column to its declared dimensions).
    The error names the column by its index there (what ``_NAN_SEEN`` and ``_ARRAY_SEEN`` find).
    The check is a filter that never drops a row (0 <> 1), not a column:
    a computed column makes PostgreSQL project every row, which costs the server far more than the
    filter (benchmarks/results/design-measurements.md, "NaN check"). Written as ``<> 1``, which the planner
    estimates to keep 99.5% of the rows (an ``IS NULL`` of the same CASE: 0.5%, so a whole
    table's read was planned as a Gather over a Parallel Seq Scan, where the plain query has a
    Seq Scan). It sees only the rows the job reads, whatever order the planner gives the
    conditions: outside the incremental window the CASE stops before any comparison (a
    partition's bounds need no such guard: every row is some partition's); a query's own filters
    are fenced off (OFFSET 0: a projection again, as the flags cost). Only the branch that met a
    NaN casts text to int (its text holds the column's value, so the planner cannot fold it
    ahead; a cast for every row cost the server more)."""
    if not numerics and not arrays:
        return src.select_sql(part, select)
    whens = " ".join([*(f"WHEN {ident(c.name)} = 'NaN' THEN ('{_NAN_MARK}{i}' || {ident(c.name)})::int" for i, c in enumerate(numerics)),
                      *(f"WHEN array_ndims({ident(c.name)}) > 1 OR array_lower({ident(c.name)}, 1) <> 1 "
                        f"THEN ('{_ARRAY_MARK}{i}-' || array_ndims({ident(c.name)}))::int" for i, c in enumerate(arrays))])
    if not src.config.table:
        return f"SELECT * FROM ({src.select_sql(part, select)} OFFSET 0) AS _conveyor_rows WHERE (CASE {whens} ELSE 0 END) <> 1"
    window = src.window_sql()
    guard = f"WHEN ({window}) IS NOT TRUE THEN 0 " if window else ""
    check = f"(CASE {guard}{whens} ELSE 0 END) <> 1"
    where = src.where(part).removeprefix(" WHERE ")
    return f"SELECT {select or src.select_list()} FROM {src.from_sql()} WHERE " + (f"({where}) AND {check}" if where else check)


def convert(src: Readable, reader: Any, key: str, arrays: list[PgColumn] | None = None) -> Iterator[Any]:
    """numeric text -> decimal, extension metadata stripped; column by column, never per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    targets = [numeric_arrow_type(c) for c in src.columns]
    schema = None
    try:
        for batch in reader:
            arrays = []
            for col, arr, target in zip(src.columns, batch.columns, targets):
                if col.typname in _OUT_OF_RANGE and not col.elem:
                    arr = special(src, col, arr, key)
                elif col.elem in _OUT_OF_RANGE and col.native and pa.types.is_list(arr.type):
                    arr = duckdecode.relist(arr, special(src, col, arr.values, key, col.elem), arr.type)
                if target is not None:
                    storage = arr.storage if isinstance(arr.type, pa.BaseExtensionType) else arr
                    try:
                        arr = pc.cast(storage, target)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise _unfit_decimal(col, target, exc, key) from None
                arrays.append(arr)
            if schema is None:
                schema = pa.schema([pa.field(c.name, a.type, metadata=text_of(c)) for c, a in zip(src.columns, arrays)])
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)
    except TransferError:
        raise
    except Exception as exc:
        raise _refused(exc, [], arrays or [], key) or translate(exc, src.config, f"reading {key}", key) from None


def special(src: Readable, col: PgColumn, arr: Any, key: str, kind: str | None = None) -> Any:
    """Dates and timestamps Arrow cannot hold: refused by name, or NULL / clamped as configured
    (``kind``: the type of ``arr``'s values, an array column's element type)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = kind or col.typname
    low, inf, neg_inf = _OUT_OF_RANGE[kind]
    ints = arr.view(pa.int32() if kind == "date" else pa.int64())
    smallest = pc.min(ints).as_py()
    if smallest is None or smallest >= low:
        return arr  # the usual case: one pass over the column, nothing to do
    if src.keep_infinity:
        top = INFINITY_DAYS if kind == "date" else INFINITY_TICKS
        ints = pc.if_else(pc.equal(ints, inf), top, pc.if_else(pc.equal(ints, neg_inf), -top, ints)).cast(ints.type)
        bad = pc.and_(pc.less(ints, low), pc.not_equal(ints, -top))
        if not pc.any(bad).as_py():
            return ints.view(arr.type)
    else:
        bad = pc.less(ints, low)
    if src.config.special_values == "error":
        first = ints.filter(bad)[0].as_py()
        what = {inf: "infinity", neg_inf: "-infinity"}.get(first, "a timestamp after 294247-01-10")
        raise TransferError(
            f"postgres column {col.name} ({col.type_sql}) holds {what}, which Arrow (and Parquet, DuckDB) cannot hold",
            partition=key, hint="set source.special_values=null or clamp, filter or cast it in source.query, "
                                "or (PostgreSQL to PostgreSQL) use sink.copy_path=passthrough, which keeps it")
    if src.config.special_values == "null":
        return pc.if_else(bad, pa.scalar(None, arr.type), arr)
    high, lowest = _CLAMP["date" if kind == "date" else "timestamp"]
    clamped = pc.if_else(pc.equal(ints, neg_inf), lowest, high).cast(ints.type)
    return pc.if_else(bad, clamped, ints).view(arr.type)


def _unfit_decimal(col: PgColumn, target: Any, why: Any, key: str) -> TransferError:
    """A numeric value with no Arrow decimal form (NaN, Infinity, too many digits), refused by name:
    ADBC's path finds it casting the text, DuckDB's path when the server fails at a NaN."""
    return TransferError(f"postgres column {col.name} ({col.type_sql}): a value does not fit {target or 'an Arrow decimal'}: {why}",
                         partition=key,
                         hint="NaN and Infinity have no Arrow decimal form; cast the column to text or float8 in source.query")


#: the text the server fails to read as an integer at a numeric NaN (refusing_sql), with the column's index
_NAN_MARK = "conveyor-nan-"
_NAN_SEEN = re.compile(re.escape(_NAN_MARK) + r"(\d+)")
#: the same at an array Arrow cannot hold as it is: the column's index, then the array's dimensions
_ARRAY_MARK = "conveyor-array-"
_ARRAY_SEEN = re.compile(re.escape(_ARRAY_MARK) + r"(\d+)-(\d+)")

# ADBC reads PostgreSQL's dates and timestamps by adding the 1970-2000 offset, which wraps around
# for infinity, -infinity and timestamps after 294247-01-10: every such value lands below PostgreSQL's
# earliest (4714-11-24 BC), where no real value can be. Below that bound: (infinity, -infinity).
_OUT_OF_RANGE = {"date": (-2440588, -2147472692, -2147472691),
                 "timestamp": (-210866803200000000, -9222425352054775809, -9222425352054775808),
                 "timestamptz": (-210866803200000000, -9222425352054775809, -9222425352054775808)}
_CLAMP = {"date": (2145042905, -2440588),  # 5874897-12-31, 4714-11-24 BC
          "timestamp": (2**63 - 2, -210866803200000000)}  # 294247-01-10 04:00:54.775806 (DuckDB's latest), 4714-11-24 BC


def text_of(col: PgColumn) -> dict[bytes, bytes] | None:
    """Field metadata for a column read as PostgreSQL's text form of its type (kept by Parquet): the
    cast policy then knows the text is, say, an inet, and loads it into an inet column as it is."""
    if col.unconstrained_numeric or not col.native:
        return {TEXT_OF: col.typname.encode()}
    return None
