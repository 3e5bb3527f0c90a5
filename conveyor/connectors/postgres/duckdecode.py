"""PostgreSQL binary COPY decoded into Arrow by DuckDB's postgres extension (C++), in the job's snapshot.

ADBC's COPY reader costs about 15 CPU-seconds for TPC-H lineitem SF1 here; DuckDB's postgres
extension decodes the same binary COPY stream in about 4 (``make bench``, group pg_to_parquet). The
extension runs the partition's own SELECT (``postgres_query``) on a connection whose transaction has
first taken the job's exported snapshot (``postgres_execute`` of ``SET TRANSACTION SNAPSHOT`` as the
transaction's first statement), so every partition still reads the one snapshot.

Each column takes its own exact route (:func:`route`, said per column in the plan): DuckDB's value as it
is (``EXACT``: integers, floats, bool, text, varchar, bytea, date, timestamp(tz), uuid, json, jsonb,
time, interval, enums, numeric(p<=38,s), and 1-D arrays of those but bytea); char(n) (and its arrays)
with its padding restored by Arrow; numeric wider than 38 digits read as its text in the same query and
cast to its decimal by Arrow; a bpchar of no length through its output function (a cast to text would
trim it); every other column in its text form. A table's column of a domain is described by the server as
the domain's base type and routed as that. Only a table with a column of none of these (bytea[], bpchar[]
of no length, name[]) is read by ADBC. DuckDB reads a
numeric NaN as 0: the partition's query makes the server fail at a NaN in a numeric column, and the NaN
is refused by name as on ADBC's path; each column is then cast to the type ADBC gives, so a job's
batches are the same whichever decoder read them (tests/connectors/postgres/test_decoder.py compares
the two on a type matrix with edge values, arrays of each type included).
DuckDB writes infinity dates/timestamps (in arrays too) as its own sentinels: they are mapped to ADBC's
encodings, so ``source.special_values`` applies to both the same way.

The extension comes from PyPI (``duckdb-extension-postgres``, pinned by itself to one duckdb
version) and is installed offline into a per-user cache folder: no download.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.connectors.postgres.common import CLIENT_ENCODING, ident
from conveyor.connectors.postgres.types import PgColumn, numeric_arrow_type, numeric_precision_scale
from conveyor.kit import duckext

if TYPE_CHECKING:
    from conveyor.connectors.postgres.common import PgConnConfig

#: base types DuckDB's extension decodes to the same values ADBC does, alone and as 1-D arrays (test_decoder.py)
EXACT = {"int2", "int4", "int8", "float4", "float8", "bool", "text", "varchar", "bytea", "date", "timestamp", "timestamptz",
         "uuid", "json", "jsonb", "time", "interval"}
# and enums (as their labels). Not bytea[] (DuckDB reads it as its text form); arrays are read only where they have
# one dimension and indexes from 1 (reading.refusing_sql makes the server fail at any other: both decoders would flatten it)


@dataclass(frozen=True)
class Route:
    """How DuckDB's decoder reads one column exactly: its expression in the partition's query, what
    Arrow does to DuckDB's value after (``pad``: a char(n)'s padding restored to n characters;
    ``decimal``: the text cast to that decimal), and what the plan says of it."""

    select: str
    how: str
    pad: int | None = None
    decimal: Any = None


def route(col: PgColumn) -> Route | None:
    """The column's route through DuckDB's decoder; None: none is exact (the table is read by ADBC)."""
    q = ident(col.name)
    if col.typtype == "d":  # a domain the server named as such (a query's cast to it): read as its base type, plain ones only
        return Route(col.select_expr(), "DuckDB") if col.typname in EXACT and col.typname != "bytea" else None
    if col.unconstrained_numeric or not col.native:
        return Route(col.select_expr(), "its text form")
    if col.typtype == "e":
        return Route(q, "DuckDB")
    base = col.elem or col.typname
    if base == "bpchar":
        if col.typmod >= 5:  # char(n): DuckDB trims the trailing spaces PostgreSQL pads to n characters
            return Route(q, f"DuckDB, padded back to {col.typmod - 4} characters by Arrow", pad=col.typmod - 4)
        # a bpchar of no length keeps the spaces it was given: its output function keeps them, a cast to text would not
        return None if col.elem else Route(f"textin(bpcharout({q})) AS {q}", "its text form (spaces kept)")
    if base == "numeric":  # numeric[] is not native: read as text above
        ps = numeric_precision_scale(col)
        if ps is not None and ps[0] <= 38:
            return Route(q, "DuckDB")
        decimal = numeric_arrow_type(col)  # DuckDB reads a numeric wider than 38 digits as a double
        return Route(f"{q}::text AS {q}", f"its text, cast to {decimal} by Arrow" if decimal is not None else "its text form",
                     decimal=decimal)
    if base == "name" and not col.elem:
        return Route(f"{q}::text AS {q}", "its text form")
    if base == "oid":  # read as int8 on both decoders (PgColumn.select_expr)
        return Route(col.select_expr(), "DuckDB, as int8")
    if base == "char" and not col.elem:  # the one-byte "char": its text form ('' where it stores a NUL byte, which no text target takes)
        return Route(f"{q}::text AS {q}", "its text form")
    if base in EXACT and not (col.elem and base == "bytea"):
        return Route(q, "DuckDB")
    return None


def routes(columns: tuple[PgColumn, ...]) -> str:
    """What the plan says of each column's route (grouped, in the columns' order)."""
    groups: dict[str, list[str]] = {}
    for col in columns:
        r = route(col)
        groups.setdefault(r.how if r else "ADBC", []).append(col.name)
    return "; ".join(f"{how}: {', '.join(names)}" for how, names in groups.items())


def unfit_column(columns: tuple[PgColumn, ...]) -> PgColumn | None:
    """The first column DuckDB would not decode exactly as ADBC does (None: all of them are fine)."""
    return next((col for col in columns if route(col) is None), None)


def pad(arr: Any, width: int) -> Any:
    """A ``char(width)`` column (or array of them) as DuckDB read it, its padding restored (column-wise, one
    kernel): DuckDB trims only spaces, so a tab or a newline stays, and every value is again as stored."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(arr.type):
        return relist(arr, pad(arr.values, width))
    try:
        if pc.all(pc.string_is_ascii(arr)).as_py():  # a byte is a character: the byte-wise kernel (~9x faster than utf8_rpad)
            return pc.ascii_rpad(arr, width=width, padding=" ")
    except pa.ArrowNotImplementedError:  # a type the ASCII kernels do not take
        pass
    return pc.utf8_rpad(arr, width=width, padding=" ")


