"""What a DuckDB table the sink creates takes of its source table's definition (``SourceInfo.definition``
and ``primary_key``, from any engine): NOT NULL and the columns' comments made with the staging table,
the primary key and the table's comment in the transaction that swaps it in (the key built once over the
rows; the staging table's own comment labels it until then). The rest (defaults, sequences, CHECK,
UNIQUE, other indexes, foreign keys, triggers, ...) is said, not carried: DuckDB's SQL for them is not
PostgreSQL's, and a default or a check rewritten from one dialect to the other could change what it does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.core import TableDefinition


@dataclass(frozen=True)
class Carried:
    #: statements on the staging table as it is made (before its rows)
    at_create: tuple[str, ...] = ()
    #: statements on the staging table in the transaction that swaps it in (after its rows)
    before_swap: tuple[str, ...] = ()
    said: str = ""


def plan(info: Any, columns: list[str], stage: str, quote: Callable[[str], str], literal: Callable[[str], str]) -> Carried:
    """The statements and the log's line for a new table from ``info``'s source (nothing from a source that says nothing)."""
    d = info.definition
    key = [c for c in info.primary_key if c in columns] if len(set(info.primary_key) & set(columns)) == len(info.primary_key) else []
    if d is None and not key:
        return Carried()
    have = set(columns)
    not_null = sorted((set(d.not_null) if d is not None else set()) & have | set(key), key=columns.index)
    at_create = [f"ALTER TABLE {stage} ALTER COLUMN {quote(c)} SET NOT NULL" for c in not_null]
    comments = [(c, text) for c, text in (d.column_comments if d is not None else ()) if c in have]
    at_create += [f"COMMENT ON COLUMN {stage}.{quote(c)} IS {literal(text)}" for c, text in comments]
    before = [f"ALTER TABLE {stage} ADD PRIMARY KEY ({', '.join(quote(c) for c in key)})"] if key else []
    if d is not None and d.comment is not None:
        before.append(f"COMMENT ON TABLE {stage} IS {literal(d.comment)}")
    said = TableDefinition.said(((len(not_null), "NOT NULL"), (1 if key else 0, "primary key"),
                                 (len(comments) + (d is not None and d.comment is not None), "comment(s)")),
                                d.beyond_keys() if d is not None else [])
    return Carried(tuple(at_create), tuple(before), said)


def made(con: Any, info: Any, columns: list[str], stage: str, where: str) -> tuple[tuple[str, ...], str]:
    """:func:`plan`'s statements at the staging table's making run on ``con``, its line said; (what is left for the
    swap, the line)."""
    from conveyor.connectors.duckdb.common import qident
    from conveyor.log import say

    carried = plan(info, columns, stage, qident, lambda s: "'" + s.replace("'", "''") + "'")
    for step in carried.at_create:
        con.execute(step)
    if carried.said:
        say(f"{where}: {carried.said}")
    return carried.before_swap, carried.said
