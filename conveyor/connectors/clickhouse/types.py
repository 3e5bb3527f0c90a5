"""ClickHouse column types and their Arrow types, both ways.

=============================  ==========================  ========================================
ClickHouse                     Arrow (read)                Arrow written as (create)
=============================  ==========================  ========================================
Int8..Int64, UInt8..UInt64     int8..int64, uint8..uint64  the same width and sign
Float32, Float64               float32, float64            the same (NaN and infinities kept)
Decimal(P, S) (P <= 38)        decimal128(P, S)            decimal128(P, S); decimal256: refused
String                         string (UTF-8 checked;      string, large_string, binary
                               ``source.binary_columns``:
                               binary)
FixedString(N)                 fixed_size_binary(N)        fixed_size_binary(N)
UUID                           arrow.uuid                  arrow.uuid
Date                           date32                      date32 (1970-01-01..2149-06-06, else refused)
DateTime, DateTime('tz')       timestamp[s, tz] (the       timestamp with a zone: DateTime('zone');
                               server's zone if none)      without: DateTime('UTC'); whole seconds
                                                           in 1970..2106 only, else refused by name
Nullable(T)                    T, nullable                 a nullable field (not in the sorting key)
Array(T)                       list<T>                     list<T> (a NULL list is refused)
LowCardinality(T)              T                           --
Enum8, Enum16                  string (the name)           --
bool                           --                          UInt8 (0 / 1; read back as uint8)
=============================  ==========================  ========================================

Anything else (Tuple, Nested, AggregateFunction, Array(String), time of day, intervals, maps,
structs) is refused by name, before a row moves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from conveyor.errors import SchemaError

#: fixed-width types: (numpy dtype, Arrow type name)
FIXED = {"Int8": ("<i1", "int8"), "Int16": ("<i2", "int16"), "Int32": ("<i4", "int32"), "Int64": ("<i8", "int64"),
         "UInt8": ("<u1", "uint8"), "UInt16": ("<u2", "uint16"), "UInt32": ("<u4", "uint32"), "UInt64": ("<u8", "uint64"),
         "Float32": ("<f4", "float32"), "Float64": ("<f8", "float64")}
#: the most days a Date holds (UInt16 days since 1970-01-01)
DATE_MAX = 65535
DATETIME_MAX = 2**32 - 1


@dataclass(frozen=True)
class ChType:
    """A ClickHouse type as its text says: ``name``, its arguments (inner types parsed), the text itself."""

    name: str
    args: tuple[Any, ...] = ()
    text: str = ""

    @property
    def inner(self) -> ChType:
        return self.args[0]

    @property
    def decimal(self) -> tuple[int, int]:
        """(precision, scale) of a Decimal."""
        if self.name == "Decimal":
            return int(self.args[0]), int(self.args[1])
        return {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38}[self.name], int(self.args[0])

    @property
    def width(self) -> int:
        """Bytes per value of a fixed-width type (0: not fixed-width)."""
        if self.name in FIXED:
            return int(FIXED[self.name][0][2:])
        if self.name.startswith("Decimal"):
            p = self.decimal[0]
            return 4 if p <= 9 else 8 if p <= 18 else 16
        return {"Date": 2, "DateTime": 4, "UUID": 16}.get(self.name) or (int(self.args[0]) if self.name == "FixedString" else 0)


def parse(text: str) -> ChType:
    """A type's text (``Nullable(Decimal(15, 2))``, ``DateTime('Europe/Berlin')``) parsed."""
    text = text.strip()
    m = re.fullmatch(r"(\w+)\((.*)\)", text, re.S)
    if not m:
        return ChType(text, (), text)
    name, body = m.group(1), m.group(2)
    if name in ("Nullable", "Array", "LowCardinality"):
        return ChType(name, (parse(body),), text)
    if name == "DateTime":
        return ChType(name, (body.strip().strip("'"),), text)
    if name in ("Decimal", "Decimal32", "Decimal64", "Decimal128", "FixedString"):
        return ChType(name, tuple(int(a) for a in body.split(",")), text)
    return ChType(name, (body,), text)


