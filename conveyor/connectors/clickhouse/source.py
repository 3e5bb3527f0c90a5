"""The ClickHouse source (``source=clickhouse``).

A partition's SELECT runs on the server and its rows arrive as Native blocks over HTTP, decoded into
Arrow with numpy and Arrow compute (``conveyor/connectors/clickhouse/native.py``): no value passes
through Python. Planning asks small questions (min, max, quantiles, counts) over the same interface.

Partitions: ``strategy=native`` reads the table's own partitions (``PARTITION BY``), one task each;
the keyed strategies (rangeid, ntile, random) split a column's range, and ``auto`` ranges over the
first column of the sorting key.

Consistency: ClickHouse has no snapshot one reader can share with another. Each partition is one
SELECT over the parts that exist when it starts; rows inserted during the copy may be read by some
partitions and not others (copy a table nobody writes to, or one partition, for a copy as of one
moment). Types: see ``conveyor/connectors/clickhouse/types.py``; a type without an exact Arrow form
is refused by name before a row moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.clickhouse import native
from conveyor.connectors.clickhouse import types as chtypes
from conveyor.connectors.clickhouse.common import CH_DIALECT, ClickHouseConnConfig, literal, qident
from conveyor.core import JobOptions, Partition, SourceInfo
from conveyor.core.partitions import NativePartition, WholeSource
from conveyor.errors import ConveyorError, PlanningError, SchemaError
from conveyor.kit.arrowutil import rebatch
from conveyor.kit.sql import SqlSource


@dataclass
class ClickHouseSourceConfig(ClickHouseConnConfig):
    #: read a table ...
    table: str | None = None
    #: ... or any query
    query: str | None = None
    #: String columns read as bytes (Arrow binary) instead of UTF-8 text (ClickHouse's String holds any bytes)
    binary_columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.table) == bool(self.query):
            raise ValueError("set exactly one of table or query")


class ClickHouseSource(SqlSource):
    """Reads a ClickHouse table or query as Arrow batches; serves the keyed strategies and its own partitions."""

    config_class = ClickHouseSourceConfig
    dialect = CH_DIALECT

    def __init__(self, config: ClickHouseSourceConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._schema = None
        self._cols: tuple[tuple[str, chtypes.ChType], ...] = ()
        self.window = None

    def _from(self) -> str:
        if self.config.table:
            return f"{qident(self.config.database or 'default')}.{qident(self.config.table)}"
        return f"({self.config.query})"

    def _relation(self) -> str:
        cond = self._window_cond(1)[0] if self.window is not None else ""
        return f"(SELECT * FROM {self._from()} WHERE {cond})" if cond else self._from()

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.config.values(sql, doing="planning")

    def _table_facts(self) -> dict[str, str]:
        conf = self.config
        rows = conf.run(f"SELECT engine, partition_key, sorting_key FROM system.tables WHERE database = {literal(conf.database)} "
                        f"AND name = {literal(conf.table)}", doing="describing the source")
        if not rows:
            raise SchemaError(f"clickhouse source: table {conf.database}.{conf.table} does not exist",
                              hint=f"check source.database and source.table on {conf.where()}")
        return dict(zip(("engine", "partition_key", "sorting_key"), rows[0]))

    def describe(self) -> SourceInfo:
        import pyarrow as pa

        conf = self.config
        estimate = size = None
        key: tuple[str, ...] = ()
        if conf.table:
            facts = self._table_facts()
            found = conf.run("SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND "
                             f"database = {literal(conf.database)} AND table = {literal(conf.table)}", doing="describing the source")
            if found and found[0][0].isdigit():
                estimate, size = int(found[0][0]), int(found[0][1])
            key = tuple(k.strip() for k in facts["sorting_key"].split(",") if k.strip())
        cols = conf.run(f"DESCRIBE TABLE (SELECT * FROM {self._from()})", doing="describing the source")
        zone = conf.server_zone()
        self._cols = tuple((c[0], chtypes.parse(c[1])) for c in cols)
        fields = []
        for name, ch in self._cols:
            typ = chtypes.arrow_type(ch, zone, binary=name in conf.binary_columns)
            if typ is None:
                raise chtypes.refusal(name, ch)
            fields.append(pa.field(name, typ, chtypes.nullable(ch)))
        self._schema = pa.schema(fields)
        label = f"clickhouse table {conf.database}.{conf.table}" if conf.table else "clickhouse query"
        names = set(self._schema.names)
        return SourceInfo(schema=self._schema, label=label, estimated_rows=estimate, estimated_bytes=size,
                          reader="Native blocks over HTTP, decoded by numpy and Arrow",
                          primary_key=key if key and all(k in names for k in key) else ())

    def select_sql(self, part: Partition | None) -> str:
        """The partition's SELECT: each String column after its lengths, LowCardinality and Enum as their values."""
        exprs = []
        for name, ch in self._cols:
            q = qident(name)
            base = ch.inner if ch.name == "Nullable" else ch
            if base.name == "LowCardinality":
                q = f"CAST({q} AS {ch.inner.text})"
                base = ch.inner.inner if ch.inner.name == "Nullable" else ch.inner
            if base.name in ("Enum8", "Enum16"):  # the codes (toString would fail on a NULL's hidden code 0), named in read()
                q, base = f"toInt16({q})", chtypes.ChType("Int16")
            if base.name == "String":
                exprs.append(f"toUInt64(ifNull(length({q}), 0)) AS {qident(native.LENGTHS + name)}")
            exprs.append(f"{q} AS {qident(name)}" if q != qident(name) else q)
        where = "" if part is None else self._where(part)
        return f"SELECT {', '.join(exprs)} FROM {self._from()}{where}"

    def _where(self, part: Partition) -> str:
        if isinstance(part, NativePartition):
            cond = part.token.decode()
            if self.window is not None:
                cond = f"({cond}) AND ({self._window_cond(1)[0]})" if cond else self._window_cond(1)[0]
            return f" WHERE {cond}" if cond else ""
        return self._predicate(part)[0]

    def read(self, part: Partition) -> Iterator[Any]:
        import pyarrow as pa

        if self._schema is None:
            self.describe()
        enums = self._enums()
        fields = [pa.field(f.name, pa.int16(), f.nullable) if f.name in enums else f for f in self._schema]
        sql = self.select_sql(part) + " FORMAT Native"
        try:
            with self.config.response(sql, settings={"max_block_size": self.options.batch_size}, doing=f"reading {part.key}",
                                      partition=part.key) as resp:
                batches = native.blocks(native.Stream(resp), fields)
                if enums:
                    batches = (_named(b, enums, self._schema) for b in batches)
                yield from rebatch(pa.RecordBatchReader.from_batches(self._schema, batches), self.options.batch_size)
        except ConveyorError:
            raise
        except Exception as exc:
            raise self.config.translate(exc, f"reading {part.key}", part.key) from None

    def _enums(self) -> dict[str, tuple[list[str], list[int]]]:
        out = {}
        for name, ch in self._cols:
            base = ch
            while base.name in ("Nullable", "LowCardinality"):
                base = base.inner
            if base.name in ("Enum8", "Enum16"):
                out[name] = chtypes.enum_names(base)
        return out

    # --- planning --------------------------------------------------------------------------------

    def native_partitions(self) -> list[NativePartition]:
        """One partition per partition of the table (``PARTITION BY``); one for all of an unpartitioned table or a query."""
        conf = self.config
        expr = self._table_facts()["partition_key"] if conf.table else ""
        if not expr:
            return [NativePartition(index=0, count=1, token=b"", label="the whole source (it has no PARTITION BY)")]
        rows = conf.run(f"SELECT DISTINCT partition FROM system.parts WHERE active AND database = {literal(conf.database)} "
                        f"AND table = {literal(conf.table)} ORDER BY partition", doing="listing the table's partitions")
        if not rows:
            return [NativePartition(index=0, count=1, token=b"1 = 1", label="the whole (empty) table")]
        n = len(rows)
        return [NativePartition(index=i, count=n, token=f"({expr}) = {r[0]}".encode(), label=f"partition {r[0]}")
                for i, r in enumerate(rows)]

    def primary_key(self) -> str | None:
        """The sorting key's first column (``auto`` ranges on it), where it is a column."""
        if not self.config.table:
            return None
        first = self._table_facts()["sorting_key"].split(",")[0].strip()
        if self._schema is None:
            self.describe()
        return first if first in self._schema.names else None

    def key_quantiles(self, column: str, buckets: int, exact: bool) -> list[Any]:
        kind, q = self._key_kind(column), qident(column)
        if buckets <= 1:
            return []
        if kind not in ("integer", "numeric", "temporal"):
            raise PlanningError(f"clickhouse source: {column!r} cannot be split by quantiles (it is not a number, date or time)",
                                hint="use strategy=random or native, or a numeric distribute_key")
        fractions = ", ".join(str(i / buckets) for i in range(1, buckets))
        agg = "quantilesExact" if exact else "quantiles"
        values = self._rows(f"SELECT {agg}({fractions})({q}) FROM {self._relation()}")[0][0] or []
        return sorted(set(values))

    def key_runs(self, column: str, runs: int) -> list[Any]:
        raise PlanningError("clickhouse source: strategy=datadriven needs window functions, which ClickHouse 18.16 lacks",
                            hint="use strategy=native, rangeid, ntile or random")

    def count_rows(self, parts: list[Partition]) -> list[int] | None:
        if any(isinstance(p, NativePartition) for p in parts):
            exprs = [f"countIf({p.token.decode() or '1 = 1'})" for p in parts]  # type: ignore[attr-defined]
            cond = self._window_cond(1)[0] if self.window is not None else ""
            return [int(n) for n in self._rows(f"SELECT {', '.join(exprs)} FROM {self._from()}" + (f" WHERE {cond}" if cond else ""))[0]]
        if any(isinstance(p, WholeSource) for p in parts) and len(parts) == 1:
            return [int(self._rows(f"SELECT count() FROM {self._relation()}")[0][0])]
        return super().count_rows(parts)


def _named(batch: Any, enums: dict[str, tuple[list[str], list[int]]], schema: Any) -> Any:
    """Enum columns' codes replaced by their names (Arrow compute: an index into the names)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = []
    for f, col in zip(schema, batch.columns):
        if f.name in enums:
            names, codes = enums[f.name]
            col = pc.take(pa.array(names, pa.string()), pc.index_in(col, value_set=pa.array(codes, pa.int16())))
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)
