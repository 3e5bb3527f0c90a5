"""Arrow types into Iceberg and Delta Lake tables: each source type is written as the Arrow type the format
stores it as exactly (a widening: uint32 as int64, a timestamp in ms as one in µs), or refused naming the column.

Batches are cast to the types chosen here with Arrow's safe cast (which refuses an overflow) before the
library writes them, so neither library's own conversion decides a value (deltalake writes a uint32 as an
int32 unchecked; pyiceberg writes int8 as int32)."""

from __future__ import annotations

from typing import Any

from conveyor.errors import SchemaError

#: a zone-aware timestamp is stored as its instant: read back in UTC (as PostgreSQL's timestamptz)
UTC = "UTC"


def written_type(typ: Any, fmt: str, column: str) -> Any:
    """The Arrow type a column of ``typ`` is written as into a ``fmt`` ("iceberg" / "delta") table."""
    import pyarrow as pa

    t = pa.types

    def refuse(why: str, hint: str = "cast it in the source (source.query), or leave the column out (columns)") -> SchemaError:
        return SchemaError(f"column {column} ({typ}): {why}", hint=hint)

    name = "Iceberg" if fmt == "iceberg" else "Delta Lake"
    if t.is_dictionary(typ):
        return written_type(typ.value_type, fmt, column)
    if isinstance(typ, pa.BaseExtensionType):
        if typ.extension_name == "arrow.uuid":
            if fmt == "iceberg":
                return pa.uuid()
            raise refuse("Delta Lake has no UUID type", hint="write it as text: cast it in the source (source.query), e.g. id::text")
        if typ.extension_name == "arrow.json":
            return pa.string()
        return written_type(typ.storage_type, fmt, column)
    if t.is_boolean(typ) or t.is_floating(typ) and not t.is_float16(typ):
        return typ
    if t.is_float16(typ):
        raise refuse(f"{name} has no half-precision float", hint="cast it to float in the source")
    if t.is_signed_integer(typ):
        return pa.int32() if fmt == "iceberg" and typ.bit_width < 32 else typ
    if t.is_unsigned_integer(typ):
        if typ.bit_width == 64:
            raise refuse(f"{name} has no unsigned 64-bit integer and its long cannot hold values above 2**63-1",
                         hint="cast it to decimal(20,0) in the source, or leave the column out (columns)")
        wider = {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[typ.bit_width]
        return pa.int32() if fmt == "iceberg" and typ.bit_width == 8 else wider
    if t.is_decimal(typ):
        if typ.precision > 38:
            raise refuse(f"{name}'s decimal holds at most 38 digits")
        return pa.decimal128(typ.precision, typ.scale)
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return pa.string() if fmt == "delta" else pa.large_string()
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ):
        return pa.binary() if fmt == "delta" else pa.large_binary()
    if t.is_fixed_size_binary(typ):
        return typ if fmt == "iceberg" else pa.binary()
    if t.is_date32(typ):
        return typ
    if t.is_date64(typ):
        return pa.date32()
    if t.is_time(typ):
        if fmt == "delta":
            raise refuse("Delta Lake has no time-of-day type", hint="cast it to text or an interval in seconds in the source")
        if typ.unit == "ns":
            raise refuse("Iceberg's time is in microseconds: nanoseconds would be cut")
        return pa.time64("us")
    if t.is_timestamp(typ):
        if typ.unit == "ns":
            raise refuse(f"{name} timestamps are in microseconds: nanoseconds would be cut",
                         hint="cast it to microseconds in the source if the nanoseconds are all zero")
        return pa.timestamp("us", UTC if typ.tz else None)
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ) or t.is_list_view(typ) or t.is_large_list_view(typ):
        inner = written_type(typ.value_type, fmt, f"{column}[]")
        return pa.large_list(pa.field("element", inner, typ.value_field.nullable)) if fmt == "iceberg" else \
            pa.list_(pa.field("element", inner, typ.value_field.nullable))
    if t.is_map(typ):
        key = written_type(typ.key_type, fmt, f"{column}.key")
        item = written_type(typ.item_type, fmt, f"{column}.value")
        return pa.map_(key, pa.field("value", item, typ.item_field.nullable))
    if t.is_struct(typ):
        return pa.struct([pa.field(f.name, written_type(f.type, fmt, f"{column}.{f.name}"), f.nullable) for f in typ])
    raise refuse(f"{name} has no type that holds it exactly")


def written_schema(schema: Any, fmt: str, names: list[str] | None = None) -> Any:
    """The schema batches are cast to before a ``fmt`` library writes them (``names``: the target's)."""
    import pyarrow as pa

    names = names or schema.names
    return pa.schema([pa.field(n, written_type(f.type, fmt, f.name), f.nullable) for n, f in zip(names, schema)])


def conform(batch: Any, schema: Any, where: str) -> Any:
    """A batch as ``schema`` (names and types): Arrow's safe cast, which refuses a value that would change."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema([pa.field(n, f.type) for n, f in zip(schema.names, batch.schema)]))
    if batch.schema.equals(schema, check_metadata=False):
        for name, column in zip(schema.names, batch.columns):
            _in_years(column, name, where)
        return batch
    arrays = []
    for name, column, field in zip(schema.names, batch.columns, schema):
        if not field.nullable and column.null_count:
            raise SchemaError(f"{where}: column {name} is required (NOT NULL) and the source has NULLs in it",
                              hint="leave those rows out (source.query), or load into a table whose column allows NULL")
        if column.type != field.type:
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(f"{where}: column {name} ({column.type}) cannot be written as {field.type} unchanged: "
                                  f"{str(exc).splitlines()[0]}", hint="cast it in the source (source.query)") from None
        _in_years(column, name, where)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


#: the first and last day (date32) and microsecond (timestamp[us]) of years 1 to 9999: the libraries turn each file's
#: lowest and highest value into Python dates for its statistics, and Python's dates hold no other year
_DAYS = (-719162, 2932896)
_MICROS = (-62135596800 * 10**6, 253402300800 * 10**6 - 1)


def _in_years(column: Any, name: str, where: str) -> None:
    """A date or timestamp before year 1 or after 9999 refused by name (deltalake failed with "Invalid isoformat string:
    '-0221-09-04'", pyiceberg without naming the column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = column.type
    if pa.types.is_date32(typ):
        low, high, ints = *_DAYS, column.view(pa.int32())
    elif pa.types.is_timestamp(typ) and typ.unit == "us":
        low, high, ints = *_MICROS, column.view(pa.int64())
    else:
        return
    bounds = pc.min_max(ints)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if lo is not None and (lo < low or hi > high):
        raise SchemaError(f"{where}: column {name} ({typ}) holds a value before year 1 or after year 9999, which the table "
                          "format's writer cannot write (it keeps each file's lowest and highest value as a date of years 1 to 9999)",
                          hint="leave those rows out or change them in the source (source.query)")


__all__ = ["written_type", "written_schema", "conform", "UTC"]
