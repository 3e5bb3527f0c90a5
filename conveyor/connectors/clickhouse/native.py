"""ClickHouse's Native format (a block of columns: each column's values contiguous) <-> Arrow arrays,
with numpy and Arrow compute only: no Python code per value.

A block is ``varint(columns) varint(rows)`` then, per column, its name, its type and its data:
fixed-width values back to back (little-endian); ``Nullable(T)`` one byte per row (1: NULL) then T's
data; ``Array(T)`` each row's end offset (UInt64) then every item's data; a ``String`` each value's
length (a varint) then its bytes. A String column is read with its lengths selected before it
(``length(s)``, a fixed-width column): they say where each varint and each value start, so the column
is cut apart with array operations. Writing builds the same layout from Arrow's offsets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from conveyor.connectors.clickhouse.types import DATE_MAX, DATETIME_MAX, FIXED, ChType, parse
from conveyor.errors import SchemaError, TransferError

#: a String column's lengths travel in a column of this name just before it
LENGTHS = "__conveyor_len_"
_UNIT = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


# --- reading ---------------------------------------------------------------------------------------


class Stream:
    """Exact reads from a byte stream (an HTTP response), in large reads."""

    def __init__(self, raw: Any, chunk: int = 4 << 20) -> None:
        self.raw, self.chunk = raw, chunk
        self.buf = b""
        self.pos = 0

    def _fill(self, n: int) -> bool:
        have = len(self.buf) - self.pos
        if have >= n:
            return True
        parts = [self.buf[self.pos:]]
        while have < n:
            more = self.raw.read(max(self.chunk, n - have))
            if not more:
                break
            parts.append(more)
            have += len(more)
        self.buf, self.pos = b"".join(parts), 0
        return have >= n

    def at_end(self) -> bool:
        return not self._fill(1)

    def peek(self, n: int) -> bytes:
        self._fill(n)
        return self.buf[self.pos:self.pos + n]

    def read(self, n: int) -> bytes:
        if not self._fill(n):
            raise TransferError("clickhouse: the server's reply ended in the middle of a block (connection lost?)", retriable=True)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.read(1)[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def string(self) -> str:
        return self.read(self.varint()).decode()


def blocks(stream: Stream, fields: list[Any]) -> Iterator[Any]:
    """Record batches (``fields``: the Arrow fields, in order, of the columns that are not lengths)."""
    import pyarrow as pa

    schema = pa.schema(fields)
    while not stream.at_end():
        if stream.peek(6) == b"Code: ":  # the server failed after the reply had started: its exception text follows
            stream._fill(1 << 16)
            raise TransferError("clickhouse: " + stream.buf[stream.pos:stream.pos + (1 << 16)].decode(errors="replace").strip())
        ncols, nrows = stream.varint(), stream.varint()
        arrays, lengths, at = [], None, 0
        for _ in range(ncols):
            name, ch = stream.string(), parse(stream.string())
            if name.startswith(LENGTHS):
                lengths = np.frombuffer(stream.read(nrows * 8), "<u8")
                continue
            field = fields[at]
            arrays.append(_read(stream, ch, nrows, field.type, lengths, field.name))
            lengths, at = None, at + 1
        if nrows:
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _validity(nulls: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.py_buffer(np.packbits(nulls == 0, bitorder="little")) if nulls.any() else None


def _read(stream: Stream, ch: ChType, n: int, typ: Any, lengths: np.ndarray | None, column: str) -> Any:
    import pyarrow as pa

    if ch.name == "Nullable":
        nulls = np.frombuffer(stream.read(n), "<u1")
        inner = _read(stream, ch.inner, n, typ, lengths, column)
        valid = _validity(nulls)
        if valid is None:
            return inner
        return pa.Array.from_buffers(inner.type, n, [valid, *inner.buffers()[1:]], offset=inner.offset) if not isinstance(
            inner, pa.ExtensionArray) else pa.ExtensionArray.from_storage(
            inner.type, pa.Array.from_buffers(inner.storage.type, n, [valid, *inner.storage.buffers()[1:]]))
    if ch.name == "String":
        return _read_strings(stream, n, typ, lengths, column)
    if ch.name == "Array":
        ends = np.frombuffer(stream.read(n * 8), "<u8").astype(np.int64)
        offsets = np.concatenate([[0], ends])
        items = _read(stream, ch.inner, int(offsets[-1]), typ.value_type, None, column)
        big = offsets[-1] > 2**31 - 1
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int64() if big else pa.int32()), items,
                                        type=pa.large_list(typ.value_field) if big else typ)
    width = ch.width
    data = np.frombuffer(stream.read(n * width), np.uint8)
    if ch.name in FIXED:
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(data)])
    if ch.name.startswith("Decimal"):
        ints = data.view(f"<i{width}") if width < 16 else None
        if ints is not None:
            wide = np.empty((n, 2), np.int64)
            wide[:, 0] = ints
            wide[:, 1] = ints >> 63 if width == 8 else (ints.astype(np.int64) >> 63)
            data = wide.view(np.uint8).reshape(-1)
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(data)])
    if ch.name == "Date":
        return pa.Array.from_buffers(pa.date32(), n, [None, pa.py_buffer(data.view("<u2").astype(np.int32))])
    if ch.name == "DateTime":
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(data.view("<u4").astype(np.int64))])
    if ch.name == "UUID":  # two little-endian 64-bit halves: each half's bytes reversed give the UUID's 16 bytes
        raw = np.ascontiguousarray(data.reshape(n, 2, 8)[:, :, ::-1]).reshape(-1)
        return pa.ExtensionArray.from_storage(pa.uuid(), pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(raw)]))
    if ch.name == "FixedString":
        return pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)])
    raise SchemaError(f"clickhouse column {column}: {ch.text} cannot be read")


def _varint_sizes(lengths: np.ndarray) -> np.ndarray:
    """Bytes of each length's varint (7 bits a byte)."""
    sizes = np.ones(len(lengths), np.int64)
    top = int(lengths.max()) if len(lengths) else 0
    bits = 7
    while bits < 64 and top >= (1 << bits):  # only as many passes as the longest value needs (usually none)
        sizes += lengths >= (1 << bits)
        bits += 7
    return sizes


