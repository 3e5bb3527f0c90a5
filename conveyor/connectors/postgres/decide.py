"""What the PostgreSQL sink does with a load, decided from its target as the catalog has it.

:func:`inspect` reads everything the decision needs in one connection (the target, its access
method and stripe size, its partition tree and range partitions, its primary key); :func:`decide`
is a pure function of that, the request and the config: whether the load is one transaction into
the target (a truncate in place), the column pairs and their casts, the pass-through or Arrow,
routing rows into partitions, and the path text. ``describe_target`` and ``prepare`` both call
them, so ``conveyor plan`` and ``conveyor run`` take the same path by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.postgres import encoding, parttree, passthrough
from conveyor.connectors.postgres import target as targets
from conveyor.connectors.postgres.common import ident
from conveyor.connectors.postgres.encoding import pg_column_type
from conveyor.connectors.postgres.target import Target
from conveyor.connectors.postgres.types import PgColumn, adbc_field, column_ddl, read_columns
from conveyor.core import JobOptions, PrepareRequest, TargetInfo, TargetLayout
from conveyor.errors import ConfigError, SchemaError
from conveyor.kit.casts import ColumnType, check_casts
from conveyor.kit.mapping import map_columns
from conveyor.kit.staged import check_mode

IN_PLACE = "truncate in one transaction (TRUNCATE, then COPY straight into the target)"
STAGED = "truncate through an UNLOGGED staging table, copied into the target at the end"
#: measured (make bench, partitioned group): into partitions without an index the pass-through through
#: the parent beats decoding to Arrow to route on the client; with indexes routing wins by far
UNINDEXED = "rows routed by the server through the parent (no partition has an index: the pass-through costs less than routing here)"


@dataclass(frozen=True)
class Inspected:
    """What one connection reads of the target for a load."""

    target: Target
    #: the table access method of a columnar target (None: heap, or no such target), and its stripe's rows
    access_method: str | None = None
    stripe_rows: int = 0
    #: a partitioned target (append, or truncate): the partition tree rows may be routed into, or None and why not
    route: tuple[parttree.Tree | None, str] | None = None
    #: its range partitions (append), for a plan aligned with them
    layout: TargetLayout | None = None
    #: its primary key (merge's keys by default)
    primary_key: tuple[str, ...] = ()
    #: sink.column_types of a table this load makes: {column: the type, as the target server knows it}
    typed: dict[str, PgColumn] = field(default_factory=dict)


def inspect(con: Any, config: Any, options: JobOptions, where: str) -> Inspected:
    """The target as the catalog has it, and what this role may do to it (refused here, by name)."""
    mode = options.load_mode
    target = targets.inspect(con, config.schema, config.table)
    targets.check_access(con, target, mode, config.user, config.commit_markers, config.where(), where)
    _check_access_method(con, config, mode)
    am, stripe = _columnar(con, config, mode, target)
    route = _routing(con, config, target, where) if target.relkind == "p" and mode in ("append", "truncate") else None
    layout = None
    if mode == "append" and target.relkind == "p":
        found = targets.range_leaves(con, target)
        if found is not None:
            column, leaves = found
            bounds = sorted({b for lo, hi, _, _ in leaves for b in (lo, hi) if b is not None})
            layout = TargetLayout(column, tuple(bounds), len(leaves))
    key = tuple(targets.primary_key(con, target)) if mode == "merge" and target.exists else ()
    return Inspected(target, am, stripe, route, layout, key, _typed(con, config, mode, target))


def _typed(con: Any, config: Any, mode: str, target: Target) -> dict[str, PgColumn]:
    """``sink.column_types``, each type resolved by the target's server (a name it does not know is refused by name)."""
    types = dict(config.column_types or {})
    if not types:
        return {}
    if mode not in ("create", "replace") or target.exists:
        raise ConfigError(f"sink.column_types: applies to a table the load makes (load_mode=create, or replace of a table that does "
                          f"not exist yet); {config.where()} keeps its own column types", key="sink.column_types")
    made = {}
    for name, sql in types.items():
        try:
            made[name] = read_columns(con, f"SELECT NULL::{sql} AS {ident(name)}")[0]
        except Exception as exc:
            raise ConfigError(f"sink.column_types: {name}: {sql!r} is not a type the target's server has: {str(exc).splitlines()[0]}",
                              key="sink.column_types") from None
    return made


