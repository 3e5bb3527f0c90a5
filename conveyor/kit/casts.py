"""The cast policy: which source -> target column types move every value unchanged.

A column whose type differs between source and target is written only when every value keeps its
meaning exactly; anything else is refused in ``prepare``, before a row moves, with one line naming
the column and both types. The rules (``judge``), in short:

==========================================  ==========================================================
allowed                                     why it is exact
==========================================  ==========================================================
the same type (same PostgreSQL type name,   nothing changes (a value too large for numeric(p,s) is
same or wider typmod)                       still refused, by PostgreSQL; one too long for varchar(n)
                                            or char(n): below)
integer -> wider or narrower integer        checked per value: a value that does not fit is an error
integer -> float, numeric                   checked per value (Arrow refuses an integer a float
                                            cannot hold exactly)
float4 -> float8                            every float4 is a float8
numeric(p,s) -> numeric(q,t), t >= s        no digit is dropped (precision checked per value)
numeric(p,0) -> integer                     checked per value
any text type -> any text type              the characters are kept; into varchar(n) / char(n) a
                                            longer value is refused by name before PostgreSQL sees
                                            it (PostgreSQL would cut excess spaces without a word)
text -> json, jsonb, uuid, enum, xml        the text *is* the value's form; PostgreSQL refuses a bad one
a column read as PostgreSQL's text form     the same type on both sides (inet, money, ranges, ...)
of a type -> that type
date -> timestamp                           midnight, no time zone involved
timestamp, time: precision kept or finer    a coarser PostgreSQL target: each value is checked (one
                                            with more digits is refused by name: PostgreSQL would
                                            round it); other targets refuse a coarser one; a
                                            coarser Arrow unit is checked per value
interval -> interval with the same or more  interval(0), interval YEAR TO MONTH, ... into a target
fields and digits                           that keeps fewer would truncate or round: refused
==========================================  ==========================================================

Everything else is refused: date/timestamp <-> integer, bool <-> integer, float -> integer or
numeric, float8 -> float4, numeric scale reduction, timestamp <-> timestamptz (a naive value has
no time zone: PostgreSQL would read it in the session's TimeZone), text -> numbers, dates, times,
booleans, bytea, inet, ... (parsing), anything -> text (formatting). ``sink.allow_cast`` names
columns the user wants converted anyway: they are cast by PostgreSQL itself, by its own rules
(the session TimeZone for timestamp <-> timestamptz), and the plan says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import SchemaError

# a string column that holds PostgreSQL's text form of a type (set by the PostgreSQL source, kept by Parquet)
TEXT_OF = b"conveyor.postgres_type"
# a decimal column read from text whose values were written with different numbers of decimals (set by the CSV source)
SCALES = b"conveyor.decimal_scales"

_INT = {"int2", "int4", "int8", "oid"}
_TEXT = {"text", "varchar", "bpchar", "name", "char"}
_SAME_KIND = {"int2": "int", "int4": "int", "int8": "int", "oid": "int", "float4": "float", "float8": "float",
              "numeric": "decimal", "bool": "bool", "bytea": "binary", "date": "date", "time": "time",
              "timestamp": "timestamp", "timestamptz": "timestamptz", "interval": "interval", "uuid": "uuid",
              "json": "json", "jsonb": "json", **{t: "string" for t in _TEXT}}
_TEXT_FORMS = {"json", "uuid", "enum", "xml"}  # kinds a string is written into as it is
#: fractional-second digits of an Arrow time's or timestamp's unit
UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


@dataclass(frozen=True)
class ColumnType:
    """A column's type as both Arrow and, where known, the database see it."""

    arrow: Any
    db: str = ""  # PostgreSQL's type name (typname; 'enum:<name>' for enums), "" where unknown
    sql: str = ""  # as the database prints it: "numeric(10,2)", "timestamp(3) without time zone"
    typmod: int = -1
    as_text: bool = False  # values arrive as the text form of ``db`` (PostgreSQL types Arrow has no type for)
    #: a decimal read from text written with different numbers of decimals (``0.0``, ``1.25``): its one scale holds each
    #: as a number, not as written
    scales_varied: bool = False

    @classmethod
    def of_field(cls, field: Any) -> ColumnType:
        """A source column as its Arrow field says: its type, or the PostgreSQL type whose text it holds."""
        pg = text_of(field)
        return cls(field.type, db=pg, sql=pg, as_text=bool(pg), scales_varied=(field.metadata or {}).get(SCALES) == b"varied")

    @property
    def shown(self) -> str:
        return self.sql or str(self.arrow)

    @property
    def kind(self) -> str:
        if self.db:
            if self.db.startswith("enum:"):
                return "enum"
            if self.db.startswith("_"):
                return "list"
            return _SAME_KIND.get(self.db, "other:" + self.db)
        return arrow_kind(self.arrow)

    @property
    def digits(self) -> int | None:
        """Fractional digits kept: numeric scale, precision of time/timestamp; None: no limit of
        its own (a PostgreSQL time/timestamp without a precision, an unconstrained numeric)."""
        if self.kind == "decimal":
            if self.db == "numeric":
                return None if self.typmod < 0 else (self.typmod - 4) & 0xFFFF
            import pyarrow as pa

            typ = _plain(self.arrow)
            return typ.scale if pa.types.is_decimal(typ) else None
        if self.db:
            return self.typmod if self.typmod >= 0 else None
        return UNIT_DIGITS.get(getattr(_plain(self.arrow), "unit", ""), None)