def _read_strings(stream: Stream, n: int, typ: Any, lengths: np.ndarray | None, column: str) -> Any:
    import pyarrow as pa

    if lengths is None:
        raise TransferError(f"clickhouse column {column}: a String column arrived without its lengths (internal error)")
    lens = lengths.astype(np.int64)
    sizes = _varint_sizes(lens)
    raw = np.frombuffer(stream.read(int(sizes.sum() + lens.sum())), np.uint8)
    starts = np.cumsum(sizes + lens) - (sizes + lens)  # where each value's varint starts
    keep = np.ones(len(raw), bool)
    for k in range(int(sizes.max()) if n else 0):  # the varints' bytes out: what is left is the values, back to back
        keep[starts[sizes > k] + k] = False
    data = raw[keep]
    offsets = np.concatenate([[0], np.cumsum(lens)])
    big = offsets[-1] > 2**31 - 1
    binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
    kind = (pa.large_binary() if big else pa.binary()) if binary else (pa.large_string() if big else pa.string())
    arr = pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets.astype(np.int64 if big else np.int32)), pa.py_buffer(data)])
    if not binary:
        try:
            arr.validate(full=True)  # UTF-8, in C++
        except pa.ArrowInvalid:
            raise TransferError(f"clickhouse column {column} (String) holds bytes that are not UTF-8 text",
                                hint=f"read it as bytes with source.binary_columns=[{column}]") from None
    return arr


# --- writing ---------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return _varint(len(raw)) + raw


def encode_block(batch: Any, columns: list[tuple[str, ChType]]) -> bytes:
    """One Native block of ``batch``'s columns, written into the target's (name, type) ``columns``."""
    parts = [_varint(len(columns)), _varint(batch.num_rows)]
    for arr, (name, ch) in zip(batch.columns, columns):
        parts += [_string(name), _string(ch.text)]
        parts += _write(arr, ch, name)
    return b"".join(parts)


def _refuse(column: str, ch: ChType, what: str, hint: str = "") -> TransferError:
    return TransferError(f"clickhouse column {column} ({ch.text}) cannot hold {what}",
                         hint=hint or "filter or convert those values in source.query, or change the target's type")


