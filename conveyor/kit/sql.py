"""SQL sources' shared parts: partitions as WHERE clauses, a dialect object, and :class:`SqlSource`,
which answers the keyed strategies' questions and counts partitions once for every SQL engine."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from conveyor.core import CursorWindow, KeyRange, KeyStats, ModuloBucket, Partition, SourceBase, SourceTable, ValueSet, WholeSource
from conveyor.errors import PlanningError, SchemaError


def pick_tables(found: list[tuple[SourceTable, bool]], patterns: list[str], exclude: list[str], schema: str,
                where: str) -> list[SourceTable]:
    """The tables ``source.tables`` names, less ``exclude``, largest first.

    ``found``: every relation of the database with whether it is a table (views, foreign tables
    and materialized views are read only when named exactly). A pattern without a schema is one of
    ``schema``; ``*``, ``?`` and ``[...]`` match as in shell globs. A name without wildcards that
    matches nothing is an error, and so is a job left with no table. Conveyor's own tables
    (``_conveyor_*``: markers, staging) are never matched by a wildcard."""
    import fnmatch

    def full(pattern: str) -> str:
        return pattern if "." in pattern else f"{schema}.{pattern}"

    picked: dict[str, SourceTable] = {}
    for pattern in patterns:
        exact = not any(ch in pattern for ch in "*?[")
        hits = [t for t, is_table in found if fnmatch.fnmatchcase(t.qualified, full(pattern))
                and (exact or (is_table and not t.name.startswith("_conveyor_")))]
        if exact and not hits:
            raise SchemaError(f"source.tables: {full(pattern)} is not a table on {where}",
                              hint="check the name (schema.table; a bare name is one of source.schema)")
        picked.update((t.qualified, t) for t in hits)
    for pattern in exclude:
        picked = {k: t for k, t in picked.items() if not fnmatch.fnmatchcase(k, full(pattern))}
    if not picked:
        raise SchemaError(f"source.tables: {', '.join(patterns)} (less {', '.join(exclude) or 'nothing'}) names no table on {where}",
                          hint="check the patterns: schema.table, with * and ? as in shell globs")
    return sorted(picked.values(), key=lambda t: (-t.bytes, t.qualified))


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


# --- one SQL base for every SQL source: a dialect, and the keyed-strategy questions asked once --------


class Dialect:
    """How one SQL engine spells what planning and verification ask. Subclass and override what
    differs; a source names its dialect in :attr:`SqlSource.dialect`."""

    name = "sql"
    #: values bound as parameters; False: rendered as literals by :meth:`literal` (for statements
    #: that take no parameters, such as PostgreSQL's COPY)
    binds = True

    def quote(self, name: str) -> str:
        """An identifier, double-quoted with embedded quotes doubled (standard SQL)."""
        return '"' + name.replace('"', '""') + '"'

    def placeholder(self, i: int) -> str:
        """The ``i``-th (1-based) parameter's placeholder."""
        return "?"

    def literal(self, value: Any) -> str:
        raise NotImplementedError(f"the {self.name} dialect binds parameters")

    def quantiles(self, column: str, fractions: str, relation: str) -> str | None:
        """One row, one array: the values at ``fractions`` (a comma-separated list) of ``column``;
        None where the engine has no such aggregate (an exact NTILE is used instead)."""
        return None

    def count_where(self, cond: str) -> str:
        return f"count(*) FILTER (WHERE {cond})"