def _plain(typ: Any) -> Any:
    import pyarrow as pa

    return typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ


def arrow_kind(typ: Any) -> str:
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(typ, pa.BaseExtensionType):
        if typ.extension_name == "arrow.uuid":
            return "uuid"
        if typ.extension_name == "arrow.json":
            return "json"
        typ = typ.storage_type
    if t.is_dictionary(typ):
        typ = typ.value_type
    tests = [(t.is_boolean, "bool"), (t.is_integer, "int"), (t.is_floating, "float"), (t.is_decimal, "decimal"),
             (t.is_date, "date"), (t.is_time, "time"), (t.is_interval, "interval"), (t.is_duration, "interval"),
             (t.is_null, "null")]
    for test, kind in tests:
        if test(typ):
            return kind
    if t.is_timestamp(typ):
        return "timestamptz" if typ.tz else "timestamp"
    if t.is_string(typ) or t.is_large_string(typ) or (hasattr(t, "is_string_view") and t.is_string_view(typ)):
        return "string"
    if t.is_fixed_size_binary(typ) and typ.byte_width == 16:
        return "binary16"
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_fixed_size_binary(typ) or (hasattr(t, "is_binary_view") and t.is_binary_view(typ)):
        return "binary"
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ):
        return "list"
    return "other:" + str(typ)


def text_of(field: Any) -> str:
    """The PostgreSQL type whose text form a string field holds ('' where it is plain text)."""
    meta = field.metadata or {}
    return meta.get(TEXT_OF, b"").decode()


def _float_bits(ct: ColumnType) -> int:
    import pyarrow as pa

    if ct.db in ("float4", "float8"):
        return 32 if ct.db == "float4" else 64
    typ = _plain(ct.arrow)
    return typ.bit_width if pa.types.is_floating(typ) else 64


def _judge_interval(src: int, tgt: int) -> str | None:
    """interval typmods: the fields kept (YEAR TO MONTH, DAY, ...) in the upper 16 bits, the
    fractional-second digits in the lower (0xFFFF: all); -1 is both in full."""
    full = (0x7FFF << 16) | 0xFFFF
    s, t = full if src < 0 else src, full if tgt < 0 else tgt
    s_fields, t_fields, s_digits, t_digits = s >> 16, t >> 16, s & 0xFFFF, t & 0xFFFF
    if s_fields & ~t_fields:
        return "the target interval keeps fewer fields (e.g. YEAR TO MONTH drops days and time): values would be truncated"
    if t_digits != 0xFFFF and (s_digits == 0xFFFF or s_digits > t_digits):
        return (f"the target keeps fewer digits (fractional seconds {t_digits} < "
                f"{'6' if s_digits == 0xFFFF else s_digits}): values would be rounded")
    return None


