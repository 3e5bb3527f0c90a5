"""Column mapping between a source schema and an existing target table.

``map_method=name``: a source column maps onto the target column of the same name; an exact
match wins, otherwise a case-insensitive match is taken when it is unique (``OrderKey`` finds
``orderkey``, as unquoted SQL identifiers fold case). ``map_method=position``: the i-th source
column maps onto the i-th target column, and the counts must agree.

Every problem is reported at once, before a row moves: source columns with no target column,
and target columns the source does not fill that have neither a default nor allow NULL.

Source columns the target lacks follow ``schema_drift``: ``fail`` (the default) names them;
``ignore`` maps the others and says which were left out; ``evolve`` maps them onto columns of
their own name, which the sink adds to the target (a sink that cannot is refused by name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import ConfigError, SchemaError
from conveyor.log import say


@dataclass(frozen=True)
class TargetColumn:
    name: str
    type: str = ""
    nullable: bool = True
    has_default: bool = False
    #: computed by the target from its own expression (PostgreSQL's GENERATED ALWAYS AS (...)): never written
    generated: bool = False


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
    source: Sequence[str], target: Sequence[TargetColumn], method: str, where: str, drift: str = "fail", evolves: bool = False
) -> list[tuple[str, str]]:
    """Pairs (source column, target column), or a SchemaError listing every mismatch. ``drift``: what
    source columns the target lacks do (``evolves``: the sink adds the columns ``evolve`` maps)."""
    if method == "position":
        if len(source) != len(target):
            raise SchemaError(
                f"{where}: the source has {len(source)} columns, the target {len(target)}",
                hint="map_method=position needs the same number of columns; use map_method=name to match by name",
            )
        return [(s, t.name) for s, t in zip(source, target)]
    pairs, unmatched = _by_name(source, target)
    if unmatched and drift == "evolve":
        if not evolves:
            raise ConfigError(f"schema_drift=evolve: {where} cannot add the source's new columns ({', '.join(unmatched)})",
                              key="schema_drift", hint="schema_drift=ignore loads the others; or add them to the target first")
        pairs += [(n, n) for n in unmatched]  # the sink adds them before the load
        unmatched = []
    elif unmatched and drift == "ignore":
        say(f"{where}: schema_drift=ignore: source columns the target lacks are not loaded: {', '.join(unmatched)}")
        unmatched = []
    computed = {c.name for c in target if c.generated}
    if any(t in computed for _, t in pairs):
        say(f"{where}: {', '.join(t for _, t in pairs if t in computed)}: generated on the target (computed there from its own "
            "expression), not written")
        pairs = [(s, t) for s, t in pairs if t not in computed]
    used = {t for _, t in pairs} | computed
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
            hint += (f"; the source has {len(source) - len(target)} more: schema_drift=evolve adds them to the target, "
                     "schema_drift=ignore loads without them, or select the ones to load in source.query")
        elif len(source) == len(target) and not dupes:  # a rename, one for one: the same count maps by position
            hint += "; or, to map the i-th source column onto the i-th target column, map_method=position"
        raise SchemaError(f"{where}: " + "; ".join(problems), hint=hint)
    return pairs
