"""``load_mode=merge`` for SQL table sinks (PostgreSQL, DuckDB): partitions load a staging table in
parallel (one transaction each, as for truncate); finalize checks the staged keys and applies them
to the target in one transaction with SQL ``MERGE`` (or ``INSERT ... ON CONFLICT`` where the
engine has no MERGE, which needs a unique index on the keys), then deletes (or marks) the rows the
source no longer has when asked. A failed run, or a refused key, changes nothing in the target.
A sink keeps the options as :class:`MergeOptions` fields of its config and supplies its quoting
and its primary key; the statements are standard SQL, written once here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError, SchemaError

#: how many offending keys a refusal names
_SHOWN = 5
MERGE_DELETES = ("none", "hard", "soft")


@dataclass
class MergeOptions:
    """The sink config keys of ``load_mode=merge``."""

    #: merge: the columns that identify a row (null: the target's primary key)
    merge_keys: list[str] | None = None
    #: merge: the columns a matched row takes from the source (null: every mapped column but the keys)
    merge_update: list[str] | None = None
    #: merge: what happens to target rows the source no longer has: none | hard (deleted) | soft
    #: (merge_soft_delete_column set to true)
    merge_delete: str = "none"
    merge_soft_delete_column: str | None = None

    def check_merge_options(self) -> None:
        """For the config's ``__post_init__``: the keys' values make sense together."""
        if self.merge_delete not in MERGE_DELETES:
            raise ValueError(f"merge_delete: {self.merge_delete!r} is not one of {', '.join(MERGE_DELETES)}")
        if (self.merge_delete == "soft") != bool(self.merge_soft_delete_column):
            raise ValueError("merge_delete=soft and merge_soft_delete_column go together (the boolean column set to true)")


@dataclass(frozen=True)
class MergePlan:
    keys: tuple[str, ...]
    #: the mapped columns (target names) the staged rows carry, and those a matched row takes
    columns: tuple[str, ...]
    update: tuple[str, ...]
    delete: str = "none"
    soft_column: str | None = None


def plan(options: MergeOptions, primary_key: Sequence[str], mapped: Sequence[str], target_columns: Sequence[str], where: str) -> MergePlan:
    """The merge's keys and columns, checked against the target before anything moves."""
    keys = list(options.merge_keys or primary_key)
    if not keys:
        raise ConfigError(f"load_mode=merge: {where} has no primary key to merge on", key="sink.merge_keys",
                          hint="name the columns that identify a row: sink.merge_keys=[id]")
    missing = [k for k in keys if k not in mapped]
    if missing:
        raise ConfigError(f"load_mode=merge: key column(s) {', '.join(missing)} of {where} get no source column",
                          key="sink.merge_keys", hint=f"the mapped columns are: {', '.join(mapped)}")
    update = list(options.merge_update) if options.merge_update is not None else [c for c in mapped if c not in keys]
    wrong = [c for c in update if c not in mapped or c in keys]
    if wrong:
        raise ConfigError(f"sink.merge_update: {', '.join(wrong)} is a key or gets no source column", key="sink.merge_update",
                          hint=f"choose among: {', '.join(c for c in mapped if c not in keys)}")
    soft = options.merge_soft_delete_column
    if soft and soft not in target_columns:
        raise ConfigError(f"sink.merge_soft_delete_column: {where} has no column {soft!r}", key="sink.merge_soft_delete_column")
    return MergePlan(tuple(keys), tuple(mapped), tuple(update), options.merge_delete, soft)


def check_keys(con: Any, merge: MergePlan, stage: str, where: str, quote: Callable[[str], str]) -> None:
    """Refuse staged keys that are NULL or appear twice (naming a few): which row would win is
    not the database's to guess, and a server error halfway through the merge says less."""
    keys = ", ".join(quote(k) for k in merge.keys)
    nulls = con.execute(f"SELECT count(*) FROM {stage} WHERE " + " OR ".join(f"{quote(k)} IS NULL" for k in merge.keys)).fetchone()[0]
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


def steps(merge: MergePlan, target: str, stage: str, quote: Callable[[str], str], has_merge: bool = True) -> list[str]:
    """The statements of the merge transaction, after :func:`check_keys`: the upsert, the deletes,
    dropping the stage."""
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in merge.keys)
    cols = ", ".join(quote(c) for c in merge.columns)
    values = ", ".join(f"s.{quote(c)}" for c in merge.columns)
    soft = quote(merge.soft_column) if merge.soft_column else None
    sets = [(quote(c), f"s.{quote(c)}") for c in merge.update] + ([(soft, "false")] if soft else [])
    if soft and merge.soft_column not in merge.columns:  # a row the source has again, or anew, is not deleted
        cols, values = f"{cols}, {soft}", f"{values}, false"
    if has_merge:
        matched = " WHEN MATCHED THEN UPDATE SET " + ", ".join(f"{c} = {v}" for c, v in sets) if sets else ""
        out = [f"MERGE INTO {target} AS t USING {stage} AS s ON {on}{matched} WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({values})"]
    else:
        action = ("DO UPDATE SET " + ", ".join(f"{c} = {v.replace('s.', 'EXCLUDED.', 1)}" for c, v in sets)) if sets else "DO NOTHING"
        keys = ", ".join(quote(k) for k in merge.keys)
        out = [f"INSERT INTO {target} ({cols}) SELECT {values} FROM {stage} AS s ON CONFLICT ({keys}) {action}"]
    gone = f"NOT EXISTS (SELECT 1 FROM {stage} AS s WHERE {on})"
    if merge.delete == "hard":
        out.append(f"DELETE FROM {target} AS t WHERE {gone}")
    elif merge.delete == "soft":
        out.append(f"UPDATE {target} AS t SET {soft} = true WHERE {gone} AND t.{soft} IS DISTINCT FROM true")
    return [*out, f"DROP TABLE {stage}"]
