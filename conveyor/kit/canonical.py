"""The canonical Arrow form ``conveyor verify`` hashes rows in: the same values give the same Arrow type and the
same bits whatever engine read them (integers as int64, floats as float64, decimals at one scale, timestamps as
UTC microseconds, one string and one binary layout, a uuid as its text where the other side has text, a bool as
1 / 0 where the other side has integers). Column-wise: never a loop over rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.errors import SchemaError


def canonical_types(source: Any, target: Any, columns: list[tuple[str, str]]) -> list[Any]:
    """The Arrow type both sides' values of each column are hashed in (refused by name where none is)."""
    import pyarrow as pa

    out = []
    for s, t in columns:
        a, b = source.field(s).type, target.field(t).type
        common = _canon(a, b)
        if common is None:
            raise SchemaError(f"conveyor verify: column {s} cannot be compared: {a} on the source, {b} on the target",
                              hint="cast one side in source.query to the other's type")
        out.append(common)
    return out if out else [pa.int64()]


@dataclass(frozen=True)
class TimeText:
    """A time of day on one side, its text on the other (MySQL's TIME is read as text: it spans +/-838 hours): both
    hashed as ``HH:MM:SS.ffffff`` (a time at microseconds, the text with its fraction written out to six digits)."""

    def __str__(self) -> str:
        return "time as HH:MM:SS.ffffff text"


@dataclass(frozen=True)
class TextAs:
    """A decimal, a timestamp or a date on one side, its text on the other (SQLite keeps them as text): the text is read as
    ``type`` (a timestamp's text without an offset as UTC's wall clock) and both hashed as that; text that is no such
    value is hashed as it is, and differs."""

    type: Any

    def __str__(self) -> str:
        return f"{self.type} (the text side read as it)"


def _is_uuid(typ: Any) -> bool:
    return getattr(typ, "extension_name", "") == "arrow.uuid"


def _canon(a: Any, b: Any) -> Any:
    import pyarrow as pa
    import pyarrow.types as t

    text = (t.is_string, t.is_large_string, t.is_string_view)
    if (_is_uuid(a) and any(f(b) for f in text)) or (_is_uuid(b) and any(f(a) for f in text)):
        return pa.string()  # a uuid on one side, its text on the other (DuckDB exports UUID as text): compared as text
    if isinstance(a, pa.BaseExtensionType):
        a = a.storage_type
    if isinstance(b, pa.BaseExtensionType):
        b = b.storage_type
    if (t.is_time(a) and any(f(b) for f in text)) or (t.is_time(b) and any(f(a) for f in text)):
        return TimeText()
    for typed, other in ((a, b), (b, a)):
        if (t.is_decimal(typed) or t.is_timestamp(typed) or t.is_date(typed)) and any(f(other) for f in text):
            return TextAs(_canon(typed, typed))
    raw = (t.is_binary, t.is_large_binary, t.is_fixed_size_binary)
    if (any(f(a) for f in raw) and any(f(b) for f in text)) or (any(f(b) for f in raw) and any(f(a) for f in text)):
        return pa.binary()  # bytes on one side, a text column holding them on the other (ClickHouse's String): their bytes
    if t.is_integer(a) and t.is_integer(b):
        return pa.int64()
    if (t.is_boolean(a) and t.is_integer(b)) or (t.is_integer(a) and t.is_boolean(b)):
        return pa.int64()  # MySQL's BOOLEAN is a TINYINT: true / false against 1 / 0
    if t.is_floating(a) and t.is_floating(b):
        return pa.float64()
    if t.is_decimal(a) and t.is_decimal(b):
        scale = max(a.scale, b.scale)
        whole = max(a.precision - a.scale, b.precision - b.scale)
        return pa.decimal128(whole + scale, scale) if whole + scale <= 38 else pa.decimal256(min(whole + scale, 76), scale)
    if any(f(a) for f in text) and any(f(b) for f in text):
        return pa.string()
    if any(f(a) for f in raw) and any(f(b) for f in raw):
        return pa.binary()
    if t.is_timestamp(a) and t.is_timestamp(b):
        return pa.timestamp("us", tz="UTC")
    if t.is_date(a) and t.is_date(b):
        return pa.date32()
    if t.is_time(a) and t.is_time(b):
        return pa.time64("us")
    if t.is_boolean(a) and t.is_boolean(b):
        return pa.bool_()
    if (t.is_list(a) or t.is_large_list(a)) and (t.is_list(b) or t.is_large_list(b)):
        inner = _canon(a.value_type, b.value_type)
        return None if inner is None else pa.list_(inner)
    return a if a == b else None


