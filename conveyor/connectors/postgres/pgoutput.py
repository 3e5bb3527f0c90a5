"""The keys in a batch of ``pgoutput`` messages (protocol version 1, text values), read column-wise.

A sync run needs, of each change, only its table and its key (an insert's or update's new key, an
update's old key where the key moved, a delete's key) and whether a table was truncated. The slot's
messages arrive as an Arrow binary array (a query through ADBC); this module walks every message of
the array at once, one step per column of the tuple (NumPy gathers over all messages: never a loop
over messages in Python), and hands back each table's keys as ``COPY ... FROM STDIN (FORMAT binary)``
rows of ``bytea`` columns: the values' bytes as pgoutput wrote them (in the decoding session's client
encoding), so no text is decoded, escaped or converted on the way; the server turns them back into the
key's own types. Keys whose columns are all integers are read as numbers here instead (PostgreSQL writes
an integer one way only), made distinct and ordered in this process, and written back as the lookups'
array literals (:attr:`TableKeys.ints`): no round trip through the server for them.

The message layouts are PostgreSQL's "Logical Replication Message Formats": ``I`` relid ``N``
TupleData; ``U`` relid [``K``|``O`` TupleData] ``N`` TupleData; ``D`` relid ``K``|``O`` TupleData;
``T`` count options relid...; TupleData is an Int16 column count, then per column a kind byte
(``n`` null, ``u`` unchanged TOASTed value, ``t`` text: an Int32 length and the bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

INSERT, UPDATE, DELETE, TRUNCATE = 73, 85, 68, 84
_TEXT, _OLD_KEY, _OLD_ROW = 116, 75, 79
#: what starts a binary COPY stream (signature, flags, header extension length) and ends it
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"


@dataclass
class TableKeys:
    """What the messages say of one table: its keys as binary COPY rows (without header), how many, how many
    changes carried no value for a key column, and whether it was truncated."""

    rows: list[bytes] = field(default_factory=list)
    #: the encoding the values' bytes are in (the decoding session's client encoding: pgoutput's text goes through it)
    encoding: str = "UTF8"
    count: int = 0
    uncarried: int = 0
    truncated: bool = False
    #: a table whose key columns are all integers (smallint, integer, bigint): the keys as numbers instead of ``rows``,
    #: each batch's key columns (pgoutput writes an integer one way only, so equal keys are equal numbers)
    ints: list[list[np.ndarray]] | None = None

    def distinct(self) -> list[np.ndarray]:
        """The distinct keys of an integer-keyed table (``ints``), in key order: one array per key column."""
        assert self.ints is not None
        if not self.ints:
            return []
        cols = [np.concatenate([batch[i] for batch in self.ints]) for i in range(len(self.ints[0]))]
        order = np.lexsort(cols[::-1])  # the first key column sorts first
        cols = [c[order] for c in cols]
        new = np.ones(len(order), dtype=bool)
        if len(order):
            new[1:] = np.logical_or.reduce([c[1:] != c[:-1] for c in cols])
        return [c[new] for c in cols]


def _int4(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian Int32 at each of ``at`` (int64 offsets into ``buf``)."""
    b = buf[at[:, None] + np.arange(4)].astype(np.int64)
    return (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]


def _walk(buf: np.ndarray, at: np.ndarray, columns: int, wanted: Sequence[int]) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], np.ndarray,
                                                                                         np.ndarray]:
    """Walk ``columns`` columns of the TupleData whose column count is at each of ``at``: (for each column of
    ``wanted``: where its bytes start and how many, -1 where it is not a text value), (the offset after the walked
    columns), (whether every wanted column was a text value)."""
    ncols = (buf[at].astype(np.int64) << 8) | buf[at + 1]
    if (ncols < columns).any():
        raise ValueError(f"a change carries {int(ncols.min())} columns where the table publishes {columns}")
    at = at + 2
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    carried = np.ones(len(at), dtype=bool)
    for i in range(columns):
        kind = buf[at]
        text = kind == _TEXT
        n = np.zeros(len(at), dtype=np.int64)
        if text.any():
            n[text] = _int4(buf, at[text] + 1)
        if i in wanted:
            out[i] = (at + 5, np.where(text, n, -1))
            carried &= text
        at = at + 1 + np.where(text, 4 + n, 0)
    return out, at, carried


