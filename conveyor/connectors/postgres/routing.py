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

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres.common import ident
from conveyor.errors import TransferError

#: PostgreSQL's seed for partition hashing (src/include/catalog/partition.h, HASH_PARTITION_SEED)
HASH_SEED = 0x7A5B22367996DCFD
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
#: the key kinds the client compares exactly, by the column's type: the binary COPY integers
_KINDS = {"int2": "int", "int4": "int", "int8": "int", "date": "date", "timestamp": "ts", "timestamptz": "tstz",
          "text": "text", "varchar": "text", "bool": "bool"}
#: the hash support function (opclass proc 2) per kind this module implements, bit for bit
_HASHES = {("int", "hashint2extended"), ("int", "hashint4extended"), ("int", "hashint8extended"),
           ("date", "hashint4extended"), ("ts", "timestamp_hash_extended"), ("tstz", "timestamp_hash_extended")}
NO_PARTITION_HINT = ("add a partition that covers these keys, or a DEFAULT partition; with pg_partman, partman.run_maintenance() "
                     "makes the partitions its premake setting asks for, and a default partition takes the rest")


@dataclass(frozen=True)
class Level:
    """One partitioned table of the tree, as the client routes it."""

    table: str  # qualified, quoted
    name: str  # schema.table, for messages
    strategy: str  # "range" | "list" | "hash"
    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    #: int hash functions per key column (hash); empty otherwise
    hashes: tuple[str, ...]
    #: per child: range (low, high) integers (None: MINVALUE / MAXVALUE); list: the values (None for
    #: NULL); hash: (modulus, remainder)
    bounds: tuple[Any, ...]
    #: per child: a Level to route further, or the qualified table its rows are COPYed into
    children: tuple[Level | str, ...]
    default: str | Level | None = None


@dataclass(frozen=True)
class Tree:
    """The target's partition tree as far as the client routes it: the root level, every
    destination table (leaves, and partitioned tables the server routes below), and what the
    server still routes, for the plan's line."""

    root: Level
    destinations: tuple[str, ...]
    server_routes: tuple[str, ...] = ()
    #: whether any partition has an index (routing pays for itself in index maintenance)
    indexed: bool = True

    def key_columns(self) -> set[str]:
        """Every column a routed level reads (the rows must carry them: a column the server fills
        with its default cannot be routed on)."""
        found: set[str] = set()
        todo: list[Level | str | None] = [self.root]
        while todo:
            level = todo.pop()
            if isinstance(level, Level):
                found.update(level.columns)
                todo.extend([*level.children, level.default])
        return found

    def describe(self) -> str:
        levels: list[str] = []
        level: Level | str | None = self.root
        while isinstance(level, Level):
            levels.append(f"{level.strategy} on {', '.join(level.columns)}")
            level = next((c for c in level.children if isinstance(c, Level)), None)
        text = f"rows routed on the client into {len(self.destinations)} partitions ({' > '.join(levels)})"
        if self.server_routes:
            text += f"; the server routes below {', '.join(self.server_routes[:3])}" + (" ..." if len(self.server_routes) > 3 else "")
        return text


# --- reading the tree ---------------------------------------------------------------------------


