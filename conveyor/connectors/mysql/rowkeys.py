"""The keys of a binlog rows event, read straight from its bytes: the other columns' values are stepped over by
their stored size, never decoded (mysql-replication decodes every column of every row into Python values,
decimals and dates included: about 9,000 changes/s of lineitem; see benchmarks/results/). The event's table
map (its columns' types and metadata) comes from mysql-replication, which also reads the event's header and its
column bitmaps; the rows' bytes that follow are read here.

A row image is the columns-present bitmap's null bitmap, then each present, non-NULL column's value in the
server's storage format (MySQL's replication protocol, "binary row image"). Key values come out as what a
lookup's JSON array takes: integers as ints (signed or not as the table's column says: the table map of a server
that logs no row metadata does not), text as str, DECIMAL, DATE and DATETIME as their text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# MySQL's column type codes (pymysql.constants.FIELD_TYPE)
_FIXED = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 0, 7: 4, 8: 8, 9: 3, 10: 3, 11: 3, 12: 8, 13: 1, 14: 3}
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_PREFIXED = (249, 250, 251, 252, 255, 245)  # blobs, geometry, JSON: a length of length_size bytes
_VARCHAR = (15, 253, 254)  # VARCHAR, VAR_STRING, STRING: a length of 1 or 2 bytes
_TEMPORAL2 = {17: 4, 18: 5, 19: 3}  # TIMESTAMP2, DATETIME2, TIME2: whole part, then (fsp + 1) // 2 bytes


def _decimal_size(precision: int, decimals: int) -> int:
    integral = precision - decimals
    return (integral // 9) * 4 + _DIG2BYTES[integral % 9] + (decimals // 9) * 4 + _DIG2BYTES[decimals % 9]


def _step(column: Any) -> tuple[int, int]:
    """(kind, n): 0 = n bytes fixed; 1 = a length of n bytes, then that many."""
    t = column.type
    if t in _FIXED:
        return 0, _FIXED[t]
    if t in _TEMPORAL2:
        return 0, _TEMPORAL2[t] + (int(column.fsp) + 1) // 2
    if t == 246:
        return 0, _decimal_size(column.precision, column.decimals)
    if t in _VARCHAR:
        return 1, 2 if column.max_length > 255 else 1
    if t in _PREFIXED:
        return 1, int(column.length_size)
    if t in (247, 248):  # ENUM, SET
        return 0, int(column.size)
    if t == 16:  # BIT
        return 0, int(column.bytes)
    raise NotImplementedError(f"MySQL column type {t} in a binlog row")


def _decimal(raw: bytes, precision: int, decimals: int) -> str:
    """DECIMAL's binary form as its text (mysql-replication's reading of it)."""
    integral = precision - decimals
    data = bytearray(raw)
    negative = not data[0] & 0x80
    data[0] ^= 0x80
    if negative:
        data = bytearray(b ^ 0xFF for b in data)
    pos, parts = 0, []
    size = _DIG2BYTES[integral % 9]
    if size:
        parts.append(str(int.from_bytes(data[pos:pos + size], "big")))
        pos += size
    for _ in range(integral // 9):
        parts.append(f"{int.from_bytes(data[pos:pos + 4], 'big'):09d}")
        pos += 4
    whole = "".join(parts).lstrip("0") or "0"
    frac = []
    for _ in range(decimals // 9):
        frac.append(f"{int.from_bytes(data[pos:pos + 4], 'big'):09d}")
        pos += 4
    size = _DIG2BYTES[decimals % 9]
    if size:
        frac.append(f"{int.from_bytes(data[pos:pos + size], 'big'):0{decimals % 9}d}")
    text = whole + ("." + "".join(frac) if decimals else "")
    return ("-" + text) if negative else text


def _fraction(raw: bytes, fsp: int) -> str:
    if not fsp:
        return ""
    value = int.from_bytes(raw, "big")
    if fsp % 2:
        value //= 10
    return "." + f"{value:0{fsp}d}"


def _value(column: Any, raw: bytes, unsigned: bool) -> Any:
    t = column.type
    if t in (1, 2, 3, 8, 9):
        return int.from_bytes(raw, "little", signed=not unsigned)
    if t == 246:
        return _decimal(raw, column.precision, column.decimals)
    if t in _VARCHAR:
        return raw.decode("utf-8")
    if t in (10, 14):
        v = int.from_bytes(raw, "little")
        return f"{v >> 9:04d}-{(v >> 5) & 15:02d}-{v & 31:02d}"
    if t == 18:
        data = int.from_bytes(raw[:5], "big")
        ym = (data >> 22) & 0x1FFFF
        return (f"{ym // 13:04d}-{ym % 13:02d}-{(data >> 17) & 31:02d} {(data >> 12) & 31:02d}:{(data >> 6) & 63:02d}:{data & 63:02d}"
                + _fraction(raw[5:], int(column.fsp)))
    if t == 12:
        v = int.from_bytes(raw, "little")
        d, s = divmod(v, 1000000)
        return f"{d // 10000:04d}-{d // 100 % 100:02d}-{d % 100:02d} {s // 10000:02d}:{s // 100 % 100:02d}:{s % 100:02d}"
    raise NotImplementedError(f"MySQL column type {t} as a key")


def event_keys(event: Any, key_at: Sequence[int], unsigned: Sequence[bool], images: int) -> list[tuple[Any, ...]]:
    """The key of each row image of a rows event (``images``: 1 for a write or a delete, 2 for an update: its before
    and after image), read from the event's remaining bytes; the event's ``rows`` are not read after."""
    packet = event.packet
    data = packet.read(event.event_size - packet.read_bytes)
    columns = event.columns
    steps = [_step(c) for c in columns]
    bitmaps = [event.columns_present_bitmap] + ([event.columns_present_bitmap2] if images == 2 else [])
    present = [[bool(bitmap[i >> 3] & (1 << (i & 7))) for i in range(len(columns))] for bitmap in bitmaps]
    nulls = [(sum(p) + 7) // 8 for p in present]
    wanted = {i: n for n, i in enumerate(key_at)}
    out: list[tuple[Any, ...]] = []
    pos, end, image = 0, len(data), 0
    while pos < end:
        here, null_bytes = present[image], nulls[image]
        null = data[pos:pos + null_bytes]
        pos += null_bytes
        key: list[Any] = [None] * len(key_at)
        j = 0
        for i, (kind, n) in enumerate(steps):
            if not here[i]:
                continue
            if null[j >> 3] & (1 << (j & 7)):
                j += 1
                continue
            j += 1
            if kind:
                size = int.from_bytes(data[pos:pos + n], "little")
                start, pos = pos + n, pos + n + size
            else:
                start, pos = pos, pos + n
            if i in wanted:
                k = wanted[i]
                key[k] = _value(columns[i], data[start:pos], unsigned[k])
        out.append(tuple(key))
        image = (image + 1) % images
    return out


__all__ = ["event_keys"]
