"""Which encoder writes each column of the PostgreSQL sink's Arrow path, and each column's cast: pgpq
(binary COPY encoded in native code) where it encodes every column exactly for its target type, else
ADBC's ingest; a column Arrow cannot cast exactly is cast by PostgreSQL itself, through a temp table of
the types pgpq writes (``_wire_sql``), under the cast policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.connectors.postgres.common import PgConnConfig, adbc_connect, ident, translate
from conveyor.connectors.postgres.types import PgColumn, adbc_field, text_length_limit
from conveyor.errors import ConveyorError, SchemaError
from conveyor.kit.casts import UNIT_DIGITS, ColumnType


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


def _cast_plan(config: PgConnConfig, scope: str, schema: Any, pairs: list[tuple[str, str]], table: str, where: str,
               tcols: list[PgColumn], forced: Sequence[str] = ()) -> tuple[Any, ...]:
    """Per column, the Arrow type to cast to, or None where PostgreSQL must cast (via a temp
    table): where Arrow cannot, and for the columns of ``sink.allow_cast`` (PostgreSQL's rules).
    The target's Arrow fields are ADBC's driver's, known from the column types where they are
    built in (no connection, ~0.1 s of a job's start); a connection asks the driver for the rest,
    and checks on a temp table what PostgreSQL must cast."""
    types = [c.type_sql for c in tcols]
    # the one-byte "char" takes its text form ('' for the NUL byte it stores), which PostgreSQL casts: its binary form is one
    # byte, which an empty string is not
    forced = (*forced, *(t for (_, t), c in zip(pairs, tcols) if c.typname == "char" and not c.elem))
    known = [adbc_field(c) for c in tcols]
    casts = arrow_casts(schema, pairs, known, forced) if all(f is not None for f in known) else None
    if casts is not None and all(c is not None for c in casts):
        return casts
    conn = adbc_connect(config, scope=scope)
    cur = conn.cursor()
    try:
        if casts is None:  # a column only the driver can type
            cur.execute(f"SELECT oid::int8 FROM pg_type WHERE oid IN ({', '.join(str(int(c.type_oid)) for c in tcols)}) "
                        "AND (typsend = 0 OR typreceive = 0)")
            textual = set(cur.fetch_arrow_table().column(0).to_pylist())  # no binary form (aclitem): PostgreSQL casts its text
            cols = ", ".join(f"NULL::text AS {ident(t)}" if c.type_oid in textual else ident(t) for (_, t), c in zip(pairs, tcols))
            cur.execute(f"SELECT {cols} FROM {table} LIMIT 0")
            casts = arrow_casts(schema, pairs, list(cur.fetch_arrow_table().schema), forced)
            casts = tuple(None if c.type_oid in textual else cast for cast, c in zip(casts, tcols))
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
    for (s, t), cast, ty in zip(pairs, casts, types):  # name the column PostgreSQL cannot cast, with its own reason
        own = fails(f"SELECT {ident(t)}::{ty} FROM pg_temp._conveyor_probe") if cast is None else None
        if own is not None:
            which, reason = f"column {s} ({_plain(schema.field(s).type)} -> {ty}): ", own
            break
    for (s, t), ty in zip(pairs, types):  # else the column the insert alone refuses (an int2vector from smallint[], ...)
        own = None if which else fails(insert_from_temp([t], [ty], table, "_conveyor_probe"))
        if own is not None:
            which, reason = f"column {s} ({_plain(schema.field(s).type)} -> {ty}): ", own
    raise SchemaError(f"{where}: {which}PostgreSQL cannot cast it: {reason}",
                      hint="cast the column in source.query, or change the target column's type")


def pg_column_type(col: PgColumn, arrow: Any, as_text: bool = False) -> ColumnType:
    db = f"enum:{col.typname}" if col.typtype == "e" else col.typname
    return ColumnType(arrow, db=db, sql=col.type_sql, typmod=col.typmod, as_text=as_text)


def _storage(arr: Any) -> Any:
    import pyarrow as pa

    return arr.storage if isinstance(arr.type, pa.BaseExtensionType) else arr


def _arrow_cast_target(src: Any, target_field: Any) -> Any:
    """The Arrow type a source column is cast to for ADBC's COPY writer; None: PostgreSQL casts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tgt = target_field.type
    meta = {k.decode(): v.decode() for k, v in (target_field.metadata or {}).items()}
    if meta.get("POSTGRESQL:type") in ("oid", "money"):
        # ADBC's types for them are not theirs (oid: int32, which holds no oid above 2^31; money: int64 cents, which no
        # money text casts to): PostgreSQL parses the values' text
        return None
    if isinstance(tgt, pa.BaseExtensionType) and tgt.extension_name == "arrow.opaque":
        if meta.get("POSTGRESQL:type") != "numeric":
            return None  # inet, money, ...: PostgreSQL parses the text
        typmod = int(meta.get("POSTGRESQL:typmod", "-1"))
        if typmod >= 0:
            p, s = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
            if p > 76 or s > p:  # wider than any Arrow decimal (or a negative scale): PostgreSQL parses the text
                return None
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
        pc.cast(pa.nulls(0, check_src), check_tgt)  # not pa.array([]): a Python list makes pyarrow import pandas
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


def _plain(typ: Any) -> Any:
    import pyarrow as pa

    return typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ


def length_limits(pairs: Sequence[tuple[str, str]], sources: dict[str, PgColumn], tcols: Sequence[PgColumn],
                  forced: Sequence[str]) -> tuple[tuple[str, str, int, str], ...]:
    """PgLoad.lengths: the varchar(n) / char(n) columns whose values are checked before the COPY (not
    the ones ``sink.allow_cast`` hands to PostgreSQL's own cast)."""
    limits = [(s, t, text_length_limit(sources.get(s), col), col.type_sql) for (s, t), col in zip(pairs, tcols) if t not in forced]
    return tuple((s, t, n, typ) for s, t, n, typ in limits if n is not None)


def fraction_limits(pairs: Sequence[tuple[str, str]], schema: Any, sources: dict[str, PgColumn], tcols: Sequence[PgColumn],
                    forced: Sequence[str]) -> tuple[tuple[str, str, int, str], ...]:
    """PgLoad.fractions: the time(n) / timestamp(n) / timestamptz(n) columns (n < 6) whose source holds more fractional
    digits (a PostgreSQL column of a finer precision, an Arrow unit finer than n): each value is checked before the
    COPY, which would round it (not the ones ``sink.allow_cast`` hands to PostgreSQL's own cast)."""
    out = []
    for (s, t), col in zip(pairs, tcols):
        if t in forced or col.typname not in ("time", "timestamp", "timestamptz") or not 0 <= col.typmod < 6:
            continue
        src = sources.get(s)
        if src is not None and src.typname in ("time", "timestamp", "timestamptz"):
            digits = 6 if src.typmod < 0 else src.typmod
        else:
            digits = UNIT_DIGITS.get(getattr(schema.field(s).type, "unit", ""), 0)
        if digits > col.typmod:
            out.append((s, t, col.typmod, col.type_sql))
    return tuple(out)


def insert_from_temp(columns: Sequence[str], types: Sequence[str], table: str, temp: str) -> str:
    """Move a partition from its temp table into ``table`` (qualified), PostgreSQL casting where Arrow could not."""
    cols = ", ".join(ident(t) for t in columns)
    exprs = ", ".join(f"{ident(t)}::{ty}" for t, ty in zip(columns, types))  # a no-op where types agree
    return f"INSERT INTO {table} ({cols}) OVERRIDING SYSTEM VALUE SELECT {exprs} FROM pg_temp.{ident(temp)}"  # an ALWAYS identity too


def _ingest_schema(schema: Any, pairs: Sequence[tuple[str, str]], casts: Sequence[Any]) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field(t, c if c is not None else schema.field(s).type) for (s, t), c in zip(pairs, casts)])