def canonical(arr: Any, typ: Any, zero: str) -> Any:
    """A column as ``typ`` (the same values); floats as their bits where -0.0 and 0.0 are told apart."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(typ, TimeText):
        return _time_text(arr)
    if isinstance(typ, TextAs):
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
            return _text_as(arr, typ.type)
        typ = typ.type
    if _is_uuid(arr.type) and pa.types.is_string(typ):
        return _uuid_text(arr)
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if pa.types.is_timestamp(arr.type) and arr.type.tz is None:
        arr = arr.cast(pa.timestamp(arr.type.unit, tz="UTC"))  # a naive timestamp is read as UTC's wall clock
    if pa.types.is_list(typ) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        values = canonical(arr.values, typ.value_type, zero)
        return pa.ListArray.from_arrays(pa.array(arr.offsets, pa.int32()), values, mask=arr.is_null() if arr.null_count else None)
    if arr.type != typ:
        arr = arr.cast(typ)
    if pa.types.is_decimal256(typ):  # DuckDB holds 38 digits: a wider decimal is hashed as its exact text, at one scale
        arr = arr.cast(pa.string())
    if pa.types.is_floating(typ) and zero == "distinct":  # DuckDB's hash makes -0.0 and 0.0 one: hash the bits (one NaN)
        arr = pc.if_else(pc.is_nan(arr), pa.scalar(float("nan"), typ), arr).view(pa.int64())
    return arr


def _time_text(arr: Any) -> Any:
    """A time column, or a text column of times, as ``HH:MM:SS.ffffff`` text (column-wise)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_time(arr.type):
        return arr.cast(pa.time64("us")).cast(pa.string())
    text = arr.cast(pa.string())
    whole = pc.if_else(pc.match_substring(text, "."), text, pc.binary_join_element_wise(text, pa.scalar("."), ""))
    return pc.utf8_rpad(whole, width=15, padding="0")  # "12:00:00" and "12:00:00.5" as "12:00:00.000000", "12:00:00.500000"


def _text_as(arr: Any, typ: Any) -> Any:
    """A text column read as ``typ`` (column-wise; a timestamp's text without an offset as UTC); its text where some value is
    no such value."""
    import pyarrow as pa

    text = arr.cast(pa.string())
    tries = [pa.timestamp("us"), typ] if pa.types.is_timestamp(typ) else [typ]
    for first in tries:
        try:
            return canonical(text.cast(first), typ, "equal")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return text


def _uuid_text(arr: Any) -> Any:
    """uuids as their canonical text (lower-case hex, dashed), column-wise with numpy: Arrow has no hex kernel."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    raw = arr.storage
    n = len(raw)
    data = np.frombuffer(raw.buffers()[1], dtype=np.uint8)[raw.offset * 16:(raw.offset + n) * 16].reshape(n, 16)
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    hexed = np.empty((n, 32), dtype=np.uint8)
    hexed[:, 0::2], hexed[:, 1::2] = digits[data >> 4], digits[data & 15]
    dashed = np.full((n, 36), ord("-"), dtype=np.uint8)
    for start, end, at in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24)):  # 5 slices, not rows
        dashed[:, at:at + end - start] = hexed[:, start:end]
    text = pa.array(dashed.view("S36").ravel(), type=pa.binary()).cast(pa.string())
    return pc.if_else(raw.is_null(), pa.scalar(None, pa.string()), text) if raw.null_count else text
