"""PostgreSQL <-> Arrow type mapping.

Reading (ADBC decodes binary COPY natively): integers, floats, bool, text types, bytea,
date, time, timestamp(tz), interval, uuid, json(b), enums and arrays of those keep their
Arrow types; numeric(p,s) becomes decimal128/256(p,s); numeric without a precision, or with more
than 76 digits (the widest Arrow decimal's), is read as its text (exact, NaN included: Arrow
decimals have a fixed scale and no NaN); oid (unsigned 32 bits)
as int8; every other type
(inet, money, ranges, geometric, bit, xml, composite, ...) is read as its text form.

Writing (ADBC's binary COPY writer): each batch column is cast to the Arrow type ADBC reads
for the target column (int64 -> int32 for an integer column, string -> decimal for numeric,
...). A column Arrow cannot cast goes through a temporary table and PostgreSQL's own cast
(text -> inet, text -> numeric with NaN, ...). ``create`` makes columns from the Arrow
schema, or, when the source is PostgreSQL, with the source's own built-in types.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from conveyor.errors import SchemaError

# Types ADBC's PostgreSQL driver decodes to a proper Arrow type (others become opaque binary).
NATIVE = {
    "int2", "int4", "int8", "float4", "float8", "bool", "text", "varchar", "bpchar", "name", "char",
    "bytea", "date", "time", "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb", "numeric", "oid",
}
_INTEGER = {"int2", "int4", "int8", "oid"}
_NUMERIC = {"numeric", "float4", "float8"}
_TEMPORAL = {"date", "timestamp", "timestamptz"}
USER_OID_START = 16384  # OIDs below are built into every server


@dataclass(frozen=True)
class PgColumn:
    name: str
    type_oid: int
    typmod: int
    type_sql: str  # format_type(): "numeric(12,2)", "character varying(10)", "mood", ...
    typname: str
    typtype: str  # b base, e enum, d domain, c composite, r range, ...
    elem: str  # element typname for arrays, "" otherwise
    base_sql: str = ""  # for domains: the base type
    #: the column's collation where it is not its type's default (a table's column: "C", "en-x-icu", ...), quoted
    collation: str = ""
    #: read as its text whatever its type (``conveyor verify`` of one PostgreSQL beside another: numerics and arrays,
    #: whose values Arrow cannot always hold, NaN or several dimensions, and JSON, compared as both servers print them)
    as_text: bool = False

    @property
    def kind(self) -> str:
        if self.typname in _INTEGER:
            return "integer"
        if self.typname in _NUMERIC:
            return "numeric"
        if self.typname in _TEMPORAL:
            return "temporal"
        return "other"

    @property
    def native(self) -> bool:
        """ADBC reads it as a proper Arrow type (else it is read as text)."""
        if self.as_text:
            return False
        if self.typtype == "e":
            return True
        if self.elem:
            return self.elem in NATIVE and self.elem not in ("numeric",)
        return self.typtype == "b" and self.typname in NATIVE

    @property
    def unconstrained_numeric(self) -> bool:
        """A numeric no Arrow decimal holds as declared: no precision, or more than 76 digits (read as its text)."""
        return self.typname == "numeric" and (self.typmod < 0 or ((self.typmod - 4) >> 16) & 0xFFFF > MAX_DECIMAL_DIGITS)

    def select_expr(self) -> str:
        from conveyor.connectors.postgres.common import ident

        q = ident(self.name)
        if self.as_text:  # a numeric without its trailing zeros: 1.50 in numeric(12,2) and 1.5000 in numeric(20,4) are one value;
            if self.typname == "numeric":  # JSON as jsonb prints it (keys in its order, one space): json and jsonb compare
                return f"trim_scale({q})::text AS {q}"
            return f"{q}::jsonb::text AS {q}" if self.typname in ("json", "jsonb") else f"{q}::text AS {q}"
        if self.typtype == "d" and self.base_sql:
            return f"{q}::{self.base_sql} AS {q}"
        if self.unconstrained_numeric or not self.native:
            return f"{q}::text AS {q}"
        if self.typname == "oid" or self.elem == "oid":  # unsigned 32 bits: ADBC read 4294967295 as the int32 -1
            return f"{q}::int8{'[]' if self.elem else ''} AS {q}"
        if self.typname == "char" and not self.elem:  # the one-byte "char" stores '' as a NUL byte: its text form is ''
            return f"{q}::text AS {q}"
        return q


def read_columns(con: Any, sql: str) -> list[PgColumn]:
    """The columns of a query's result, with their exact PostgreSQL types (psycopg connection)."""
    cur = con.execute(sql)
    res = cur.pgresult
    names = [d.name for d in cur.description]
    oids = [res.ftype(i) for i in range(res.nfields)]
    mods = [res.fmod(i) for i in range(res.nfields)]
    rows = con.execute(
        "SELECT format_type(m.oid, m.mod), t.typname, t.typtype, coalesce(e.typname, ''), "
        "CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) ELSE '' END, "
        "CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END "
        "FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY AS m(oid, mod, ord) "
        "JOIN pg_type t ON t.oid = m.oid LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A' "
        "LEFT JOIN pg_type b ON b.oid = t.typbasetype ORDER BY m.ord",
        [oids, mods],
    ).fetchall()
    cols = []
    for name, oid, mod, (type_sql, typname, typtype, elem, base_sql, base_name) in zip(names, oids, mods, rows):
        if typtype == "d":  # a domain reads as its base type
            cols.append(PgColumn(name, oid, mod, type_sql, base_name, "d", "", base_sql))
        else:
            cols.append(PgColumn(name, oid, mod, type_sql, typname, typtype, elem))
    return cols


