"""Partitioned PostgreSQL targets: a plan aligned with the target's range partitions, each aligned
source partition written straight into its partition (not routed row by row through the parent),
and the rows a DEFAULT partition took, said after the load."""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.connectors.postgres import target as targets
from conveyor.connectors.postgres.common import connect, translate
from conveyor.connectors.postgres.target import Target
from conveyor.core import KeyRange, Partition, SinkPlan, TargetLayout
from conveyor.log import warn

#: (partition key column, ((lower, upper, table), ...)) of a target's range partitions in its schema
Leaves = tuple[str, tuple[tuple[Any, Any, str], ...]]


def leaves(con: Any, target: Target, schema: str) -> Leaves | None:
    """The target's range partitions that live in its schema (others are reached through the parent)."""
    found = targets.range_leaves(con, target)
    if found is None:
        return None
    column, all_leaves = found
    return column, tuple((lo, hi, name) for lo, hi, in_schema, name in all_leaves if in_schema == schema)


def layout(config: Any, load_mode: str, where: str) -> TargetLayout | None:
    """The target's range boundaries for a plan to align with (append only: the other modes write a
    staging table, where alignment buys nothing); None for a target not partitioned by range."""
    if load_mode != "append":
        return None
    con = connect(config, autocommit=True)
    try:
        target = targets.inspect(con, config.schema, config.table)
        found = targets.range_leaves(con, target) if target.exists and target.relkind == "p" else None
    except Exception as exc:
        raise translate(exc, config, f"reading the partitions of {where}") from None
    finally:
        con.close()
    if found is None:
        return None
    column, all_leaves = found
    bounds = sorted({b for lo, hi, _, _ in all_leaves for b in (lo, hi) if b is not None})
    return TargetLayout(column, tuple(bounds), len(all_leaves))


def into(plan: SinkPlan, part: Partition, table: str) -> SinkPlan:
    """The plan with the partition a source range aligned with one is written into (its rows all
    belong there; PostgreSQL checks each against the partition's bounds all the same)."""
    found: Leaves | None = plan.own.leaves if plan.write_target == table else None
    if not found or not isinstance(part, KeyRange) or part.nulls or part.column != found[0]:
        return plan
    for lo, hi, name in found[1]:
        if lo == part.lower and hi == part.upper:
            return dataclasses.replace(plan, write_target=name)
    return plan


def say_default_rows(con: Any, target: Target, name: str) -> None:
    """Rows that no partition's bounds cover went to a DEFAULT partition, as the server routes
    them: loaded, but worth a line (pg_partman moves them once it has made their partitions)."""
    if con.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [target.qualified]).fetchone()[0] != "p":
        return
    for default, n in targets.default_partition_rows(con, target):
        warn(f"{default}, the default partition of {name}, holds {n:,} rows that no other partition covers "
             "(pg_partman: CALL partman.partition_data_proc(...) makes their partitions and moves them there)")
    con.commit()


__all__ = ["leaves", "layout", "into", "say_default_rows"]