def _write(arr: Any, ch: ChType, column: str) -> list[bytes]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):  # views: the offsets layout, large enough
        arr = arr.cast(pa.large_string() if pa.types.is_string_view(arr.type) else pa.large_binary())
    n = len(arr)
    if ch.name == "Nullable":
        nulls = np.asarray(arr.is_null(), dtype=np.uint8) if arr.null_count else np.zeros(n, np.uint8)
        return [nulls.tobytes(), *_write(_filled(arr), ch.inner, column)]
    if arr.null_count and ch.name != "Nullable":
        raise _refuse(column, ch, "a NULL (it is not Nullable)", "fill the NULLs in source.query, or make the column Nullable")
    if ch.name == "String":
        return [_strings(arr, column, ch)]
    if ch.name == "Array":
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise _refuse(column, ch, f"a {arr.type} value")
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if pa.types.is_large_list(arr.type) else np.int32)[arr.offset:arr.offset + n + 1]
        base = int(offsets[0]) if n else 0
        items = arr.values.slice(base, int(offsets[-1]) - base if n else 0)
        return [(offsets[1:] - base).astype("<u8").tobytes(), *_write(items, ch.inner, column)]
    if ch.name in FIXED:
        target = getattr(pa, FIXED[ch.name][1])()
        if pa.types.is_boolean(arr.type):
            arr = arr.cast(pa.uint8())
        arr = _cast(arr.fill_null(0) if arr.null_count else arr, target, column, ch)
        return [np.asarray(arr.to_numpy(zero_copy_only=False), dtype=FIXED[ch.name][0]).tobytes()]
    if ch.name.startswith("Decimal"):
        p, s = ch.decimal
        if not pa.types.is_decimal(arr.type) or arr.type.scale != s or arr.type.precision > p:
            arr = _cast(arr, pa.decimal128(max(p, 1), s), column, ch)
        arr = _filled(arr)
        wide = np.frombuffer(arr.buffers()[1], np.int64)[2 * arr.offset:2 * (arr.offset + n)].reshape(n, 2)
        width = ch.width
        return [wide.tobytes() if width == 16 else wide[:, 0].astype(f"<i{width}").tobytes()]
    if ch.name == "Date":
        if not pa.types.is_date32(arr.type):
            arr = _cast(arr, pa.date32(), column, ch)
        days = np.asarray(arr.fill_null(0).cast(pa.int32()).to_numpy(zero_copy_only=False), np.int64)
        bad = (days < 0) | (days > DATE_MAX)
        if bad.any():
            raise _refuse(column, ch, f"the date {arr[int(np.argmax(bad))]} (a Date holds 1970-01-01 to 2149-06-06)")
        return [days.astype("<u2").tobytes()]
    if ch.name == "DateTime":
        if not pa.types.is_timestamp(arr.type):
            raise _refuse(column, ch, f"a {arr.type} value")
        ticks = np.asarray(arr.fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
        unit = _UNIT[arr.type.unit]
        frac = ticks % unit != 0
        if frac.any():
            raise _refuse(column, ch, f"the fraction of a second in {arr[int(np.argmax(frac))]} (ClickHouse 18.16's DateTime holds "
                                      "whole seconds)", "truncate it with date_trunc('second', ...) in source.query, or load it as text")
        secs = ticks // unit
        bad = (secs < 0) | (secs > DATETIME_MAX)
        if bad.any():
            raise _refuse(column, ch, f"the time {arr[int(np.argmax(bad))]} (a DateTime holds 1970-01-01 to 2106-02-07 UTC)")
        return [secs.astype("<u4").tobytes()]
    if ch.name in ("UUID", "FixedString"):
        width = ch.width
        if not (pa.types.is_fixed_size_binary(arr.type) and arr.type.byte_width == width):
            raise _refuse(column, ch, f"a {arr.type} value", f"its values must be exactly {width} bytes")
        raw = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * width:(arr.offset + n) * width]
        if ch.name == "UUID":
            raw = np.ascontiguousarray(raw.reshape(n, 2, 8)[:, :, ::-1])
        return [raw.tobytes()]
    del pc
    raise _refuse(column, ch, "values Conveyor can write", "load into a column of another type (String, a number, Date, DateTime)")


def _filled(arr: Any) -> Any:
    """NULLs replaced by the type's zero (what a Nullable column's data holds under its null map)."""
    import pyarrow as pa

    if not arr.null_count:
        return arr
    typ = arr.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return arr.fill_null("")
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return arr.fill_null(b"")
    if pa.types.is_fixed_size_binary(typ):
        return arr.fill_null(pa.scalar(bytes(typ.byte_width), typ))
    if pa.types.is_boolean(typ):
        return arr.fill_null(False)
    if pa.types.is_decimal(typ):
        import decimal

        return arr.fill_null(pa.scalar(decimal.Decimal(0), typ))
    if pa.types.is_date(typ) or pa.types.is_timestamp(typ):
        return arr.fill_null(pa.scalar(0, pa.int32() if pa.types.is_date32(typ) else pa.int64()).cast(typ))
    return arr.fill_null(pa.scalar(0, typ))


def _cast(arr: Any, typ: Any, column: str, ch: ChType) -> Any:
    import pyarrow as pa

    if arr.type == typ:
        return arr
    try:
        return arr.cast(typ, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _refuse(column, ch, f"every {arr.type} value: {str(exc).splitlines()[0]}") from None


def _strings(arr: Any, column: str, ch: ChType) -> bytes:
    import pyarrow as pa

    typ = arr.type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
        raise _refuse(column, ch, f"a {typ} value", "convert it to text in source.query")
    n = len(arr)
    big = pa.types.is_large_string(typ) or pa.types.is_large_binary(typ)
    offsets = np.frombuffer(arr.buffers()[1], np.int64 if big else np.int32)[arr.offset:arr.offset + n + 1].astype(np.int64)
    if not n:
        return b""
    if arr.null_count:  # a NULL's slot may cover bytes: its length must be 0 (written as an empty string)
        arr = arr.fill_null("" if pa.types.is_string(typ) or pa.types.is_large_string(typ) else b"")
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if big else np.int32)[arr.offset:arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    lens = np.diff(offsets)
    sizes = _varint_sizes(lens)
    out = np.empty(int(sizes.sum() + lens.sum()), np.uint8)
    starts = np.cumsum(sizes + lens) - (sizes + lens)
    is_data = np.ones(len(out), bool)
    for k in range(int(sizes.max())):
        has = sizes > k
        at = starts[has] + k
        more = (sizes[has] > k + 1).astype(np.uint8) << 7
        out[at] = ((lens[has] >> (7 * k)) & 0x7F).astype(np.uint8) | more
        is_data[at] = False
    out[is_data] = data
    return out.tobytes()