#: the digits of Arrow's widest decimal (decimal256)
MAX_DECIMAL_DIGITS = 76


def numeric_precision_scale(col: PgColumn) -> tuple[int, int] | None:
    """(p, s) of a numeric(p, s) column read as a decimal; None for every other column (and for a
    negative scale, PostgreSQL 15+, or more than 76 digits, which keep their text)."""
    if col.typname != "numeric" or col.typmod < 0 or col.elem:
        return None
    precision = ((col.typmod - 4) >> 16) & 0xFFFF
    scale = (col.typmod - 4) & 0xFFFF
    if scale > precision or scale >= 0x8000 or precision > MAX_DECIMAL_DIGITS:
        return None
    return precision, scale


def numeric_arrow_type(col: PgColumn) -> Any:
    """decimal128/256(p, s) for numeric(p, s); None for every other column (and one read as its text)."""
    ps = numeric_precision_scale(col)
    if ps is None or col.as_text:
        return None
    import pyarrow as pa

    precision, scale = ps
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


@functools.cache
def _adbc_scalars() -> dict[str, Any]:
    """Built-in base types -> the Arrow type ADBC's driver reads them as, the same from driver 1.4 to
    1.13 (uuid, json and oid are not: their types changed; arrays' item fields gained metadata): checked
    against the installed driver by tests/connectors/postgres/test_describe.py, type by type."""
    import pyarrow as pa

    text = pa.string()
    return {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64(), "float4": pa.float32(), "float8": pa.float64(),
            "bool": pa.bool_(), "text": text, "varchar": text, "bpchar": text, "name": text, "char": text, "bytea": pa.binary(),
            "date": pa.date32(), "time": pa.time64("us"), "timestamp": pa.timestamp("us"), "timestamptz": pa.timestamp("us", tz="UTC"),
            "interval": pa.month_day_nano_interval()}


def adbc_field(col: PgColumn) -> Any:
    """The Arrow field ADBC's driver gives a target column selected as it is (type and metadata),
    known from its PostgreSQL type alone: the built-in scalars above, numeric, enums; None for the
    rest (ask the driver)."""
    import pyarrow as pa

    meta = {"POSTGRESQL:type": col.typname}
    if col.elem or col.typtype not in ("b", "e"):
        return None
    if col.typtype == "e":
        return pa.field(col.name, pa.string(), metadata=meta)
    if col.typname == "numeric":
        if not hasattr(pa, "opaque"):
            return None
        return pa.field(col.name, pa.opaque(pa.string(), "numeric", "PostgreSQL"),
                        metadata={"ADBC:postgresql:typname": "numeric", **meta, "POSTGRESQL:typmod": str(col.typmod)})
    typ = _adbc_scalars().get(col.typname)
    return pa.field(col.name, typ, metadata=meta) if typ is not None else None


