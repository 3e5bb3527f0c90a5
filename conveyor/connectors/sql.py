"""Partitions as SQL WHERE clauses with bound parameters, for engines that take parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.core import KeyRange, ModuloBucket, Partition, ValueSet, WholeSource
from conveyor.errors import PlanningError


def where_clause(part: Partition, ident: Callable[[str], str], placeholder: Callable[[int], str] = lambda i: "?",
                 engine: str = "this", render: Callable[[Any], str] | None = None) -> tuple[str, list[Any]]:
    """(" WHERE ...", parameters) for a partition; ("", []) for the whole source.

    ``render`` puts values in as literals quoted by the driver instead (for statements that take
    no parameters, such as PostgreSQL's COPY).
    """
    params: list[Any] = []

    def bind(value: Any) -> str:
        if render is not None:
            return render(value)
        params.append(value)
        return placeholder(len(params))

    if isinstance(part, WholeSource):
        return "", []
    if isinstance(part, KeyRange):
        q = ident(part.column)
        conds = []
        if part.lower is not None:
            conds.append(f"{q} >= {bind(part.lower)}")
        if part.upper is not None:
            conds.append(f"{q} < {bind(part.upper)}")
        cond = " AND ".join(conds) or f"{q} IS NOT NULL"
        return f" WHERE ({cond})" + (f" OR {q} IS NULL" if part.nulls else ""), params
    if isinstance(part, ModuloBucket):
        q = ident(part.column)
        cond = f"abs({q} % {int(part.buckets)}) = {int(part.bucket)}"
        return f" WHERE {cond}" + (f" OR {q} IS NULL" if part.bucket == 0 else ""), params
    if isinstance(part, ValueSet):
        q = ident(part.column)
        values = [v for v in part.values if v is not None]
        conds = [f"{q} IN ({', '.join(bind(v) for v in values)})"] if values else []
        if len(values) < len(part.values):
            conds.append(f"{q} IS NULL")
        return f" WHERE {' OR '.join(conds) or '1 = 0'}", params
    raise PlanningError(f"{engine} source cannot read a {part.kind} partition",
                        hint="use strategy=none, rangeid, ntile, random or datadriven")


def key_kind(arrow_type: Any) -> str:
    """integer | numeric | temporal | other, for an Arrow type."""
    import pyarrow.types as t

    if t.is_integer(arrow_type):
        return "integer"
    if t.is_floating(arrow_type) or t.is_decimal(arrow_type):
        return "numeric"
    if t.is_date(arrow_type) or t.is_timestamp(arrow_type):
        return "temporal"
    return "other"