def relist(arr: Any, values: Any, typ: Any = None) -> Any:
    """A list column with its values replaced (same offsets and NULLs; ``values`` is ``arr.values`` changed)."""
    import pyarrow as pa

    return pa.ListArray.from_arrays(arr.offsets, values, type=typ or pa.list_(arr.type.value_field.with_type(values.type)),
                                    mask=arr.is_null() if arr.null_count else None)


def conform(arr: Any, typ: Any) -> Any:
    """DuckDB's column as the Arrow type ADBC gives it: the same values (a time zone's name, bool8, an
    extension type on the list's items, ...); a cast that would change a value is refused by Arrow."""
    import pyarrow as pa

    if arr.type == typ:
        return arr
    if pa.types.is_list(typ) and pa.types.is_list(arr.type):
        return relist(arr, conform(arr.values, typ.value_type), typ)
    if isinstance(typ, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(typ, conform(arr, typ.storage_type))
    return arr.cast(typ)


def unavailable() -> str | None:
    """Why the extension cannot load in this process (None: it can)."""
    return duckext.unavailable("postgres")


_quote = duckext.quote


def _libpq_value(value: Any) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _database(conf: PgConnConfig) -> tuple[tuple[Any, ...], Callable[[], Any]]:
    """The key and maker of this process's DuckDB with the server attached as ``src`` (LOAD costs 0.1 s: once per process).

    The password goes into an in-memory DuckDB secret (never into a string DuckDB could print)."""
    pw = conf.password()
    key = ("postgres", conf.host, conf.port, conf.user, conf.dbname, conf.connect_timeout, tuple(sorted((conf.options or {}).items())), pw)

    def make() -> Any:
        import duckdb

        # arrow_lossless_conversion: a uuid leaves DuckDB as Arrow's canonical uuid (16 bytes), as ADBC gives it, not as text
        db = duckdb.connect(config={"extension_directory": duckext.extension_dir("postgres"), "threads": 1, "arrow_lossless_conversion": True,
                                    "autoinstall_known_extensions": False, "autoload_known_extensions": False})
        try:
            db.execute("LOAD postgres")
            db.execute("SET pg_connection_cache = false")  # a server connection per read, closed after it: none left idle
            fields = [f"HOST {_quote(conf.host)}", f"PORT {int(conf.port or 5432)}", f"USER {_quote(conf.user)}",
                      f"DATABASE {_quote(conf.dbname)}"] + ([f"PASSWORD {_quote(pw)}"] if pw is not None else [])
            db.execute(f"CREATE TEMPORARY SECRET conveyor_src (TYPE postgres, {', '.join(fields)})")
            extra = {"connect_timeout": conf.connect_timeout, "application_name": "conveyor", "client_encoding": CLIENT_ENCODING,
                     **(conf.options or {})}
            dsn = " ".join(f"{k}={_libpq_value(v)}" for k, v in extra.items())
            db.execute(f"ATTACH {_quote(dsn)} AS src (TYPE postgres, SECRET conveyor_src, READ_ONLY)")
        except BaseException:
            db.close()
            raise
        return db

    return key, make


def warm(conf: PgConnConfig) -> threading.Thread:
    """Make this process's DuckDB for ``conf`` (the extension loaded, the server attached) in a thread
    of its own, now: the partitions' reads then find it made (or wait for it to be). What fails is
    left for the first read, which makes it again and meets the error. Not a daemon thread: a process
    that ends while it runs (a job refused while it plans) waits for it at exit (the server's
    ``connect_timeout`` bounds it), where a daemon thread left inside DuckDB's C++ as the interpreter
    finalised aborted the process ("terminate called without an active exception", exit 134)."""
    key, make = _database(conf)

    def run() -> None:
        with contextlib.suppress(Exception):
            duckext.attached(key, make)  # DuckDB is imported by make: in this thread too

    thread = threading.Thread(target=run, name="conveyor-duckdb-warm-up", daemon=False)
    thread.start()
    return thread


@contextlib.contextmanager
def connection(conf: PgConnConfig, snapshot: str | None) -> Iterator[Any]:
    """A DuckDB connection whose transaction reads the attached server (``src``) in ``snapshot``."""
    with duckext.cursor(*_database(conf)) as con:
        try:
            con.execute("BEGIN")
            # the extension's transaction on the server is REPEATABLE READ; its first statement takes the snapshot
            if snapshot:
                con.execute(f"CALL postgres_execute('src', {_quote('SET TRANSACTION SNAPSHOT ' + _quote(snapshot))})")
            yield con
        finally:
            with contextlib.suppress(Exception):
                con.execute("ROLLBACK")


def scan_count(con: Any, relid: int, first: bool = False) -> int:
    """The rows the server's scans of table ``relid`` returned so far in this connection's
    transaction (``pg_stat_get_xact_tuples_returned``: counted in the process that scans, so
    ``first`` also keeps the transaction's plans to that one process, no parallel workers)."""
    if first:
        con.execute("CALL postgres_execute('src', 'SET LOCAL max_parallel_workers_per_gather = 0')")
    sql = f"SELECT pg_stat_get_xact_tuples_returned({int(relid)}::oid)"
    return int(con.execute(f"SELECT * FROM postgres_query('src', {_quote(sql)})").fetchone()[0])


def batches(con: Any, sql: str, batch_size: int) -> Iterator[Any]:
    """The query's rows as Arrow record batches, decoded by DuckDB from the server's binary COPY."""
    reader = con.execute(f"SELECT * FROM postgres_query('src', {_quote(sql)})").to_arrow_reader(batch_size)
    yield from reader


# DuckDB's infinity sentinels -> the values ADBC's reader gives infinity (see source._OUT_OF_RANGE)
_INFINITIES = {"date": ((2**31 - 1, -2147472692), (-(2**31 - 1), -2147472691)),
               "timestamp": ((2**63 - 1, -9222425352054775809), (-(2**63 - 1), -9222425352054775808))}


def _as_ints(typname: str, arr: Any) -> tuple[str, Any]:
    """(``_INFINITIES``'s key, the column's integer view) of a date or timestamp column."""
    import pyarrow as pa

    kind = "date" if typname == "date" else "timestamp"
    return kind, arr.view(pa.int32() if kind == "date" else pa.int64())


def in_range(typname: str, arr: Any, low: int) -> bool:
    """Whether a date/timestamp column holds neither of DuckDB's infinity sentinels nor a value
    below ``low`` (what Arrow's dates cannot hold): one pass (min_max) where the checks below take
    five, on every date and timestamp column of every batch."""
    import pyarrow.compute as pc

    kind, ints = _as_ints(typname, arr)
    (pos, _), _ = _INFINITIES[kind]
    mm = pc.min_max(ints)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return lo is None or (lo >= low and hi < pos)  # lo >= low > the negative sentinel


def as_adbc_infinity(typname: str, arr: Any) -> Any:
    """Date/timestamp column with DuckDB's infinity sentinels turned into ADBC's encodings."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, ints = _as_ints(typname, arr)
    (pos, pos_adbc), (neg, neg_adbc) = _INFINITIES[kind]
    hit = pc.or_(pc.equal(ints, pos), pc.equal(ints, neg))
    if not pc.any(hit).as_py():
        return arr
    fixed = pc.if_else(pc.equal(ints, pos), pa.scalar(pos_adbc, ints.type),
                       pc.if_else(pc.equal(ints, neg), pa.scalar(neg_adbc, ints.type), ints))
    return fixed.view(arr.type)