def read_tree(con: Any, qualified: str) -> tuple[Tree | None, str]:
    """(the tree, "") for a partitioned target the client can route at least its top level of,
    else (None, why)."""
    rows = con.execute(
        "SELECT t.relid::oid, t.parentrelid::oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname), n.nspname || '.' || c.relname, "
        "c.relkind, pg_get_expr(c.relpartbound, c.oid), has_table_privilege(c.oid, 'INSERT'), c.relrowsecurity "
        "FROM pg_partition_tree(%s::regclass) t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace",
        [qualified]).fetchall()
    by_parent: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_parent.setdefault(row[1], []).append(row)
    root_row = next(r for r in rows if r[1] is None)
    for _, _, _, name, kind, _, can_insert, rls in rows:
        if kind == "f":
            return None, f"partition {name} is a foreign table"
        if not can_insert:
            return None, f"no INSERT privilege on partition {name} (through the parent only the parent's is checked)"
        if rls:
            return None, f"{name} has row-level security (policies differ between a parent and its partitions)"
    trigger = con.execute(  # statement-level INSERT triggers fire for the table a statement names; transition tables collect its rows
        "SELECT n.nspname || '.' || c.relname, g.tgname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE g.tgrelid IN (SELECT relid FROM pg_partition_tree(%s::regclass)) "
        "AND NOT g.tgisinternal AND (g.tgtype & 4) <> 0 AND ((g.tgtype & 1) = 0 OR g.tgnewtable IS NOT NULL)", [qualified]).fetchone()
    if trigger is not None:
        return None, f"{trigger[0]} has a statement-level INSERT trigger or a transition table ({trigger[1]}), which fire by the table a COPY names"
    destinations: list[str] = []
    server: list[str] = []
    root, why = _level(con, root_row, by_parent, destinations, server)
    if root is None:
        return None, why
    indexed = con.execute("SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid IN (SELECT relid FROM pg_partition_tree(%s::regclass)))",
                          [qualified]).fetchone()[0]
    return Tree(root, tuple(destinations), tuple(server), indexed), ""


def _level(con: Any, row: tuple[Any, ...], by_parent: dict[int, list[tuple[Any, ...]]], destinations: list[str],
           server: list[str]) -> tuple[Level | None, str]:
    relid, _, qualified, name = row[:4]
    key = con.execute(
        "SELECT pt.partstrat, pt.partexprs IS NOT NULL, "
        "array_agg(a.attname ORDER BY k.i), array_agg(ty.typname::text ORDER BY k.i), "
        "array_agg(coalesce(cl.collisdeterministic, true) ORDER BY k.i), "
        "array_agg((SELECT p.amproc::regproc::text FROM pg_opclass o JOIN pg_amproc p ON p.amprocfamily = o.opcfamily "
        "           AND p.amproclefttype = o.opcintype AND p.amprocrighttype = o.opcintype AND p.amprocnum = 2 "
        "           WHERE o.oid = pt.partclass[k.i - 1]) ORDER BY k.i) "
        "FROM pg_partitioned_table pt CROSS JOIN LATERAL unnest(pt.partattrs::int2[]) WITH ORDINALITY k(attnum, i) "
        "LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.attnum "
        "LEFT JOIN pg_type ty ON ty.oid = a.atttypid LEFT JOIN pg_collation cl ON cl.oid = pt.partcollation[k.i - 1] "
        "WHERE pt.partrelid = %s GROUP BY pt.partstrat, pt.partexprs", [relid]).fetchone()
    strat, exprs, columns, types, deterministic, procs = key
    strategy = {"r": "range", "l": "list", "h": "hash"}[strat]
    kinds = [_KINDS.get(t) for t in types]
    why = ""
    if exprs or any(c is None for c in columns):
        why = "its partition key is an expression"
    elif None in kinds:
        why = f"its key column {columns[kinds.index(None)]} is of type {types[kinds.index(None)]}"
    elif strategy == "range" and len(columns) > 1:
        why = "it is partitioned by a range of several columns"
    elif strategy == "range" and kinds[0] in ("text", "bool"):
        why = f"it is partitioned by a range of {types[0]} (ordered by its collation on the server)"
    elif strategy == "list" and kinds[0] == "text" and not deterministic[0]:
        why = "its list key has a nondeterministic collation"
    elif strategy == "hash" and any((k, p) not in _HASHES for k, p in zip(kinds, procs)):
        bad = next(i for i, (k, p) in enumerate(zip(kinds, procs)) if (k, p) not in _HASHES)
        why = f"its hash on {columns[bad]} ({types[bad]}, {procs[bad]}) is not computed on the client"
    if why:
        return None, f"{name}: {why}"
    children: list[Level | str] = []
    bounds: list[Any] = []
    default: Level | str | None = None
    kids = sorted(by_parent.get(relid, []), key=lambda r: r[3])
    literals = [_parse_bound(r[5]) for r in kids]
    converted = _convert(con, [b for b in literals if b is not None and b[0] != "hash"], kinds[0], types[0])
    for kid, bound in zip(kids, literals):
        dest: Level | str
        if kid[4] == "p":
            sub, sub_why = _level(con, kid, by_parent, destinations, server)
            if sub is None:
                destinations.append(kid[2])
                server.append(f"{kid[3]} ({sub_why.split(': ', 1)[-1]})")
                dest = kid[2]
            else:
                dest = sub
        else:
            destinations.append(kid[2])
            dest = kid[2]
        if bound is None:
            default = dest
            continue
        if bound[0] == "hash":
            bounds.append(bound[1])
        elif bound[0] == "range":
            bounds.append(next(converted))
        else:
            bounds.append(tuple(next(converted)))
        children.append(dest)
    return Level(qualified, name, strategy, tuple(columns), tuple(kinds), tuple(procs) if strategy == "hash" else (),
                 tuple(bounds), tuple(children), default), ""


