"""``conveyor verify``: does a target hold exactly its source? Any pair of engines, after the fact.

Each side is read once, in parallel (threads, or Ray tasks with ``runtime=ray``), by its own partitions (the job's strategy on the source; the
target read as a source of its engine, split as ``strategy=auto`` splits it), in its snapshot where it
has one. Every row is hashed on the client by DuckDB over the Arrow batch (``hash`` of the row's
values in a canonical Arrow form, so that equal values give equal hashes whatever the engine:
integers as int64, floats as float64, decimals at one scale, timestamps as UTC microseconds, strings
and binaries in one layout) and summed into buckets by a hash of the row's key: the two sides agree
when every bucket has the same count and the same sum. Where buckets differ, the rows of those buckets
only are read again on both sides and joined by key, naming up to ``verify_keys`` keys that are missing,
extra, or whose values differ. With no key (no primary key, no ``verify_key``), one bucket: equal or
not, no keys named.

Choices stated: -0.0 and 0.0 differ (``verify_zero=distinct``; ``equal`` makes them one), every NaN
equals every NaN, NULL and an empty string differ. A column whose types cannot be compared (a uuid
on one side, a text on the other) is refused by name; columns on one side only are named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ConfigError
from conveyor.kit.canonical import canonical, canonical_types

#: buckets of the first pass (a differing bucket is read again, so more buckets read less the second time)
BUCKETS = 1024


@dataclass
class Side:
    """One end as read: its label, rows, and per bucket the rows and the sum of their hashes."""

    label: str
    partitions: int = 0
    rows: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    sums: list[int] = field(default_factory=lambda: [0] * BUCKETS)


@dataclass
class Comparison:
    source: Side
    target: Side
    key: tuple[str, ...]
    columns: tuple[str, ...]
    #: columns one side has and the other lacks ("source only: x", ...)
    unmatched: tuple[str, ...] = ()
    #: (key values, what differs) of up to max_keys keys
    keys: list[tuple[tuple[Any, ...], str]] = field(default_factory=list)
    differing_buckets: int = 0

    @property
    def equal(self) -> bool:
        return not self.differing_buckets and not self.unmatched and self.source.rows == self.target.rows


def target_as_source(spec: Any, written: str | None = None, like: Any = None) -> Any:
    """The job's target read as a source of its engine: the sink's keys the source of that type has, and the keys
    the sink says its read-back needs for rows of schema ``like`` (``Sink.read_back``) (``written``: the table or
    folder a staged load wrote, read instead of the target's own)."""
    from omegaconf import OmegaConf

    from conveyor import registry
    from conveyor.config import build_plugin
    from conveyor.core import sink_capabilities

    name = spec.names["sink"]
    if not sink_capabilities(spec.sink).read_back:
        raise ConfigError(f"conveyor verify: a {name} target cannot be read back: its sink declares no read-back "
                          "(SinkCapabilities.read_back)", key="sink", hint="verify=count checks what each partition stored")
    try:
        cls = registry.load("source", name)
    except Exception:
        raise ConfigError(f"conveyor verify: a {name} target cannot be read back (there is no {name} source)", key="sink") from None
    wanted = {f.name for f in dataclasses.fields(cls.config_class)}
    values = {k: getattr(spec.sink.config, k) for k in wanted if hasattr(spec.sink.config, k)}
    if like is not None:  # what the sink says its read-back needs besides (Sink.read_back)
        values.update({k: v for k, v in getattr(spec.sink, "read_back", lambda _: {})(like).items() if k in wanted})
    values = {k: (OmegaConf.create(v) if isinstance(v, dict | list) else v) for k, v in values.items()}
    if written is not None:
        if "table" in wanted:
            values["table"] = written
        elif "path" in wanted:  # a file sink's staged folder, with its filesystem's protocol
            proto = str(values.get("path", "")).partition("://")
            values["path"] = written if "://" in written or not proto[1] else f"{proto[0]}://{written}"
    options = dataclasses.replace(spec.options, run_id=f"{spec.options.run_id}-target")
    return build_plugin("source", OmegaConf.create({"source": {"type": name, **values}}), options)[1]


@dataclass(frozen=True)
class _Hasher:
    """How one side's rows are hashed: its columns (in the pairs' order), the key's positions among
    them, the canonical types, the zero choice. Picklable: a Ray worker hashes with it too."""

    columns: tuple[str, ...]
    key: tuple[int, ...]
    types: tuple[Any, ...]
    zero: str

    def table(self, batch: Any) -> Any:
        import pyarrow as pa

        arrays = [canonical(batch.column(name), typ, self.zero) for name, typ in zip(self.columns, self.types)]
        return pa.table(arrays, names=[f"c{i}" for i in range(len(arrays))])

    def exprs(self) -> tuple[str, str]:
        cols = ", ".join(f"c{i}" for i in range(len(self.columns)))
        key = ", ".join(f"c{i}" for i in self.key) if self.key else "1"
        return f"hash({key}) % {BUCKETS}", f"hash({cols})"


def _sums(hasher: _Hasher, session: Any, part: Any) -> tuple[int, dict[int, tuple[int, int]]]:
    """One partition's rows, and per bucket its rows and the sum of their hashes (DuckDB over each Arrow batch)."""
    import duckdb

    bucket, row = hasher.exprs()
    rows, out = 0, {}
    con = duckdb.connect(config={"threads": 1})
    try:
        for batch in session.read(part):
            con.register("b", hasher.table(batch))
            for k, n, total in con.execute(f"SELECT {bucket} AS k, count(*), sum({row}::HUGEINT) FROM b GROUP BY k").fetchall():
                had = out.get(int(k), (0, 0))
                out[int(k)] = (had[0] + n, had[1] + int(total))
                rows += n
            con.unregister("b")
    finally:
        con.close()
    return rows, out


def _rows_in(hasher: _Hasher, buckets: tuple[int, ...], session: Any, part: Any) -> Any:
    """(key columns..., row hash) of one partition's rows in ``buckets``, as an Arrow table (None: none)."""
    import duckdb
    import pyarrow as pa

    bucket, row = hasher.exprs()
    keys = ", ".join(f"c{i}" for i in hasher.key)
    got = []
    con = duckdb.connect(config={"threads": 1})
    try:
        for batch in session.read(part):
            con.register("b", hasher.table(batch))
            got.append(con.execute(f"SELECT {keys}, {row} AS h FROM b WHERE {bucket} IN ({', '.join(map(str, buckets))})").to_arrow_table())
            con.unregister("b")
    finally:
        con.close()
    return pa.concat_tables(got) if got else None


def _each_partition(source: Any, partitions: list[Any], degree: int, work: Any, runtime: Any, opened: bool = False) -> list[Any]:
    """``work(session, partition)`` of every partition, in the source's session (its snapshot; ``opened``: the
    source is one already, the job's), ``degree`` at once on the job's runtime (``Runtime.each``: this process's
    threads, or Ray tasks named by their partition)."""
    with (contextlib.nullcontext(source) if opened else source.session()) as session:
        return runtime.each(functools.partial(work, session), partitions, degree, [f"conveyor verify {p.key}" for p in partitions])


def compare(spec: Any, key: list[str] | None = None, max_keys: int = 20, zero: str = "distinct", opened: Any = None,
            partitions: list[Any] | None = None, written: str | None = None) -> Comparison:
    """Read both ends of ``spec`` and compare them (see the module's docstring). In a run (verify=checksum):
    ``opened`` is the job's source in its session (its snapshot), ``partitions`` its plan, ``written`` what a
    staged load wrote, compared before it is made visible."""
    import os

    from conveyor.core import JobOptions, PlanRequest
    from conveyor.strategies.auto import AutoStrategy
    from conveyor.strategies.basic import FilesStrategy

    degree = JobOptions.resolve_degree(spec.options.degree, os.cpu_count())
    if opened is None:  # conveyor verify: each end read as it reads beside the other (one engine: values Arrow cannot hold as text)
        read = _keeping(spec.source)
        target = _keeping(target_as_source(spec, written, read.describe().schema))
        read, target = _comparing(read, target), _comparing(target, read)
    else:
        read = opened
    sinfo = read.describe()
    if opened is not None:
        target = _keeping(target_as_source(spec, written, sinfo.schema))
    tinfo = target.describe()
    tnames = {n.lower(): n for n in tinfo.schema.names}
    pairs = [(n, tnames[n.lower()]) for n in sinfo.schema.names if n.lower() in tnames]
    snames = {n.lower() for n in sinfo.schema.names}
    unmatched = tuple([f"source only: {n}" for n in sinfo.schema.names if n.lower() not in tnames]
                      + [f"target only: {n}" for n in tinfo.schema.names if n.lower() not in snames])
    key_cols = list(key or sinfo.primary_key or _one_column_key(spec.source))
    missing = [k for k in key_cols if k not in dict(pairs)]
    if missing:
        raise ConfigError(f"verify_key: {', '.join(missing)} is not a column both sides have", key="verify_key")
    types = canonical_types(sinfo.schema, tinfo.schema, pairs)
    key_index = [i for i, (s, _) in enumerate(pairs) if s in key_cols]
    key_index.sort(key=lambda i: key_cols.index(pairs[i][0]))
    result = Comparison(Side(sinfo.label), Side(tinfo.label), tuple(key_cols), tuple(s for s, _ in pairs), unmatched)
    runtime = spec.runtime if spec.runtime is not None else _threads()  # the partitions read where the job runs its tasks
    sides = []
    for side, source, info, names, strategy in (
            (result.source, read, sinfo, [s for s, _ in pairs], spec.strategy),
            (result.target, target, tinfo, [t for _, t in pairs],
             FilesStrategy(FilesStrategy.config_class(), spec.options) if hasattr(target, "list_files")
             else AutoStrategy(AutoStrategy.config_class(), spec.options))):
        if source is opened and partitions is not None:
            parts = list(partitions)
        else:
            with source.session() as session:
                parts = list(strategy.plan(PlanRequest(source=session, info=info, degree=degree)).partitions)
        side.partitions = len(parts)
        hasher = _Hasher(tuple(names), tuple(key_index), tuple(types), zero)
        for rows, buckets in _each_partition(source, parts, degree, functools.partial(_sums, hasher), runtime, source is opened):
            side.rows += rows
            for k, (n, total) in buckets.items():
                side.counts[k] += n
                side.sums[k] += total
        sides.append((source, parts, hasher))
    differing = [k for k in range(BUCKETS) if (result.source.counts[k], result.source.sums[k]) != (result.target.counts[k], result.target.sums[k])]
    result.differing_buckets = len(differing)
    if differing and key_cols:
        result.keys = _differing_keys(sides, tuple(differing), degree, max_keys, runtime, opened is not None)
    return result


def _keeping(source: Any) -> Any:
    """A side read with +/-infinity passed on (a timestamp's or a date's farthest value) where its source refuses it by
    default: both sides hash it alike (PostgreSQL's and DuckDB's infinity are one value), and a copy that kept it compares."""
    from conveyor.core import INFINITY

    keeping = getattr(source, "keeping", None)
    return keeping((INFINITY,)) if keeping is not None else source


def _threads() -> Any:
    """A job built without its runtime (``kinds``): this process's threads."""
    from conveyor.core import RuntimeBase

    return RuntimeBase()


def _comparing(source: Any, other: Any) -> Any:
    """``source`` as it reads beside ``other`` (``SourceBase.comparing``; a source without it as it is)."""
    comparing = getattr(source, "comparing", None)
    return comparing(other) if comparing is not None else source


def _one_column_key(source: Any) -> list[str]:
    """A source's one-column primary key where it says it only that way (``primary_key()``: MySQL, DuckDB)."""
    with_key = getattr(source, "primary_key", None)
    try:
        found = with_key() if callable(with_key) else None
    except Exception:  # a query source, a table with none
        found = None
    return [found] if isinstance(found, str) else []


def _differing_keys(sides: list[tuple[Any, list[Any], _Hasher]], buckets: tuple[int, ...], degree: int, max_keys: int,
                    runtime: Any, opened: bool) -> list[tuple[tuple[Any, ...], str]]:
    """The rows of the differing buckets, read again on both sides and joined by key."""
    import duckdb
    import pyarrow as pa

    tables = []
    for i, (source, parts, hasher) in enumerate(sides):
        got = [t for t in _each_partition(source, parts, degree, functools.partial(_rows_in, hasher, buckets), runtime, opened and i == 0)
               if t is not None]
        tables.append(pa.concat_tables(got) if got else None)
    con = duckdb.connect()
    try:
        keys = [f"c{i}" for i in sides[0][2].key]
        for name, table in zip(("s", "t"), tables):
            if table is None:
                con.execute(f"CREATE TABLE {name} AS SELECT {', '.join(f'NULL AS {k}' for k in keys)}, NULL::UBIGINT AS h WHERE false")
            else:
                con.register(f"{name}_arrow", table)
                con.execute(f"CREATE TABLE {name} AS SELECT * FROM {name}_arrow")
        on = " AND ".join(f"s.{k} IS NOT DISTINCT FROM t.{k}" for k in keys)
        rows = con.execute(
            f"SELECT {', '.join(f'coalesce(s.{k}, t.{k})' for k in keys)}, "
            "CASE WHEN t.h IS NULL THEN 'missing from the target' WHEN s.h IS NULL THEN 'not in the source' ELSE 'values differ' END "
            f"FROM (SELECT {', '.join(keys)}, h, count(*) AS n FROM s GROUP BY ALL) s "
            f"FULL JOIN (SELECT {', '.join(keys)}, h, count(*) AS n FROM t GROUP BY ALL) t ON {on} AND s.h = t.h AND s.n = t.n "
            f"WHERE s.h IS NULL OR t.h IS NULL ORDER BY 1 LIMIT {int(max_keys) * 2}").fetchall()
    finally:
        con.close()
    found: dict[tuple[Any, ...], str] = {}
    for row in rows:  # a key whose values differ is in both lists: once, as that
        k, what = tuple(row[:-1]), row[-1]
        found[k] = "values differ" if k in found else what
    return list(found.items())[:max_keys]


def verify_job(cfg: Any, console: Any) -> int:
    """``conveyor verify``: the comparison of the job ``cfg`` describes, printed; 0 when equal, else a
    VerificationError (exit 6) naming what differs."""
    from rich.table import Table

    from conveyor.config import build_job
    from conveyor.errors import VerificationError

    if cfg.get("verify_zero", "distinct") not in ("equal", "distinct"):
        raise ConfigError(f"verify_zero: {cfg.get('verify_zero')!r} is not equal or distinct", key="verify_zero")
    spec = build_job(cfg)
    key = list(cfg.get("verify_key") or []) or None
    result = compare(spec, key=key, max_keys=int(cfg.get("verify_keys", 20)), zero=str(cfg.get("verify_zero", "distinct")))
    table = Table(title="conveyor verify", title_justify="left")
    for name in ("side", "read as", "partitions", "rows"):
        table.add_column(name, justify="right" if name in ("partitions", "rows") else "left")
    for name, side in (("source", result.source), ("target", result.target)):
        table.add_row(name, side.label, str(side.partitions), f"{side.rows:,}")
    from conveyor.cliout import print_table

    print_table(console, table)
    keyed = f"by key ({', '.join(result.key)})" if result.key else "as one multiset (no key: no primary key, no verify_key)"
    if result.equal:
        console.print(f"equal: {result.source.rows:,} rows, {len(result.columns)} columns compared {keyed}", markup=False, highlight=False)
        return 0
    what = []
    if result.unmatched:
        what.append("columns on one side only: " + ", ".join(result.unmatched))
    if result.source.rows != result.target.rows:
        what.append(f"{result.source.rows:,} rows in the source, {result.target.rows:,} in the target")
    if result.differing_buckets:
        what.append(f"rows differ ({keyed})")
    for key_values, how in result.keys:
        console.print(f"  key {', '.join(map(str, key_values))}: {how}", markup=False, highlight=False)  # a key's text as it is
    raise VerificationError("the target differs from the source: " + "; ".join(what),
                            hint=(f"the first {len(result.keys)} differing key(s) are listed above" if result.keys else
                                  "set verify_key=[columns] to name the rows that differ"))