def read_arrow_type(col: PgColumn) -> Any:
    """The Arrow type a source column has in the batches read (as :meth:`PgColumn.select_expr`
    selects it: ADBC's type, numeric(p,s) as a decimal), known from its PostgreSQL type alone;
    None for a column only ADBC's driver can say (ask it)."""
    import pyarrow as pa

    if col.as_text:
        return pa.string()
    decimal = numeric_arrow_type(col)
    if decimal is not None:
        return decimal
    if col.typtype == "d":
        return None
    if col.unconstrained_numeric or not col.native or col.typtype == "e":
        return pa.string()  # selected as its text (enums: ADBC reads their text)
    if col.typname == "oid":
        return pa.int64()  # selected as int8 (select_expr)
    return None if col.elem else _adbc_scalars().get(col.typname)


def arrow_to_pg(field: Any) -> str:
    """The PostgreSQL type ``create`` gives an Arrow field."""
    import pyarrow as pa
    import pyarrow.types as t

    typ = field.type
    if isinstance(typ, pa.BaseExtensionType):
        name = typ.extension_name
        if name == "arrow.uuid":
            return "uuid"
        if name == "arrow.json":
            return "json"  # its text as it is (jsonb would reorder keys, drop duplicates, respell numbers)
        typ = typ.storage_type
    if t.is_dictionary(typ):
        typ = typ.value_type
    simple = [
        (t.is_boolean, "boolean"), (t.is_int8, "smallint"), (t.is_int16, "smallint"), (t.is_int32, "integer"),
        (t.is_int64, "bigint"), (t.is_uint8, "smallint"), (t.is_uint16, "integer"), (t.is_uint32, "bigint"),
        (t.is_uint64, "numeric(20,0)"), (t.is_float16, "real"), (t.is_float32, "real"), (t.is_float64, "double precision"),
        (t.is_string, "text"), (t.is_large_string, "text"), (t.is_binary, "bytea"), (t.is_large_binary, "bytea"),
        (t.is_fixed_size_binary, "bytea"), (t.is_date, "date"), (t.is_time, "time"), (t.is_null, "text"),
        (t.is_interval, "interval"), (t.is_duration, "interval"),
    ]
    if hasattr(t, "is_string_view") and (t.is_string_view(typ) or t.is_binary_view(typ)):
        return "text" if t.is_string_view(typ) else "bytea"
    for test, pg in simple:
        if test(typ):
            return pg
    if t.is_timestamp(typ):
        return "timestamp with time zone" if typ.tz else "timestamp without time zone"
    if t.is_decimal(typ):
        return f"numeric({typ.precision},{typ.scale})"
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ):
        inner = arrow_to_pg(typ.value_field)
        return f"{inner}[]"
    raise SchemaError(
        f"column {field.name}: Arrow type {typ} has no PostgreSQL mapping",
        hint="cast it in the source (e.g. to text or JSON) or create the target table yourself",
    )


def column_ddl(field: Any, source_col: PgColumn | None) -> str:
    """One column of a CREATE TABLE: the source's own type (and collation) when it is built in (a base type, a range or a
    multirange: their values travel as PostgreSQL reads and writes them), else mapped."""
    return source_column_ddl(source_col) or arrow_to_pg(field)


def source_column_ddl(source_col: PgColumn | None) -> str | None:
    """:func:`column_ddl` of a column whose type is the source's own; None where the Arrow field's type decides."""
    if source_col is None:
        return None
    collate = f" COLLATE {source_col.collation}" if source_col.collation else ""
    if source_col.type_oid < USER_OID_START and source_col.typtype in ("b", "r", "m"):
        return source_col.type_sql + collate
    if source_col.typtype == "d" and source_col.base_sql:
        return source_col.base_sql + collate
    return None


def text_length_limit(source: PgColumn | None, target: PgColumn) -> int | None:
    """n, for a ``varchar(n)`` / ``char(n)`` target that the source's own type does not bound to n
    characters; None where no value can be longer than n.

    PostgreSQL refuses a longer value, except one whose excess characters are all spaces: those it
    cuts off without a word (``'abc  '`` into varchar(3) is stored as ``'abc'``). So such a column's
    values are checked before they reach it (a char(m) source's values are read with their padding:
    they count at m characters)."""
    if target.typname not in ("varchar", "bpchar") or target.typmod < 0:
        return None
    if source is not None and source.typname in ("varchar", "bpchar") and 0 <= source.typmod <= target.typmod:
        return None
    return target.typmod - 4