_RANGE = re.compile(r"^FOR VALUES FROM \((.*)\) TO \((.*)\)$", re.S)
_LIST = re.compile(r"^FOR VALUES IN \((.*)\)$", re.S)
_HASH = re.compile(r"^FOR VALUES WITH \(modulus (\d+), remainder (\d+)\)$")


def _parse_bound(text: str) -> tuple[str, Any] | None:
    """A child's bound as PostgreSQL prints it: ("range", (low, high)) / ("list", [literal, ...]) /
    ("hash", (modulus, remainder)) with the literals as printed; None for DEFAULT."""
    if text == "DEFAULT":
        return None
    if m := _HASH.match(text):
        return "hash", (int(m.group(1)), int(m.group(2)))
    if m := _RANGE.match(text):
        return "range", (m.group(1), m.group(2))
    if m := _LIST.match(text):
        return "list", _split_literals(m.group(1))
    raise ValueError(f"unexpected partition bound {text!r}")


def _split_literals(text: str) -> list[str]:
    """'a', 'b,c', NULL -> ["'a'", "'b,c'", "NULL"]: commas outside quotes (bounds, not rows)."""
    out, cur, quoted = [], [], False
    for ch in text:
        if ch == "'":
            quoted = not quoted  # a doubled quote toggles twice
        if ch == "," and not quoted:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _convert(con: Any, bounds: list[tuple[str, Any]], kind: str | None, type_name: str) -> Iterator[Any]:
    """Every literal of a level's range / list bounds as the integer (or text, bool) its binary
    COPY form carries, converted by the server in one query; MINVALUE / MAXVALUE / NULL -> None."""
    literals = [lit for _, value in bounds for lit in (value if isinstance(value, (list, tuple)) else [value])]
    if not literals:
        return iter(())

    def sql(lit: str) -> str:
        if lit in ("MINVALUE", "MAXVALUE", "NULL"):
            return "NULL"
        typed = f"({lit})::{ident(type_name)}"
        if kind == "int":
            return f"{typed}::int8::text"
        if kind == "date":
            return f"({typed} - DATE '2000-01-01')::text"
        if kind in ("ts", "tstz"):
            return f"((extract(epoch FROM {typed}) * 1000000)::int8 - 946684800000000)::text"
        return f"{typed}::text"

    values = con.execute(f"SELECT ARRAY[{', '.join(sql(lit) for lit in literals)}]::text[]").fetchone()[0]
    typed_values = [None if v is None else (v == "true" if kind == "bool" else v if kind == "text" else int(v)) for v in values]
    out: list[Any] = []
    i = 0
    for _, value in bounds:
        n = len(value) if isinstance(value, list) else 2 if isinstance(value, tuple) else 1
        out.append(tuple(typed_values[i:i + n]))
        i += n
    return iter(out)


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
            wide = proc in ("hashint8extended", "timestamp_hash_extended")
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


__all__ = ["Tree", "Level", "Router", "read_tree", "hash_uint32", "hash_int8", "combine64", "NO_PARTITION_HINT"]
