"""``load_mode=merge`` into PostgreSQL: partitions COPY into a staging table in parallel (one
transaction each, as for truncate); finalize checks the staged keys and applies them to the target
in one transaction with ``MERGE`` (PostgreSQL 15+) or ``INSERT ... ON CONFLICT`` (older servers,
which need a unique index on the keys), then removes (or marks) the rows the source no longer has
when asked. A failed run, or a refused key, changes nothing in the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.connectors.postgres.common import ident, literal
from conveyor.errors import ConfigError, SchemaError

#: how many offending keys a refusal names
_SHOWN = 5


@dataclass(frozen=True)
class MergePlan:
    keys: tuple[str, ...]
    #: the mapped columns (target names) the staged rows carry, and those a matched row takes
    columns: tuple[str, ...]
    update: tuple[str, ...]
    delete: str = "none"
    soft_column: str | None = None


def plan(con: Any, target: Any, config: Any, mapped: list[str], where: str) -> MergePlan:
    """The merge's keys and columns, checked against the target before anything moves."""
    keys = list(config.merge_keys or _primary_key(con, target.qualified))
    if not keys:
        raise ConfigError(f"load_mode=merge: {where} has no primary key to merge on", key="sink.merge_keys",
                          hint="name the columns that identify a row: sink.merge_keys=[id]")
    missing = [k for k in keys if k not in mapped]
    if missing:
        raise ConfigError(f"load_mode=merge: key column(s) {', '.join(missing)} of {where} get no source column",
                          key="sink.merge_keys", hint=f"the mapped columns are: {', '.join(mapped)}")
    update = list(config.merge_update) if config.merge_update is not None else [c for c in mapped if c not in keys]
    wrong = [c for c in update if c not in mapped or c in keys]
    if wrong:
        raise ConfigError(f"sink.merge_update: {', '.join(wrong)} is a key or gets no source column", key="sink.merge_update",
                          hint=f"choose among: {', '.join(c for c in mapped if c not in keys)}")
    soft = config.merge_soft_delete_column
    if soft and soft not in {c.name for c in target.columns}:
        raise ConfigError(f"sink.merge_soft_delete_column: {where} has no column {soft!r}", key="sink.merge_soft_delete_column")
    return MergePlan(tuple(keys), tuple(mapped), tuple(update), config.merge_delete, soft)


def _primary_key(con: Any, qualified: str) -> list[str]:
    rows = con.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                       "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)",
                       [qualified]).fetchall()
    return [r[0] for r in rows]


def check_keys(con: Any, merge: MergePlan, stage: str, where: str) -> None:
    """Refuse staged keys that are NULL or appear twice (naming a few): which row would win is
    not the database's to guess, and a server error halfway through the merge says less."""
    keys = ", ".join(ident(k) for k in merge.keys)
    nulls = con.execute(f"SELECT count(*) FROM {stage} WHERE " + " OR ".join(f"{ident(k)} IS NULL" for k in merge.keys)).fetchone()[0]
    if nulls:
        raise SchemaError(f"load_mode=merge into {where}: {nulls:,} source rows have a NULL in the key ({', '.join(merge.keys)})",
                          hint="a NULL key identifies no row: filter them out in source.query, or choose other sink.merge_keys")
    dups = con.execute(f"SELECT {keys}, count(*) FROM {stage} GROUP BY {keys} HAVING count(*) > 1 "
                       f"ORDER BY count(*) DESC, {keys} LIMIT {_SHOWN + 1}").fetchall()
    if dups:
        shown = "; ".join("(" + ", ".join(map(str, row[:-1])) + f") x{row[-1]}" for row in dups[:_SHOWN])
        raise SchemaError(f"load_mode=merge into {where}: the source has the same key ({', '.join(merge.keys)}) more than once: "
                          f"{shown}" + (" ..." if len(dups) > _SHOWN else ""),
                          hint="deduplicate the source (source.query with DISTINCT ON), or merge on columns that identify a row")


def steps(con: Any, merge: MergePlan, target: str, stage: str, where: str) -> list[str]:
    """The statements of the merge transaction (the keys checked first)."""
    check_keys(con, merge, stage, where)
    on = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in merge.keys)
    cols = ", ".join(ident(c) for c in merge.columns)
    values = ", ".join(f"s.{ident(c)}" for c in merge.columns)
    soft = ident(merge.soft_column) if merge.soft_column else None
    sets = [f"{ident(c)} = s.{ident(c)}" for c in merge.update] + ([f"{soft} = false"] if soft else [])
    if soft and merge.soft_column not in merge.columns:  # a row the source has again, or anew, is not deleted
        cols, values = f"{cols}, {soft}", f"{values}, false"
    if con.info.server_version >= 150000:
        matched = f" WHEN MATCHED THEN UPDATE SET {', '.join(sets)}" if sets else ""
        out = [f"MERGE INTO {target} t USING {stage} s ON {on}{matched} WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({values})"]
    else:
        action = "DO UPDATE SET " + ", ".join(s.replace("s.", "EXCLUDED.", 1) for s in sets) if sets else "DO NOTHING"
        out = [f"INSERT INTO {target} ({cols}) SELECT {values} FROM {stage} s ON CONFLICT ({', '.join(ident(k) for k in merge.keys)}) {action}"]
    gone = f"NOT EXISTS (SELECT 1 FROM {stage} s WHERE {on})"
    if merge.delete == "hard":
        out.append(f"DELETE FROM {target} t WHERE {gone}")
    elif merge.delete == "soft":
        out.append(f"UPDATE {target} t SET {soft} = {literal(True)} WHERE {gone} AND {soft} IS DISTINCT FROM true")
    return [*out, f"DROP TABLE {stage}"]
