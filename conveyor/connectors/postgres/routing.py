"""Rows routed on the client into a partitioned target's leaves (``sink.routing``).

Through the parent, PostgreSQL routes every row: a binary search per level, a switch of the
multi-insert buffer whenever consecutive rows belong to different partitions, and each leaf's
indexes touched in the order rows arrive. Routed here, each task computes every row's leaf with
Arrow / numpy over whole batches (no per-row Python), groups a batch's rows by leaf, and COPYs
each leaf's rows straight into it, all in the partition's one transaction.

:func:`read_tree` reads the target's partition tree from the catalog: per partitioned table its
strategy, key columns and each child's bound, the bounds converted by the server into the
integers the binary COPY carries (days / microseconds since 2000 for dates and timestamps), so
the client compares exactly what PostgreSQL compares. A level the client cannot route exactly
(a key expression, a multi-column range, a text range (collation order), a hash on a type whose
hash is not implemented here) is a destination itself: its rows are COPYed into that partitioned
table and the server routes them below it. PostgreSQL checks every row written straight into a
partition against the partition's bounds (its ancestors' included), so a routing mistake is an
error, never a row in the wrong place.

Rows no partition takes go to the level's DEFAULT partition, or fail as the server fails them
("no partition of relation ... found"), naming the key column, not the value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conveyor.connectors.postgres.parttree import NO_PARTITION_HINT, Level, Tree
from conveyor.errors import TransferError

#: PostgreSQL's seed for partition hashing (src/include/catalog/partition.h, HASH_PARTITION_SEED)
HASH_SEED = 0x7A5B22367996DCFD
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
#: the hash support function (opclass proc 2) per kind this module implements, bit for bit


# --- routing a batch ----------------------------------------------------------------------------


class Router:
    """Each row's destination (an index into ``tree.destinations``) for batches in the binary COPY's
    wire form (dates and timestamps as PostgreSQL's integers)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.index = {name: i for i, name in enumerate(tree.destinations)}

    def assign(self, batch: Any) -> Any:
        """int32 numpy array: each row's destination."""
        import numpy as np

        out = np.full(batch.num_rows, -1, dtype=np.int32)
        self._route(self.tree.root, batch, None, out)
        return out

    def _route(self, level: Level, batch: Any, rows: Any, out: Any) -> None:
        import numpy as np

        keys = [_column(batch, c, rows) for c in level.columns]
        child = _pick(level, keys)
        missing = child < 0
        if missing.any():
            if level.default is None:
                raise TransferError(f"no partition of relation {level.name} found for {int(missing.sum()):,} row(s) "
                                    f"(partition key {', '.join(level.columns)})", retriable=False, hint=NO_PARTITION_HINT)
            child = np.where(missing, len(level.children), child)
        dests = (*level.children, level.default)
        present = np.flatnonzero(np.bincount(child, minlength=len(dests)))
        alike: dict[tuple[Any, ...], list[int]] = {}  # sub-levels partitioned alike (monthly ranges, each hashed 4 ways)
        for c in present:
            dest = dests[c]
            if isinstance(dest, Level) and all(isinstance(d, str) for d in dest.children) and dest.default is None:
                alike.setdefault((dest.strategy, dest.columns, dest.hashes, dest.bounds), []).append(int(c))
                continue
            picked = child == c
            where = np.flatnonzero(picked) if rows is None else rows[picked]
            if isinstance(dest, Level):
                self._route(dest, batch, where, out)
            else:
                out[where] = self.index[dest]
        for group in alike.values():
            self._route_alike([dests[c] for c in group], np.array(group), child, batch, rows, out)

    def _route_alike(self, levels: list[Level], which: Any, child: Any, batch: Any, rows: Any, out: Any) -> None:
        """Sub-levels with the same key and bounds whose children are all leaves: one pick for all
        their rows at once, then each row's leaf from a (level, child) table."""
        import numpy as np

        picked = np.isin(child, which)
        where = np.flatnonzero(picked) if rows is None else rows[picked]
        sub = _pick(levels[0], [_column(batch, c, where) for c in levels[0].columns])
        if (sub < 0).any():
            first = levels[int(np.searchsorted(which, child[picked][np.argmax(sub < 0)]))] if len(which) > 1 else levels[0]
            raise TransferError(f"no partition of relation {first.name} found for {int((sub < 0).sum()):,} row(s) "
                                f"(partition key {', '.join(first.columns)})", retriable=False, hint=NO_PARTITION_HINT)
        table = np.array([[self.index[d] for d in level.children] for level in levels], dtype=np.int32)
        position = np.zeros(int(which[-1]) + 1, dtype=np.int64)
        position[which] = np.arange(len(which))
        out[where] = table[position[child[picked]], sub]

    def split(self, batch: Any) -> Iterator[tuple[int, Any]]:
        """(destination, its rows of ``batch``) for every destination the batch has rows for."""
        import numpy as np
        import pyarrow as pa

        dest = self.assign(batch)
        counts = np.bincount(dest, minlength=len(self.tree.destinations))
        present = np.flatnonzero(counts)
        if len(present) == 1:
            yield int(present[0]), batch
            return
        ordered = batch.take(pa.array(np.argsort(dest, kind="stable")))
        offset = 0
        for d in present:
            n = int(counts[d])
            yield int(d), ordered.slice(offset, n)
            offset += n


def _column(batch: Any, name: str, rows: Any) -> tuple[Any, Any]:
    """(values as numpy, null mask or None) of one key column, for ``rows`` (None: all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = batch.column(name)
    if rows is not None:
        arr = arr.take(pa.array(rows))
    nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
    if pa.types.is_integer(arr.type):
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
    elif pa.types.is_boolean(arr.type):
        values = pc.fill_null(arr, False).to_numpy(zero_copy_only=False)
    else:
        values = arr  # strings: matched by Arrow
    return values, nulls


def _pick(level: Level, keys: list[tuple[Any, Any]]) -> Any:
    """Each row's child index at ``level`` (-1: none of them)."""
    import numpy as np

    if level.strategy == "hash":
        h = np.zeros(len(keys[0][0]), dtype=np.uint64)
        for (values, nulls), proc in zip(keys, level.hashes):
            wide = proc in ("hashint8extended", "timestamp_hash_extended", "timestamptz_hash_extended")
            one = hash_int8(values) if wide else hash_uint32(values.astype(np.int32).view(np.uint32))
            combined = combine64(h, one)
            h = combined if nulls is None else np.where(nulls, h, combined)  # a NULL key column adds nothing
        child = np.full(len(h), -1, dtype=np.int64)
        for i, (modulus, remainder) in enumerate(level.bounds):
            child[h % np.uint64(modulus) == np.uint64(remainder)] = i
        return child
    values, nulls = keys[0]
    if level.strategy == "range":
        order = sorted(range(len(level.bounds)), key=lambda i: (level.bounds[i][0] is not None, level.bounds[i][0] or 0))
        lows = np.array([level.bounds[i][0] if level.bounds[i][0] is not None else np.iinfo(np.int64).min for i in order], dtype=np.int64)
        highs = np.array([level.bounds[i][1] if level.bounds[i][1] is not None else np.iinfo(np.int64).max for i in order], dtype=np.int64)
        open_top = np.array([level.bounds[i][1] is None for i in order], dtype=bool)
        v = values.astype(np.int64)
        at = np.searchsorted(lows, v, side="right") - 1
        safe = np.maximum(at, 0)
        ok = (at >= 0) & ((v < highs[safe]) | open_top[safe])
        if nulls is not None:
            ok &= ~nulls  # NULL is in no range partition
        child = np.where(ok, np.array(order, dtype=np.int64)[safe], -1)
        return child
    return _pick_list(level, values, nulls)


def _pick_list(level: Level, values: Any, nulls: Any) -> Any:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    flat = [(v, i) for i, vals in enumerate(level.bounds) for v in vals if v is not None]
    null_child = next((i for i, vals in enumerate(level.bounds) if None in vals), -1)
    n = len(values)
    child = np.full(n, -1, dtype=np.int64)
    if flat:
        owner = np.array([i for _, i in flat], dtype=np.int64)
        if isinstance(values, np.ndarray):
            at = pc.index_in(pa.array(values), value_set=pa.array(np.array([v for v, _ in flat], dtype=values.dtype)))
        else:
            at = pc.index_in(values, value_set=pa.array([v for v, _ in flat], type=values.type))
        found = at.is_valid().to_numpy(zero_copy_only=False)
        child[found] = owner[pc.fill_null(at, 0).to_numpy(zero_copy_only=False)[found]]
    if nulls is not None:
        child[nulls] = null_child
    return child


# --- PostgreSQL's partition hash, over numpy arrays (src/common/hashfn.c, partbounds.c) ----------


def _rot(x: Any, k: int) -> Any:
    import numpy as np

    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def _seeded_state() -> tuple[int, int, int]:
    """hash_bytes_uint32_extended's a, b, c after mixing in the seed (the same for every value)."""
    def rot(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & _M32

    a = b = c = (0x9E3779B9 + 4 + 3923095) & _M32
    a, b = (a + (HASH_SEED >> 32)) & _M32, (b + (HASH_SEED & _M32)) & _M32
    a = (a - c) & _M32; a ^= rot(c, 4); c = (c + b) & _M32  # noqa: E702 (lookup3's mix, line by line)
    b = (b - a) & _M32; b ^= rot(a, 6); a = (a + c) & _M32  # noqa: E702
    c = (c - b) & _M32; c ^= rot(b, 8); b = (b + a) & _M32  # noqa: E702
    a = (a - c) & _M32; a ^= rot(c, 16); c = (c + b) & _M32  # noqa: E702
    b = (b - a) & _M32; b ^= rot(a, 19); a = (a + c) & _M32  # noqa: E702
    c = (c - b) & _M32; c ^= rot(b, 4); b = (b + a) & _M32  # noqa: E702
    return a, b, c


_STATE = _seeded_state()


def hash_uint32(k: Any) -> Any:
    """hash_bytes_uint32_extended(k, HASH_SEED) for a uint32 numpy array (hashint4extended)."""
    import numpy as np

    with np.errstate(over="ignore"):
        a = k.astype(np.uint32) + np.uint32(_STATE[0])
        b = np.full_like(a, _STATE[1])
        c = np.full_like(a, _STATE[2])
        c ^= b; c -= _rot(b, 14)  # noqa: E702 (lookup3's final)
        a ^= c; a -= _rot(c, 11)  # noqa: E702
        b ^= a; b -= _rot(a, 25)  # noqa: E702
        c ^= b; c -= _rot(b, 16)  # noqa: E702
        a ^= c; a -= _rot(c, 4)  # noqa: E702
        b ^= a; b -= _rot(a, 14)  # noqa: E702
        c ^= b; c -= _rot(b, 24)  # noqa: E702
    return (b.astype(np.uint64) << np.uint64(32)) | c.astype(np.uint64)


def hash_int8(v: Any) -> Any:
    """hashint8extended(v, HASH_SEED) for an int64 numpy array (also timestamps' hash)."""
    import numpy as np

    v = v.astype(np.int64)
    lo = (v & 0xFFFFFFFF).astype(np.uint32)
    hi = ((v >> 32) & 0xFFFFFFFF).astype(np.uint32)
    return hash_uint32(lo ^ np.where(v >= 0, hi, ~hi))


def combine64(a: Any, b: Any) -> Any:
    """hash_combine64(a, b)."""
    import numpy as np

    with np.errstate(over="ignore"):
        return a ^ (b + np.uint64(0x49A0F4DD15E5A8E3) + (a << np.uint64(54)) + (a >> np.uint64(7)))


__all__ = [
    "Router",
    "hash_uint32",
    "hash_int8",
    "combine64",
]