def judge(src: ColumnType, tgt: ColumnType, fractions_checked: bool = False) -> str | None:
    """None where every value keeps its meaning on the way from ``src`` to ``tgt``; else why not. ``fractions_checked``:
    the sink checks each time's or timestamp's value against a target that keeps fewer fractional digits (a value
    that has more is refused by name), so the types alone do not refuse it."""
    sk, tk = src.kind, tgt.kind
    if src.as_text and tk == "string":
        return None  # already text: the characters are kept
    if sk == "interval" and tgt.db == "interval" and tgt.typmod >= 0 and src.typmod != tgt.typmod:
        return _judge_interval(src.typmod if src.db == "interval" else -1, tgt.typmod)
    if src.db and src.db == tgt.db and sk not in ("decimal", "time", "timestamp", "timestamptz"):
        return None  # the same PostgreSQL type (text, enum, inet, arrays of one type, ...)
    if sk == "null":
        return None  # no values at all
    if sk == tk:
        if sk in ("decimal", "time", "timestamp", "timestamptz"):
            # the source's own digits (a PostgreSQL timestamp keeps 6); a finer Arrow unit than the
            # target's is checked value by value by the cast, a coarser target typmod would round
            s, t = src.digits, tgt.digits
            if sk == "decimal" and t is None and src.scales_varied:  # a numeric without a scale stores the one it is given
                return (f"the file writes its numbers with different numbers of decimals (0.0 beside 1.25): the target keeps "
                        f"each value's own, and they would all arrive with {s}")
            if s is None and sk != "decimal":
                s = 6
            if t is not None and (s is None or s > t) and fractions_checked and sk != "decimal":
                return None  # each value is checked (fraction_limits / arrowutil.fraction_checked)
            if t is not None and (s is None or s > t):
                what = "scale" if sk == "decimal" else "fractional seconds"
                return f"the target keeps fewer digits ({what} {t} < {'unlimited' if s is None else s}): values would be rounded"
            return None
        if sk == "float" and _float_bits(src) > _float_bits(tgt):
            return "float8 -> float4 rounds most values"
        if sk == "list":
            return _judge_items(src, tgt)
        if sk.startswith("other:") or sk == "enum":
            return None if src.db == tgt.db or not src.db or not tgt.db else "different types"
        return None
    if sk == "int" and tk in ("float", "decimal"):
        return None
    if sk == "decimal" and tk == "int":
        return None if src.digits == 0 else "a fraction would be dropped"
    if sk == "string" and tk in _TEXT_FORMS:
        return None
    if sk == "binary16" and tk in ("uuid", "binary"):
        return None
    if sk in ("binary", "binary16") and tk == "binary":
        return None
    if sk == "date" and tk == "timestamp":
        return None
    if {sk, tk} == {"timestamp", "timestamptz"}:
        return ("a timestamp without time zone has none: the target would read it in its session's time zone"
                if sk == "timestamp" else "the time zone would be dropped")
    if sk in ("json", "enum") and tk == "string":
        return None  # a JSON document's text is the document, an enum's is its label
    if sk == "string":
        return "the text would be parsed"
    if tk == "string":
        return "the values would be formatted as text"
    return "the values would change meaning"


def _judge_items(src: ColumnType, tgt: ColumnType) -> str | None:
    si, ti = _item(src), _item(tgt)
    if si is None or ti is None:
        return "different array types"
    why = judge(si, ti)
    return None if why is None else f"array items: {why}"


def _item(ct: ColumnType) -> ColumnType | None:
    import pyarrow as pa

    typ = _plain(ct.arrow) if ct.arrow is not None else None
    value = typ.value_type if typ is not None and (pa.types.is_list(typ) or pa.types.is_large_list(typ)) else None
    if ct.db.startswith("_"):
        return ColumnType(value, db=ct.db[1:], as_text=ct.as_text)
    return ColumnType(value) if value is not None else None


def check_casts(pairs: Sequence[tuple[str, str]], sources: Sequence[ColumnType], targets: Sequence[ColumnType],
                where: str, allowed: Sequence[str] = (), engine: str = "PostgreSQL", note: str = "",
                fractions_checked: bool = False) -> list[str]:
    """Refuse, naming every such column, the pairs whose values would change; returns the target
    columns the user allowed to be cast anyway (``sink.allow_cast``), which the target's ``engine``
    then casts by its own rules (``note``: what those rules do with a time zone, where it matters).
    ``fractions_checked``: see :func:`judge`."""
    allow_all = "*" in allowed
    refused, forced = [], []
    for (s, t), st, tt in zip(pairs, sources, targets):
        why = judge(st, tt, fractions_checked)
        if why is None:
            continue
        if allow_all or s in allowed or t in allowed:
            forced.append(t)
            continue
        refused.append((s, st, f"column {s} ({st.shown} -> {tt.shown}): {why}"))
    if refused:
        more = f" (and {len(refused) - 1} more: {'; '.join(r for _, _, r in refused[1:])})" if len(refused) > 1 else ""
        names = ",".join(_override_item(s) for s, _, _ in refused)
        name, first, why = refused[0]
        if first.scales_varied and first.kind == "decimal":  # the decimal already holds one scale: a cast of it keeps that
            hint = (f"read the column as text, which {engine} then reads value by value as written: source.column_types="
                    f"{{{_override_item(name)}: string}} sink.allow_cast=[{_override_item(name)}]; or give the "
                    "target column a scale of its own (numeric(p,s))")
        else:
            hint = (f"cast it in source.query, change the target column's type, or let {engine} cast it by its own rules with "
                    f"sink.allow_cast=[{names}]" + (f" ({note})" if note and any("zone" in r for _, _, r in refused) else ""))
        raise SchemaError(f"{where}: {why}{more}", hint=hint)
    return forced


def _override_item(name: str) -> str:
    """A column name as an item of a command-line list override: quoted unless a plain identifier."""
    import re

    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"