def _check_access_method(con: Any, config: Any, mode: str) -> None:
    """``sink.access_method``: only for a table this load makes, and only one the server has."""
    am = config.access_method
    if not am:
        return
    if mode not in ("create", "replace"):
        raise ConfigError(f"sink.access_method={am}: applies to load_mode=create or replace (load_mode={mode} keeps the target's own)",
                          key="sink.access_method")
    if con.execute("SELECT 1 FROM pg_am WHERE amname = %s AND amtype = 't'", [am]).fetchone() is None:
        found = [r[0] for r in con.execute("SELECT amname FROM pg_am WHERE amtype = 't' ORDER BY 1").fetchall()]
        raise SchemaError(f"{config.where()}: table access method {am!r} does not exist (there: {', '.join(found)})",
                          hint="install its extension first (Citus: CREATE EXTENSION citus_columnar), or leave sink.access_method unset")


def _columnar(con: Any, config: Any, mode: str, target: Target) -> tuple[str | None, int]:
    """(access method, stripe rows) of a non-heap target append, create and replace write into (the
    other modes write through a heap stage): its partitions should make whole stripes."""
    if not config.stripe_rows or mode not in ("append", "create", "replace"):
        return None, 0
    am = config.access_method if mode != "append" and config.access_method else None
    if am is None and target.exists and mode != "create":
        am = targets.table_access_method(con, target)
    if am is None or am == "heap":
        return None, 0
    return am, targets.stripe_row_limit(con, target if target.exists else None) or config.stripe_rows


def _routing(con: Any, config: Any, target: Target, where: str) -> tuple[parttree.Tree | None, str]:
    """(the tree to route rows into, or None; why not) for a partitioned target (sink.routing)."""
    if config.routing == "parent":
        return None, "rows routed by the server through the parent (sink.routing=parent)"
    tree, why = parttree.read_tree(con, target.qualified)
    if tree is None and config.routing == "leaves":
        raise SchemaError(f"{where}: sink.routing=leaves is not possible: {why}", hint="use sink.routing=auto or parent")
    if tree is not None and config.copy_path == "passthrough":
        if config.routing == "leaves":
            raise ConfigError("sink.routing=leaves routes Arrow batches, and sink.copy_path=passthrough relays the source's "
                              "COPY stream untouched", key="sink.routing", hint="use sink.copy_path=auto with routing=leaves")
        return None, "rows routed by the server through the parent (sink.copy_path=passthrough)"
    return tree, f"rows routed by the server through the parent ({why})" if tree is None else ""


@dataclass(frozen=True)
class Decision:
    """What the sink does with the load (see the module's docstring)."""

    in_place: bool
    new_table: bool
    pairs: tuple[tuple[str, str], ...]
    tcols: tuple[PgColumn, ...]
    #: the target columns ``sink.allow_cast`` lets PostgreSQL cast
    forced: tuple[str, ...]
    #: the native format the source's stream passes through in (None: Arrow batches)
    native: str | None
    #: the partition tree each row is routed into on the client (None: the server routes, or no partitions)
    tree: parttree.Tree | None
    path: str
    #: schema_drift=evolve: (column, SQL type) of the source's columns the target lacks, added before the load
    added: tuple[tuple[str, str], ...] = ()


