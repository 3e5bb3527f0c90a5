"""Column mapping between a source schema and an existing target table.

``map_method=name``: a source column maps onto the target column of the same name; an exact
match wins, otherwise a case-insensitive match is taken when it is unique (``OrderKey`` finds
``orderkey``, as unquoted SQL identifiers fold case). ``map_method=position``: the i-th source
column maps onto the i-th target column, and the counts must agree.

Every problem is reported at once, before a row moves: source columns with no target column,
and target columns the source does not fill that have neither a default nor allow NULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import SchemaError


@dataclass(frozen=True)
class TargetColumn:
    name: str
    type: str = ""
    nullable: bool = True
    has_default: bool = False


def _by_name(source: Sequence[str], target: Sequence[TargetColumn]) -> tuple[list[tuple[str, str]], list[str]]:
    exact = {c.name: c.name for c in target}
    folded: dict[str, list[str]] = {}
    for c in target:
        folded.setdefault(c.name.lower(), []).append(c.name)
    pairs, unmatched = [], []
    for name in source:
        if name in exact:
            pairs.append((name, name))
        elif len(folded.get(name.lower(), [])) == 1:
            pairs.append((name, folded[name.lower()][0]))
        else:
            unmatched.append(name)
    return pairs, unmatched


def map_columns(
    source: Sequence[str], target: Sequence[TargetColumn], method: str, where: str
) -> list[tuple[str, str]]:
    """Pairs (source column, target column), or a SchemaError listing every mismatch."""
    if method == "position":
        if len(source) != len(target):
            raise SchemaError(
                f"{where}: the source has {len(source)} columns, the target {len(target)}",
                hint="map_method=position needs the same number of columns; use map_method=name to match by name",
            )
        return [(s, t.name) for s, t in zip(source, target)]
    pairs, unmatched = _by_name(source, target)
    used = {t for _, t in pairs}
    dupes = sorted({t for _, t in pairs if sum(1 for _, u in pairs if u == t) > 1})
    required = [c.name for c in target if c.name not in used and not c.nullable and not c.has_default]
    problems = []
    if unmatched:
        problems.append(f"source columns with no target column: {', '.join(unmatched)}")
    if dupes:
        problems.append(f"target columns matched by several source columns: {', '.join(dupes)}")
    if required:
        problems.append(f"NOT NULL target columns without a default the source does not fill: {', '.join(required)}")
    if problems:
        hint = f"target columns are: {', '.join(c.name for c in target)}"
        if unmatched and len(source) > len(target):
            hint += f"; the source has {len(source) - len(target)} more: select the ones to load in source.query"
        elif len(source) == len(target) and not dupes:  # a rename, one for one: the same count maps by position
            hint += "; or, to map the i-th source column onto the i-th target column, map_method=position"
        raise SchemaError(f"{where}: " + "; ".join(problems), hint=hint)
    return pairs