def arrow_type(ch: ChType, server_zone: str, binary: bool = False) -> Any:
    """The Arrow type a column of ``ch`` is read as (see the module's table); None: refused (see :func:`refusal`)."""
    import pyarrow as pa

    name = ch.name
    if name in ("Nullable", "LowCardinality"):
        return arrow_type(ch.inner, server_zone, binary)
    if name in FIXED:
        return getattr(pa, FIXED[name][1])()
    if name.startswith("Decimal"):
        p, s = ch.decimal
        return pa.decimal128(p, s) if p <= 38 else None
    if name == "String":
        return pa.binary() if binary else pa.string()
    if name in ("Enum8", "Enum16"):
        return pa.string()
    if name == "FixedString":
        return pa.binary(int(ch.args[0]))
    if name == "UUID":
        return pa.uuid()
    if name == "Date":
        return pa.date32()
    if name == "DateTime":
        return pa.timestamp("s", tz=(ch.args[0] if ch.args else "") or server_zone)
    if name == "Array":
        item = ch.inner
        if item.name == "Nullable":
            item = item.inner
        if item.name in ("String", "LowCardinality", "Enum8", "Enum16"):
            return None  # variable-width items inside an array: not read (refused by name)
        inner = arrow_type(ch.inner, server_zone)
        return None if inner is None else pa.list_(pa.field("item", inner, nullable=ch.inner.name == "Nullable"))
    return None


def enum_names(ch: ChType) -> tuple[list[str], list[int]]:
    """An Enum's names and their codes, from its type's text."""
    pairs = re.findall(r"'((?:[^'\\]|\\.)*)'\s*=\s*(-?\d+)", ch.text)
    return [re.sub(r"\\(.)", r"\1", n) for n, _ in pairs], [int(v) for _, v in pairs]


def refusal(column: str, ch: ChType) -> SchemaError:
    return SchemaError(f"clickhouse column {column} ({ch.text}): Conveyor has no exact Arrow form for it",
                       hint="cast it in source.query (e.g. toString(...) or arrayStringConcat(...)), or leave the column out")


def nullable(ch: ChType) -> bool:
    return ch.name == "Nullable" or (ch.name == "LowCardinality" and ch.inner.name == "Nullable")


def created_type(field: Any, column: str, in_key: bool) -> str:
    """The ClickHouse type a load that creates its target gives an Arrow field (refused by name where none is exact)."""
    text = _created(field.type, column)
    if field.nullable and not in_key and not text.startswith("Array("):
        return f"Nullable({text})"
    return text


def _created(typ: Any, column: str) -> str:
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(typ, pa.BaseExtensionType):
        if typ.extension_name == "arrow.uuid":
            return "UUID"
        typ = typ.storage_type
    if t.is_dictionary(typ):
        typ = typ.value_type
    for name, (_, arrow_name) in FIXED.items():
        if typ == getattr(pa, arrow_name)():
            return name
    if t.is_boolean(typ):
        return "UInt8"
    if t.is_decimal128(typ):
        return f"Decimal({typ.precision}, {typ.scale})"
    if (t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ) or t.is_string_view(typ)
            or t.is_binary_view(typ)):
        return "String"
    if t.is_fixed_size_binary(typ):
        return f"FixedString({typ.byte_width})"
    if t.is_date32(typ):
        return "Date"
    if t.is_timestamp(typ):
        return f"DateTime('{_zone(typ.tz, column)}')"
    if t.is_list(typ) or t.is_large_list(typ):
        item = typ.value_field
        inner = _created(item.type, column)
        if inner == "String" or inner.startswith("Array("):
            raise SchemaError(f"clickhouse target column {column} ({typ}): Conveyor writes arrays of numbers, decimals, dates "
                              "and times only", hint="leave the column out, or turn it into text in source.query")
        return f"Array(Nullable({inner}))" if item.nullable else f"Array({inner})"
    raise SchemaError(f"clickhouse target column {column} ({typ}): ClickHouse 18.16 has no type that holds it exactly",
                      hint="cast it in source.query (a time of day or an interval to its text or a number), or leave the column out")


def _zone(tz: str | None, column: str) -> str:
    if not tz:
        return "UTC"  # a time without a zone is stored as that UTC time (read back as timestamp[s, UTC])
    if re.fullmatch(r"[+-]00:?00|Z", tz):
        return "UTC"
    if re.fullmatch(r"[+-]\d\d:?\d\d", tz):
        raise SchemaError(f"clickhouse target column {column} (timestamp, zone {tz}): ClickHouse names zones, not offsets",
                          hint="convert the column to UTC in source.query")
    return tz


def read_arrow(ch: ChType, server_zone: str) -> Any:
    """The Arrow type an existing target column reads as (for the cast policy); None where it has none."""
    return arrow_type(ch, server_zone)