def decide(ins: Inspected, request: PrepareRequest, config: Any, options: JobOptions, where: str, partitions: int) -> Decision:
    """The load's decision for a plan of ``partitions`` partitions (0: several, a number not known yet)."""
    mode, target = options.load_mode, ins.target
    check_mode(mode, target.exists, where, config.where())
    if config.rebuild_indexes and mode != "truncate":
        raise ConfigError(f"sink.rebuild_indexes: applies to load_mode=truncate (one transaction drops, loads and rebuilds); "
                          f"load_mode={mode} commits partitions apart, so a failed run would leave the target without them",
                          key="sink.rebuild_indexes")
    if mode == "replace" and target.relkind == "p":
        raise SchemaError(f"{where} is partitioned: replace would lose its partitions", hint="use load_mode=truncate")
    in_place = mode == "truncate" and in_place_ok(config, options, partitions)
    new_table = mode in ("create", "replace") and not target.exists
    names = request.column_names
    added: tuple[tuple[str, str], ...] = ()
    if new_table:  # a new table gets the source's built-in types (made from the source's columns in prepare)
        pairs = [(n, n) for n in names]
        src = passthrough.source_columns(request.info.native)
        unknown = sorted(set(ins.typed) - set(names))
        if unknown:
            raise ConfigError(f"sink.column_types: the source has no column {', '.join(unknown)}", key="sink.column_types",
                              hint=f"its columns: {', '.join(names)}")
        tcols = [ins.typed.get(n) or (src[n] if n in src and src[n].type_oid < 16384 else PgColumn(n, 0, -1, "", "", "", ""))
                 for n in names]
        typed = [(p, t) for p, t in zip(pairs, tcols) if t.name in ins.typed]  # judged as a cast into an existing column
        forced: list[str] = check_target_casts(request, [p for p, _ in typed], [t for _, t in typed], config, where) if typed else []
    else:
        pairs = map_columns(names, target.mapping, options.map_method, where, options.schema_drift, evolves=True)
        by_name = {c.name: c for c in target.columns}
        src = passthrough.source_columns(request.info.native)
        added = tuple((t, column_ddl(request.schema.field(s), src.get(s))) for s, t in pairs if t not in by_name)
        pairs = [(s, t) for s, t in pairs if t in by_name]  # the added columns are mapped once they are made (prepare)
        tcols = [by_name[t] for _, t in pairs]
        forced = check_target_casts(request, pairs, tcols, config, where)
    route = ins.route if ins.route is not None and (mode == "append" or in_place) else (None, "")
    tree, route_note = _route_these(route, request, pairs, tcols, config, where, forced)
    native, reason = passthrough.negotiate(request.info.native, pairs, tcols, "arrow" if tree else config.copy_path)
    if tree is not None:
        reason = reason.replace("copy_path=arrow", "routing rows into partitions") + "; " + tree.describe()
    elif route_note:
        reason += "; " + route_note
    if native is None and forced:
        reason += f"; cast by PostgreSQL (sink.allow_cast): {', '.join(forced)}"
    if mode == "truncate":
        reason += "; " + (IN_PLACE if in_place else STAGED)
    if added:
        reason += f"; schema_drift=evolve adds to the target: {', '.join(f'{n} {t}' for n, t in added)}"
    return Decision(in_place, new_table, tuple(pairs), tuple(tcols), tuple(forced), native, tree, reason, added)


def in_place_ok(config: Any, options: JobOptions, partitions: int) -> bool:
    """Whether load_mode=truncate loads in one transaction (sink.truncate_method) for a plan of
    ``partitions`` partitions (0: several, not known yet: never in place, and not refused yet)."""
    method = config.truncate_method
    if method == "staged":
        return False
    if method == "in_place":
        if partitions > 1:
            raise ConfigError(f"sink.truncate_method=in_place: the whole load is one transaction, and the plan has "
                              f"{partitions} partitions", key="sink.truncate_method",
                              hint="plan one partition (strategy=none, or strategy.partitions=1), or use truncate_method=auto")
        if options.verify == "checksum":
            raise ConfigError("sink.truncate_method=in_place with verify=checksum: the checksum is compared after the load "
                              "is committed, too late to keep the old rows", key="sink.truncate_method",
                              hint="use verify=count (checked inside the transaction), or truncate_method=staged")
        return partitions == 1
    return partitions == 1 and options.verify != "checksum"


def check_target_casts(request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn], config: Any, where: str) -> list[str]:
    """Refuse, before anything moves, a column whose values the target type would change
    (conveyor/kit/casts.py); the target columns ``sink.allow_cast`` lets PostgreSQL cast anyway."""
    src_cols = passthrough.source_columns(request.info.native)

    def unchanged(s: str, t: PgColumn) -> bool:
        """A PostgreSQL column into one of its very type and typmod: no value changes, so it is not
        judged (nor is the source's Arrow schema made for it, which a pass-through never needs)."""
        col = src_cols.get(s)
        return col is not None and col.typmod == t.typmod and passthrough.same_type(col, t)

    judged = [(pair, t) for pair, t in zip(pairs, tcols) if not unchanged(pair[0], t)]
    sources = []
    for (s, _), _t in judged:
        f = request.schema.field(s)
        col = src_cols.get(s)
        sources.append(pg_column_type(col, f.type, as_text=col.unconstrained_numeric or not col.native) if col is not None
                       else ColumnType.of_field(f))
    return check_casts([pair for pair, _ in judged], sources, [pg_column_type(t, None) for _, t in judged], where, config.allow_cast,
                       fractions_checked=True)  # a time(2) / timestamp(3) target: each value checked (encoding.fraction_limits)


