"""``load_mode=merge`` for SQL table sinks (PostgreSQL, DuckDB): partitions load a staging table in
parallel (one transaction each, as for truncate); finalize checks the staged keys and applies them
to the target in one transaction with SQL ``MERGE`` (or ``INSERT ... ON CONFLICT`` where the
engine has no MERGE, which needs a unique index on the keys), then deletes (or marks) the rows the
source no longer has when asked. A failed run, or a refused key, changes nothing in the target.
A sink keeps the options as :class:`MergeOptions` fields of its config and supplies its quoting
and its primary key; the statements are standard SQL, written once here.

What the merge did is read back from the target inside its own transaction, before it commits
(:func:`apply`): every staged key must be in the target afterwards (with the staged values of the
merged columns under ``verify=checksum``), and none of the rows a delete removes may remain. A
trigger or rule that skipped a row (BEFORE INSERT returning NULL, ``DO INSTEAD NOTHING``) fails the
merge by name and the target keeps its rows as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError, SchemaError, VerificationError

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


def check_keys(con: Any, merge: MergePlan, stage: str, where: str, quote: Callable[[str], str], mysql: bool = False) -> None:
    """Refuse staged keys that are NULL or appear twice (naming a few): which row would win is
    not the database's to guess, and a server error halfway through the merge says less. The stage's
    columns have the target's types and collations, so keys the target would take as one are one here;
    ``mysql``: such keys spelled differently (a case- or accent-insensitive collation, MySQL's default)
    are said as such."""
    keys = ", ".join(quote(k) for k in merge.keys)
    nulls = con.execute(f"SELECT count(*) FROM {stage} WHERE " + " OR ".join(f"{quote(k)} IS NULL" for k in merge.keys)).fetchone()[0]
    if nulls:
        raise SchemaError(f"load_mode=merge into {where}: {nulls:,} source rows have a NULL in the key ({', '.join(merge.keys)})",
                          hint="a NULL key identifies no row: filter them out in source.query, or choose other sink.merge_keys")
    spellings = f", count(DISTINCT {', '.join(f'CAST({quote(k)} AS BINARY)' for k in merge.keys)})" if mysql else ""
    dups = con.execute(f"SELECT {keys}, count(*){spellings} FROM {stage} GROUP BY {keys} HAVING count(*) > 1 "
                       f"ORDER BY count(*) DESC, {keys} LIMIT {_SHOWN + 1}").fetchall()
    if dups:
        n = len(merge.keys)
        shown = "; ".join("(" + ", ".join(map(str, row[:n])) + f") x{row[n]}" for row in dups[:_SHOWN])
        if mysql and any(int(row[n + 1]) > 1 for row in dups):
            raise SchemaError(f"load_mode=merge into {where}: source keys that differ only in letter case or accents are one key "
                              f"under the target's collation of ({', '.join(merge.keys)}): {shown}" + (" ..." if len(dups) > _SHOWN else ""),
                              hint="give the target's key columns a binary collation (ALTER TABLE ... MODIFY ... COLLATE utf8mb4_bin), "
                                   "or make the source's keys distinct under the target's collation")
        raise SchemaError(f"load_mode=merge into {where}: the source has the same key ({', '.join(merge.keys)}) more than once: "
                          f"{shown}" + (" ..." if len(dups) > _SHOWN else ""),
                          hint="deduplicate the source (source.query with DISTINCT ON), or merge on columns that identify a row")


def upsert_and_deletes(merge: MergePlan, target: str, stage: str, quote: Callable[[str], str], has_merge: bool = True,
                       mysql: bool = False, written_keys: Sequence[str] = (), overriding: str = "") -> list[str]:
    """The statements of the merge transaction, after :func:`check_keys`: the upsert, then the delete
    (or soft delete) where asked. ``has_merge``: SQL MERGE, else ``INSERT ... ON CONFLICT`` (a unique
    index on the keys); ``mysql``: ``INSERT ... ON DUPLICATE KEY UPDATE``. ``written_keys``: key columns
    a matched row also takes from the source, so that a key the target calls equal but holds otherwise
    (numeric 1.0 and 1.000; 'bob' and 'Bob' under a case-insensitive collation) arrives as the source
    holds it; unchanged bytes cost nothing more (PostgreSQL's HOT update still applies). ``overriding``: the
    clause an insert takes to write identity columns' values (PostgreSQL's ``OVERRIDING SYSTEM VALUE``)."""
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in merge.keys)
    cols = ", ".join(quote(c) for c in merge.columns)
    values = ", ".join(f"s.{quote(c)}" for c in merge.columns)
    soft = quote(merge.soft_column) if merge.soft_column else None
    sets = [(quote(c), f"s.{quote(c)}") for c in [*written_keys, *merge.update]] + ([(soft, "false")] if soft else [])
    if soft and merge.soft_column not in merge.columns:  # a row the source has again, or anew, is not deleted
        cols, values = f"{cols}, {soft}", f"{values}, false"
    if mysql:
        # no column to update: a no-op update, not IGNORE (which would hide other errors as warnings)
        keep = [f"{c} = VALUES({c})" for c, _ in sets if c != soft] + ([f"{soft} = FALSE"] if soft else [])
        keep = keep or [f"{quote(merge.keys[0])} = {quote(merge.keys[0])}"]
        out = [f"INSERT INTO {target} ({cols}) SELECT {values} FROM {stage} AS s ON DUPLICATE KEY UPDATE {', '.join(keep)}"]
    elif has_merge:
        matched = " WHEN MATCHED THEN UPDATE SET " + ", ".join(f"{c} = {v}" for c, v in sets) if sets else ""
        out = [f"MERGE INTO {target} AS t USING {stage} AS s ON {on}{matched} WHEN NOT MATCHED THEN INSERT ({cols}) {overriding}VALUES ({values})"]
    else:
        action = ("DO UPDATE SET " + ", ".join(f"{c} = {v.replace('s.', 'EXCLUDED.', 1)}" for c, v in sets)) if sets else "DO NOTHING"
        keys = ", ".join(quote(k) for k in merge.keys)
        out = [f"INSERT INTO {target} ({cols}) {overriding}SELECT {values} FROM {stage} AS s ON CONFLICT ({keys}) {action}"]
    gone = f"NOT EXISTS (SELECT 1 FROM {stage} AS s WHERE {on})"
    if merge.delete == "hard":
        out.append(f"DELETE t FROM {target} AS t WHERE {gone}" if mysql else f"DELETE FROM {target} AS t WHERE {gone}")
    elif merge.delete == "soft":
        out.append(f"UPDATE {target} AS t SET t.{soft} = TRUE WHERE {gone} AND NOT (t.{soft} <=> TRUE)" if mysql else
                   f"UPDATE {target} AS t SET {soft} = true WHERE {gone} AND t.{soft} IS DISTINCT FROM true")
    return out


@dataclass(frozen=True)
class Merged:
    """What a merge did to its target, as the target holds it (read in the merge's transaction)."""

    staged: int
    updated: int
    inserted: int
    #: rows the source no longer has, deleted (merge_delete=hard) or marked deleted (soft)
    deleted: int = 0
    delete: str = "none"

    def describe(self) -> str:
        gone = f", {self.deleted:,} {'deleted' if self.delete == 'hard' else 'marked deleted'}" if self.delete != "none" else ""
        return f"merged {self.staged:,} staged rows: {self.updated:,} matched (updated), {self.inserted:,} inserted{gone}"


def apply(con: Any, merge: MergePlan, target: str, stage: str, where: str, quote: Callable[[str], str], has_merge: bool = True,
          values: bool = False, mysql: bool = False, written_keys: Sequence[str] = (), overriding: str = "") -> Merged:
    """The whole merge inside the caller's open transaction on ``con`` (``con.execute(sql).fetchone()``):
    the staged keys checked, the upsert and deletes, then what the target now holds read back; the
    stage is dropped last. Raises (the caller rolls back) where the target did not take every row.
    ``values``: also compare the merged columns' values of every staged key (``verify=checksum``); the
    written keys are compared as they are stored (text; MySQL: bytes) whatever ``values`` says;
    ``mysql``: MySQL's spelling (its own upsert is the caller's: ``steps`` here gives standard SQL);
    ``written_keys``, ``overriding``: see :func:`upsert_and_deletes`."""
    check_keys(con, merge, stage, where, quote, mysql)
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in merge.keys)
    staged, matched = _ints(con, f"SELECT count(*), sum(CASE WHEN EXISTS (SELECT 1 FROM {target} AS t WHERE {on}) THEN 1 ELSE 0 END) "
                                 f"FROM {stage} AS s")
    work = upsert_and_deletes(merge, target, stage, quote, has_merge, mysql, written_keys, overriding)
    con.execute(work[0])
    compared = [c for c in merge.update if c not in merge.keys] if values else []
    checks = [_differs(f"t.{quote(c)}", f"s.{quote(c)}", mysql) for c in compared]
    checks += [_differs(f"t.{quote(c)}", f"s.{quote(c)}", mysql, stored=True) for c in written_keys]  # whatever verify says
    differs = " OR ".join(checks) or "1 = 0"
    found, changed = _ints(con, f"SELECT count(*), sum(CASE WHEN {differs} THEN 1 ELSE 0 END) FROM {stage} AS s JOIN {target} AS t ON {on}")
    if found != staged:
        raise VerificationError(f"verification failed for {where}: after the merge it holds {found:,} of the {staged:,} staged keys "
                                f"(a trigger or rule on it skipped {staged - found:,} rows without an error): rolled back",
                                hint="the target was not changed; see its triggers and rules (or merge into a table without them)")
    if changed:
        raise VerificationError(f"verification failed for {where}: after the merge {changed:,} of its rows with a staged key do not "
                                "hold the staged values (a trigger or rule on it changed them): rolled back",
                                hint="the target was not changed; see its triggers and rules")
    deleted = 0
    if len(work) > 1:
        left_sql = f"SELECT count(*) FROM {target} AS t WHERE {_gone(merge, stage, on, quote, mysql)}"
        deleted = _ints(con, left_sql)[0]
        con.execute(work[1])
        left = _ints(con, left_sql)[0]
        if left:
            raise VerificationError(f"verification failed for {where}: the merge's delete left {left:,} of the {deleted:,} rows the "
                                    "source no longer has (a trigger or rule on it kept them): rolled back",
                                    hint="the target was not changed; see its triggers and rules")
    return Merged(staged, matched, staged - matched, deleted, merge.delete)


def _ints(con: Any, sql: str) -> tuple[int, ...]:
    return tuple(int(v or 0) for v in con.execute(sql).fetchone())


def _differs(a: str, b: str, mysql: bool, stored: bool = False) -> str:
    """Null-safe inequality of two values of one column type: compared as text where SQL's equality
    may not exist (json) or may say equal for values that differ. ``stored``: MySQL compares the
    values' bytes (a key's collation may call 'bob' and 'Bob' equal)."""
    if mysql:
        return f"NOT (CAST({a} AS BINARY) <=> CAST({b} AS BINARY))" if stored else f"NOT ({a} <=> {b})"
    return f"CAST({a} AS VARCHAR) IS DISTINCT FROM CAST({b} AS VARCHAR)"


def _gone(merge: MergePlan, stage: str, on: str, quote: Callable[[str], str], mysql: bool) -> str:
    """Target rows the source no longer has that the delete still has to act on."""
    gone = f"NOT EXISTS (SELECT 1 FROM {stage} AS s WHERE {on})"
    if merge.delete != "soft":
        return gone
    soft = f"t.{quote(merge.soft_column or '')}"
    return f"{gone} AND " + (f"NOT ({soft} <=> TRUE)" if mysql else f"{soft} IS DISTINCT FROM true")