class SqlSource(SourceBase):
    """``SupportsKeys`` and ``SupportsPartitionCounts`` written once for SQL sources (PostgreSQL,
    DuckDB, any ADBC driver). A connector gives its :attr:`dialect` and three things:
    :meth:`_relation` (what to select from), :meth:`_rows` (run a planning query, in the job's
    snapshot where there is one) and, where its Arrow schema does not say it, :meth:`_key_kind`
    (a column's kind, refusing an unknown column)."""

    dialect: Dialect = Dialect()

    def _relation(self) -> str:
        raise NotImplementedError

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    #: the source's Arrow schema once :meth:`describe` has run (read by the default :meth:`_key_kind`)
    _schema: Any = None

    def _key_kind(self, column: str) -> str:
        """integer | numeric | temporal | other; raises SchemaError naming the columns when unknown.
        By default from the Arrow type in the schema the source describes."""
        if self._schema is None:
            self.describe()  # type: ignore[attr-defined]  # every source describes itself (core.Source)
        if column not in self._schema.names:
            raise SchemaError(f"{self.dialect.name} source: distribute_key {column!r} is not a column of the source",
                              hint=f"columns are: {', '.join(self._schema.names)}")
        return key_kind(self._schema.field(column).type)

    def _sample(self) -> str:
        """A clause after the relation that samples it for approximate quantiles ("" : every row)."""
        return ""

    def _predicate(self, part: Partition, first: int = 1) -> tuple[str, list[Any]]:
        """The partition as ``(" WHERE ...", parameters)``, placeholders numbered from ``first``,
        kept to the incremental window when there is one."""
        d = self.dialect
        render = None if d.binds else d.literal
        where, params = where_clause(part, d.quote, lambda i: d.placeholder(first - 1 + i), engine=d.name, render=render)
        if self.window is None:
            return where, params
        cond, more = self._window_cond(first + len(params))
        base = where.removeprefix(" WHERE ")
        return (f" WHERE ({base}) AND ({cond})" if base else f" WHERE {cond}"), params + more

    # --- incremental loads: the rows past a cursor ----------------------------------------------

    #: incremental.cursor: only the rows of this window are read, counted and checksummed (planning
    #: queries see every row: a plan over the whole key space, each partition kept to the window)
    window: CursorWindow | None = None

    def cursor_max(self, column: str) -> Any:
        """The cursor's highest value (in the job's snapshot where the source holds one)."""
        self._check_cursor(column)
        return self._rows(f"SELECT max({self.dialect.quote(column)}) FROM {self._relation()}")[0][0]

    def windowed(self, window: CursorWindow) -> Any:
        self._check_cursor(window.column)
        kept = copy.copy(self)
        kept.window = window
        return kept

    def _check_cursor(self, column: str) -> None:
        import pyarrow.types as t

        self._key_kind(column)  # refuses an unknown column by name
        typ = self._schema.field(column).type if self._schema is not None and column in self._schema.names else None
        if typ is not None and not (t.is_integer(typ) or t.is_timestamp(typ) or t.is_date(typ) or t.is_decimal(typ)):
            raise SchemaError(f"incremental.cursor: column {column!r} is {typ}: a cursor is a timestamp, a date or an increasing integer",
                              hint="pick an updated_at / id column")

    def _window_cond(self, first: int) -> tuple[str, list[Any]]:
        """``low < cursor <= high`` with its parameters (literals where the dialect binds none)."""
        w, d = self.window, self.dialect
        assert w is not None
        if w.empty:
            return "1 = 0", []
        params: list[Any] = []

        def bind(value: Any) -> str:
            if not d.binds:
                return d.literal(value)
            params.append(value)
            return d.placeholder(first - 1 + len(params))

        q = d.quote(w.column)
        cond = (f"{q} > {bind(w.low)} AND " if w.low is not None else "") + f"{q} <= {bind(w.high)}"
        return cond, params

    def key_stats(self, column: str) -> KeyStats:
        kind, q = self._key_kind(column), self.dialect.quote(column)
        lo, hi, rows, nonnull = self._rows(f"SELECT min({q}), max({q}), count(*), count({q}) FROM {self._relation()}")[0]
        return KeyStats(column, kind, lo, hi, rows, rows - nonnull)

    def key_quantiles(self, column: str, buckets: int, exact: bool) -> list[Any]:
        kind, q = self._key_kind(column), self.dialect.quote(column)
        if buckets <= 1:
            return []
        if not exact:
            if kind not in ("integer", "numeric", "temporal"):
                raise PlanningError(f"{column!r} cannot be balanced by sampling", hint="use strategy=ntile")
            fractions = ", ".join(str(i / buckets) for i in range(1, buckets))
            sql = self.dialect.quantiles(q, fractions, f"{self._relation()} {self._sample()}".rstrip())
            if sql is not None:
                return list(self._rows(sql)[0][0] or [])
        rows = self._rows(f"SELECT min(k) FROM (SELECT {q} AS k, ntile({int(buckets)}) OVER (ORDER BY {q}) AS b "
                          f"FROM {self._relation()} WHERE {q} IS NOT NULL) AS t GROUP BY b ORDER BY b")
        return [r[0] for r in rows[1:]]

    def key_values(self, column: str, limit: int | None = None) -> list[tuple[Any, int]]:
        self._key_kind(column)
        q = self.dialect.quote(column)
        rows = self._rows(f"SELECT {q}, count(*) FROM {self._relation()} GROUP BY {q} ORDER BY {q} NULLS FIRST"
                          + (f" LIMIT {int(limit)}" if limit is not None else ""))
        return [(r[0], int(r[1])) for r in rows]

    def key_runs(self, column: str, runs: int) -> list[Any]:
        """The values that start runs 2..n of the sorted distinct values, about equal in rows, computed by
        the database (a window over the grouped values): the driver receives ``runs`` values, whatever
        the number of distinct ones. NULLs are in no run's count (they go with the first range)."""
        self._key_kind(column)
        q, n = self.dialect.quote(column), int(runs)
        grouped = f"SELECT {q} AS v, count(*) AS c FROM {self._relation()} WHERE {q} IS NOT NULL GROUP BY {q}"
        run = f"floor((sum(c) OVER (ORDER BY v) - c) * {n} / sum(c) OVER ())"
        rows = self._rows(f"SELECT min(v) FROM (SELECT v, {run} AS b FROM ({grouped}) AS g) AS w WHERE b > 0 GROUP BY b ORDER BY 1")
        return [r[0] for r in rows][: n - 1]

    def query_values(self, query: str) -> list[Any]:
        return [r[0] for r in self._rows(query)]

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        """Each partition's row count, in one scan per 200 partitions."""
        out: list[int] = []
        for i in range(0, len(parts), 200):
            exprs, params = [], []
            for p in parts[i:i + 200]:
                where, ps = self._predicate(p, len(params) + 1)
                exprs.append(self.dialect.count_where(where.removeprefix(" WHERE ") or "1 = 1"))
                params += ps
            out += [int(n) for n in self._rows(f"SELECT {', '.join(exprs)} FROM {self._relation()}", params or None)[0]]
        return out