def _route_these(route: tuple[parttree.Tree | None, str], request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn],
                 config: Any, where: str, forced: list[str]) -> tuple[parttree.Tree | None, str]:
    """The routing decision once the columns are known: a partition key the rows do not carry (the
    server fills it from its default) leaves the routing to the server; so does routing=auto into
    partitions without an index from a source whose COPY stream can pass through (the parent costs
    less there: measured in make bench's partitioned group), and an encoder other than pgpq, or a column
    PostgreSQL casts (routing splits pgpq's Arrow batches: they must reach it as they are)."""
    tree, note = route
    if tree is None:
        return route
    why_not = ""
    unloaded = sorted(tree.key_columns() - {t for _, t in pairs})
    if unloaded:
        why_not = f"the partition key column {unloaded[0]} is not loaded (the server fills it)"
    elif config.routing == "auto" and not tree.indexed and passthrough.negotiate(request.info.native, pairs, tcols, config.copy_path)[0]:
        return None, UNINDEXED
    else:
        why_not = _not_pgpq(request, pairs, tcols, config, where, forced)
    if why_not:
        if config.routing == "leaves":
            raise SchemaError(f"{where}: sink.routing=leaves is not possible: {why_not}", hint="use sink.routing=auto or parent")
        return None, f"rows routed by the server through the parent ({why_not})"
    return tree, note


def _not_pgpq(request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn], config: Any, where: str,
              forced: list[str]) -> str:
    """Why the rows could not reach pgpq's encoder as routed batches ("": they can), known from the column
    types alone (a type only ADBC's driver can name is not routed: it would take a connection to tell)."""
    fields = [adbc_field(c) for c in tcols]
    if any(f is None for f in fields):
        return "a column's type is one only ADBC's driver reads: the encoder cannot be chosen from the types alone"
    casts = encoding.arrow_casts(request.schema, pairs, fields, forced)
    if any(c is None for c in casts):
        return "PostgreSQL casts a column (through a temp table)"
    chosen, why, _ = encoding.choose_writer(config.writer, request.schema, pairs, casts, tcols, where)
    return "" if chosen == "pgpq" else f"the {chosen} encoder ({why})"


def describe(ins: Inspected, request: PrepareRequest, config: Any, options: JobOptions, where: str, name: str) -> TargetInfo:
    """The target for the plan: its facts, and the path of a plan of several partitions and of one."""
    mode = options.load_mode
    several = decide(ins, request, config, options, where, 0)
    one = decide(ins, request, config, options, where, 1)
    why = f"the {ins.access_method} target {name} (a stripe holds one transaction's rows, up to {ins.stripe_rows:,}: sink.stripe_rows)"

    def info(d: Decision) -> TargetInfo:
        return TargetInfo(label=f"{config.where()} {name}", layout=ins.layout, min_partition_rows=ins.stripe_rows,
                          min_partition_why=why if ins.stripe_rows else "", native=d.native, checksums=True, path=d.path, in_place=d.in_place,
                          checks_before_commit=mode == "append" or d.in_place)

    first = info(several)
    if mode == "truncate" and config.truncate_method == "in_place":  # a plan of several partitions cannot be one transaction
        first = TargetInfo(**{**first.__dict__, "refused": "sink.truncate_method=in_place: the whole load is one transaction, and "
                                                           "the plan has {partitions} partitions", "refused_key": "sink.truncate_method",
                              "refused_hint": "plan one partition (strategy=none, or strategy.partitions=1), or use truncate_method=auto"})
    return TargetInfo(**{**first.__dict__, "one_partition": info(one) if one != several else None})


__all__ = ["Decision", "Inspected", "decide", "describe", "in_place_ok", "inspect"]