def _copy_rows(buf: np.ndarray, values: Sequence[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Binary COPY rows (Int16 column count, then per column an Int32 length and the bytes) of ``values``: per column,
    where each row's bytes start in ``buf`` and how many."""
    rows = len(values[0][0])
    if not rows:
        return b""
    lens = [v[1] for v in values]
    size = 2 + sum(4 + n for n in lens)  # each row's bytes
    starts = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(size, out=starts[1:])
    out = np.empty(int(starts[-1]), dtype=np.uint8)
    row = starts[:-1]
    out[row] = 0
    out[row + 1] = len(values)
    at = row + 2
    for (first, n) in values:
        for k in range(4):
            out[at + k] = (n >> (24 - 8 * k)) & 0xFF
        at = at + 4
        total = int(n.sum())
        if total:
            # every byte of every value: its place in buf, and in out
            which = np.repeat(np.arange(rows), n)
            within = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
            out[at[which] + within] = buf[first[which] + within]
        at = at + n
    return out.tobytes()


def _ints(buf: np.ndarray, first: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The integers whose decimal text (an optional '-' and 1-19 digits, as PostgreSQL writes an integer) starts at each
    of ``first``, ``n`` bytes long: one step per digit over every value."""
    if not len(first):
        return np.zeros(0, dtype=np.int64)
    neg = (n > 0) & (buf[first] == 45)  # '-'
    at, digits = first + neg, n - neg
    if (digits < 1).any() or (digits > 19).any():
        raise ValueError("a value of an integer key column is not an integer's text")
    acc = np.zeros(len(first), dtype=np.uint64)  # the magnitude: -9223372036854775808's does not fit an int64
    for j in range(int(digits.max())):
        live = j < digits
        d = buf[at + np.where(live, j, 0)].astype(np.int64) - 48
        if ((d < 0) | (d > 9))[live].any():
            raise ValueError("a value of an integer key column is not an integer's text")
        acc = np.where(live, acc * np.uint64(10) + d.astype(np.uint64), acc)
    return np.where(neg, (~acc + np.uint64(1)).view(np.int64), acc.view(np.int64))


def _add(keys: TableKeys, buf: np.ndarray, values: dict[int, tuple[np.ndarray, np.ndarray]], carried: np.ndarray,
         positions: Sequence[int]) -> None:
    """The keys of the messages that carry them (``carried``) added to ``keys``: as COPY rows, or as numbers."""
    keys.uncarried += int((~carried).sum())
    keys.count += int(carried.sum())
    if keys.ints is not None:
        keys.ints.append([_ints(buf, values[p][0][carried], values[p][1][carried]) for p in positions])
    else:
        keys.rows.append(_copy_rows(buf, [(values[p][0][carried], values[p][1][carried]) for p in positions]))


_POWERS = np.array([10 ** k for k in range(1, 20)], dtype=np.uint64)


def decimal_list(values: np.ndarray) -> str:
    """Integers (int64) as PostgreSQL writes them, comma-separated ('1,-20,300'): one step per digit over every value."""
    if not len(values):
        return ""
    neg = values < 0
    mag = np.where(neg, ~values.view(np.uint64) + np.uint64(1), values.view(np.uint64))  # |-9223372036854775808| as well
    digits = np.searchsorted(_POWERS, mag, side="right") + 1
    size = neg + digits + 1  # each value's text and the comma after it
    ends = np.cumsum(size) - 2  # where each value's last digit goes
    out = np.full(int(ends[-1]) + 1, ord(","), dtype=np.uint8)
    out[(ends - digits + 1)[neg] - 1] = ord("-")
    for k in range(int(digits.max())):
        live = digits > k
        out[ends[live] - k] = (mag[live] // np.uint64(10 ** k) % np.uint64(10)).astype(np.uint8) + ord("0")
    return out.tobytes().decode("ascii")


def keys_of(batch: Any, tables: dict[int, tuple[Sequence[int], int, bool]], found: dict[int, TableKeys], encoding: str = "UTF8") -> int:
    """Add the keys that ``batch`` (an Arrow binary array of pgoutput messages) touched to ``found`` (by relid); how many
    of its messages are a row's change. ``tables``: each synced table's relid -> (its key columns' positions among the
    published columns, how many columns are published, whether every key column is an integer: its keys read as numbers,
    :attr:`TableKeys.ints`)."""
    import pyarrow as pa

    if not len(batch):
        return 0
    if batch.null_count:
        raise ValueError("a message is NULL")
    _, offsets, data = batch.buffers()
    wide = pa.types.is_large_binary(batch.type)
    starts = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[batch.offset:batch.offset + len(batch)].astype(np.int64)
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    kind = buf[starts]
    for at in starts[kind == TRUNCATE]:
        count = int(_int4(buf, np.array([at + 1]))[0])
        for relid in _int4(buf, at + 6 + 4 * np.arange(count, dtype=np.int64)):
            if int(relid) in tables:
                found.setdefault(int(relid), TableKeys(encoding=encoding)).truncated = True
    rows = np.isin(kind, (INSERT, UPDATE, DELETE))
    starts, kind = starts[rows], kind[rows]
    changes = len(starts)
    relids = _int4(buf, starts + 1)
    for relid, (positions, published, integers) in tables.items():
        mine = relids == relid
        if not mine.any():
            continue
        at, what = starts[mine], kind[mine]
        width = max(positions) + 1
        keys = found.setdefault(relid, TableKeys(encoding=encoding, ints=[] if integers else None))
        # every message's first tuple (an insert's or update's new row, a delete's key or old row, an update's old key or row
        # where it carries one) up to the last key column
        first, _, carried = _walk(buf, at + 6, width, positions)
        _add(keys, buf, first, carried, positions)
        # an update that carries its old key or row: its new row follows the old one's every column and an 'N'
        moved = (what == UPDATE) & np.isin(buf[at + 5], (_OLD_KEY, _OLD_ROW))
        if moved.any():
            _, after, _ = _walk(buf, at[moved] + 6, published, ())
            second, _, carried = _walk(buf, after + 1, width, positions)
            _add(keys, buf, second, carried, positions)
    return changes
