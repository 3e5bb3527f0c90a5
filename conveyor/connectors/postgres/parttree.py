"""A partitioned PostgreSQL target's tree, read from the catalog (:func:`read_tree`): per partitioned
table its strategy, key columns and each child's bound, the bounds converted by the server into the
integers the binary COPY carries (days / microseconds since 2000 for dates and timestamps), so the
client router (:mod:`conveyor.connectors.postgres.routing`) compares exactly what PostgreSQL compares.
A level the client cannot route exactly (a key expression, a multi-column range, a text range
(collation order), a hash on a type whose hash is not implemented here) is a destination itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres.common import ident

#: the hash functions (by the key's kind) the client router computes as PostgreSQL does
_HASHES = {("int", "hashint2extended"), ("int", "hashint4extended"), ("int", "hashint8extended"),
           ("date", "hashint4extended"), ("date", "hashdateextended"),  # 18 gave date a hash function of its own, the same hash
           ("ts", "timestamp_hash_extended"), ("tstz", "timestamp_hash_extended"), ("tstz", "timestamptz_hash_extended")}  # (18: its own)


#: the key kinds the client compares exactly, by the column's type: the binary COPY integers
_KINDS = {"int2": "int", "int4": "int", "int8": "int", "date": "date", "timestamp": "ts", "timestamptz": "tstz",
          "text": "text", "varchar": "text", "bool": "bool"}


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
    # the target's own row: its parent is outside its tree (none for a root; a partitioned partition has one)
    inside = {r[0] for r in rows}
    root_row = next(r for r in rows if r[1] is None or r[1] not in inside)
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


__all__ = [
    "Tree",
    "Level",
    "read_tree",
    "NO_PARTITION_HINT",
]
