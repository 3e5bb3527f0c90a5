"""The ClickHouse sink (``sink=clickhouse``): Native blocks over HTTP into a table per partition, moved into
the target whole (append) or swapped in at the end (truncate, create, replace); see ``commits.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.clickhouse import commits, native
from conveyor.connectors.clickhouse import types as chtypes
from conveyor.connectors.clickhouse.chsync import ChChangeApplier
from conveyor.connectors.clickhouse.common import ClickHouseConnConfig, literal, qident
from conveyor.core import (
    JobOptions,
    Partition,
    PrepareRequest,
    SinkBase,
    SinkCapabilities,
    SinkPlan,
    TargetInfo,
    WriteStats,
    check_partition_rows,
    check_stored,
    columns_only,
    target_for,
)
from conveyor.errors import ConfigError, ConveyorError, SchemaError, TransferError
from conveyor.kit import guard
from conveyor.kit.mapping import TargetColumn, map_columns
from conveyor.kit.merge import MergeOptions
from conveyor.kit.staged import check_mode, check_taken, staged_path
from conveyor.log import say, warn


@dataclass
class ClickHouseSinkConfig(MergeOptions, ClickHouseConnConfig):
    #: the target table (a template with {table} / {schema} for a job over several tables)
    table: str = ""
    #: create / replace: the sorting key (ORDER BY); null: the source's primary key, else none (tuple())
    order_by: list[str] | None = None
    #: create / replace: a PARTITION BY expression, e.g. toYYYYMM(o_orderdate)
    partition_by: str | None = None
    #: create / replace: the table engine (a MergeTree family engine; ATTACH PARTITION needs one)
    engine: str = "MergeTree"
    #: source columns whose values may change type by ClickHouse's own rules (the cast policy's overrides)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.table:
            raise ValueError("table: name the target table")
        if "MergeTree" not in self.engine:
            raise ValueError(f"engine: {self.engine!r} is not a MergeTree engine (partitions are moved in with ATTACH PARTITION)")
        self.check_merge_options()


@dataclass(frozen=True)
class ChPlan:
    """The ClickHouse sink's own decisions: the tables' definition and the columns rows are written into."""

    #: CREATE TABLE {name} ... for a partition's table (and the job's stage): the target's own definition
    create: str
    #: (target column, its ClickHouse type) in the order of the source's columns
    columns: tuple[tuple[str, str], ...]
    once: commits.Once
    #: merge: the columns that identify a row, and whether the target's rows the source lacks are deleted
    merge_keys: tuple[str, ...] = ()
    merge_delete: bool = False


class ClickHouseSink(ChChangeApplier, SinkBase):
    """Appends whole partitions (ATTACH PARTITION from a table each); truncate/create/replace swap in at the end."""

    config_class = ClickHouseSinkConfig
    capabilities = SinkCapabilities(load_modes=("truncate", "append", "create", "replace", "merge"), read_back=True)

    def __init__(self, config: ClickHouseSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def for_target(self, schema: str, table: str, options: JobOptions) -> ClickHouseSink:
        return ClickHouseSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    def _q(self, table: str | None = None) -> str:
        return f"{qident(self.config.database or 'default')}.{qident(table or self.config.table)}"

    def _where(self) -> str:
        return f"clickhouse table {self.config.database}.{self.config.table}"

    def _columns(self, table: str | None = None) -> list[tuple[str, str, str]]:
        """(name, type, default kind) of a table's columns; [] where it does not exist."""
        return [(r[0], r[1], r[2]) for r in self.config.run(
            f"SELECT name, type, default_kind FROM system.columns WHERE database = {literal(self.config.database)} "
            f"AND table = {literal(table or self.config.table)}", doing="reading the target")]

    def describe_target(self, request: PrepareRequest) -> TargetInfo:
        mode = self.options.load_mode
        how = "Native blocks over HTTP into a table per partition"
        path = (f"{how}, each moved into the target whole (ATTACH PARTITION) once counted" if mode == "append" else
                f"{how} into a staging table, then the target's partitions its keys touch rebuilt and swapped in one by one "
                "(REPLACE PARTITION)" if mode == "merge" else
                staged_path(mode, how).replace("made the target's in one transaction", "swapped in (RENAME TABLE)"))
        return TargetInfo(label=self._where(), checks_before_commit=mode == "append", path=path)

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        commits.ensure_tables(self.config)
        commits.hold_guard(self.config, self.options.run_id, self.options.load)
        try:
            return self._prepare(request)
        except BaseException:
            guard.release(self.options.run_id)
            raise

    def _prepare(self, request: PrepareRequest) -> SinkPlan:
        schema, mode, where = request.schema, self.options.load_mode, self._where()
        existing = self._columns()
        check_mode(mode, bool(existing), where)
        if mode in ("create", "replace"):
            pairs = [(n, n) for n in schema.names]
            create, columns = self._definition(schema, request)
            probe = self._q(f"{commits.STAGE_PREFIX}{self.options.run_id}")  # the definition tried before a row moves
            self.config.run(f"DROP TABLE IF EXISTS {probe}", create.format(table=probe), f"DROP TABLE {probe}", doing=f"load_mode={mode}")
        else:
            engine = self.config.run(f"SELECT engine FROM system.tables WHERE database = {literal(self.config.database)} "
                                     f"AND name = {literal(self.config.table)}", doing="reading the target")[0][0]
            if "MergeTree" not in engine:
                raise SchemaError(f"{where} is a {engine} table: Conveyor moves partitions in with ATTACH PARTITION, which needs "
                                  "a MergeTree family engine", hint="load into a MergeTree table")
            target = [TargetColumn(n, t, t.startswith("Nullable("), kind != "") for n, t, kind in existing]
            pairs = map_columns(schema.names, target, self.options.map_method, where, self.options.schema_drift)
            types = {n: t for n, t, _ in existing}
            columns = tuple((t, types[t]) for _, t in pairs)
            self._check_casts(pairs, schema, types)
            create = f"CREATE TABLE {{table}} AS {self._q()}"
        keys = self._merge_keys([t for _, t in pairs]) if mode == "merge" else ()
        once = commits.Once(f"{self.config.database}.{self.config.table}", self.options.load, self.options.run_id)
        said = columns_only(request.info, key_as="its ORDER BY" if self.config.order_by is None else "") if mode in ("create", "replace") else ""
        if said:
            say(f"{where}: {said}")
        return SinkPlan(definition=said, rows_before=None if mode == "append" else 0, target=f"{self.config.where()}.{self.config.table}",
                        write_target=self.config.table if mode == "append" else f"{commits.STAGE_PREFIX}{self.options.run_id}",
                        load_mode=mode, columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs), schema=schema,
                        own=ChPlan(create, columns, once, keys, self.config.merge_delete == "hard"), checks_before_commit=mode == "append")

    def _merge_keys(self, mapped: list[str]) -> tuple[str, ...]:
        """merge: the keys (sink.merge_keys, else the target's sorting key), checked; what ClickHouse's merge does not do
        refused by name."""
        from conveyor.kit.merge import plan as merge_plan

        conf, where = self.config, self._where()
        if conf.merge_update is not None or conf.merge_delete == "soft":
            raise ConfigError(f"load_mode=merge into {where}: a matched row takes every column of the source here (a partition is "
                              "rebuilt with the source's rows); merge_update and merge_delete=soft are not offered",
                              key="sink.merge_update", hint="leave sink.merge_update unset (and merge_delete none or hard)")
        sorting = self.config.run(f"SELECT sorting_key FROM system.tables WHERE database = {literal(conf.database)} "
                                  f"AND name = {literal(conf.table)}", doing="reading the target")[0][0]
        primary = [k.strip() for k in sorting.split(",") if k.strip()] if sorting and "(" not in sorting else []
        return merge_plan(conf, primary, mapped, [n for n, _, _ in self._columns()], where).keys

    def _definition(self, schema: Any, request: PrepareRequest) -> tuple[str, tuple[tuple[str, str], ...]]:
        conf = self.config
        key = list(conf.order_by) if conf.order_by is not None else [k for k in request.info.primary_key if k in schema.names]
        unknown = [k for k in key if k not in schema.names]
        if unknown:
            raise ConfigError(f"sink.order_by: {', '.join(unknown)} is not a column of the source", key="sink.order_by",
                              hint=f"columns are: {', '.join(schema.names)}")
        # the sorting key and the columns the partition expression names cannot be Nullable: a NULL in them is refused by name
        import re

        named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", conf.partition_by or "")) | set(key)
        columns = tuple((f.name, chtypes.created_type(f, f.name, f.name in named)) for f in schema)
        cols = ", ".join(f"{qident(n)} {t}" for n, t in columns)
        order = ", ".join(qident(k) for k in key) or "tuple()"
        part = f" PARTITION BY {conf.partition_by}" if conf.partition_by else ""
        if conf.order_by is None and key:
            say(f"{self._where()}: ORDER BY {', '.join(key)} (the source's primary key)")
        return f"CREATE TABLE {{table}} ({cols}) ENGINE = {conf.engine}{part} ORDER BY ({order})", columns

    def _check_casts(self, pairs: list[tuple[str, str]], schema: Any, types: dict[str, str]) -> None:
        """The cast policy (conveyor/kit/casts.py) against the Arrow types the target's columns read as."""
        from conveyor.kit.casts import ColumnType, check_casts

        zone = self.config.server_zone()
        sources, targets = [], []
        for s, t in pairs:
            ch = chtypes.parse(types[t])
            typ = chtypes.read_arrow(ch, zone)
            src = schema.field(s).type
            if typ is None:
                raise SchemaError(f"{self._where()}: column {t} ({types[t]}): Conveyor does not write this type",
                                  hint="load into a column of another type, or leave the column out (columns / schema_drift)")
            if ch.name in ("DateTime",) or (ch.name == "Nullable" and ch.inner.name == "DateTime"):
                import pyarrow as pa

                if pa.types.is_timestamp(src) and not src.tz:  # a time without a zone is stored as that UTC time (documented)
                    typ = pa.timestamp("s")
            if ch.name == "UInt8" and str(src) == "bool":
                typ = src
            sources.append(ColumnType.of_field(schema.field(s)))
            targets.append(ColumnType(typ, sql=types[t]))
        check_casts(pairs, sources, targets, self._where(), self.config.allow_cast, engine="ClickHouse")

    # --- the tasks -------------------------------------------------------------------------------

    def read_back(self, like: Any) -> dict[str, Any]:
        """Binary columns were written into String columns as their bytes: read back as bytes (not as text, which they
        need not be)."""
        import pyarrow as pa

        raw = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
        return {"binary_columns": [f.name for f in like if any(test(f.type) for test in raw)]}

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} this load committed (append) or staged (and whose table is still there)."""
        once: commits.Once = plan.own.once
        found = commits.states(self.config, once.load_id, once.target)
        state = "committed" if plan.load_mode == "append" else "staged"
        done = {k: s[state] for k, s in found.items() if state in s}
        if state == "staged" and done:
            have = {r[0] for r in self.config.run(f"SELECT name FROM system.tables WHERE database = {literal(self.config.database)} "
                                                  f"AND startsWith(name, '{commits.PART_PREFIX}')", doing="reading staged partitions")}
            done = {k: n for k, n in done.items() if commits.part_table(once.load_id, once.target, k) in have}
        return done

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        start = time.perf_counter()
        own: ChPlan = plan.own
        once, key, conf = own.once, part.key, self.config
        found = commits.states(conf, once.load_id, once.target).get(key, {})
        done = found.get("committed" if plan.load_mode == "append" else "staged")
        table = commits.part_table(once.load_id, once.target, key)
        if done is not None and (plan.load_mode == "append" or self._exists(table)):
            return WriteStats(key, done, 0, time.perf_counter() - start, already_committed=True)
        if "attaching" in found and plan.load_mode == "append":
            return self._finish_attach(plan, key, table, found["attaching"], start)
        conf.run(f"DROP TABLE IF EXISTS {self._q(table)}", own.create.format(table=self._q(table)), partition=key,
                 doing=f"creating {table}")
        try:
            sent = _Sent()
            cols = ", ".join(qident(c) for c, _ in own.columns)
            with conf.response(f"INSERT INTO {self._q(table)} ({cols}) FORMAT Native", body=sent.blocks(batches, own.columns),
                               doing=f"writing {key}", partition=key) as resp:
                resp.read()
            stored = int(conf.run(f"SELECT count() FROM {self._q(table)}", partition=key, doing="counting")[0][0])
            check_stored(once.target, key, sent.rows, stored)
            check_partition_rows(once.target, key, plan.expecting, stored)
            commits.check_running(conf, once.run_id, key)
            if plan.load_mode != "append":
                commits.mark(conf, once, key, "staged", stored)
                return WriteStats(key, stored, sent.bytes, time.perf_counter() - start)
        except BaseException:
            with contextlib.suppress(Exception):
                conf.run(f"DROP TABLE IF EXISTS {self._q(table)}")
            raise
        # recorded outside the clean-up above: an attempt stopped while this record was being written (its worker told to
        # stop) may have written it, and then the partition's table must stay, for the next attempt to finish the move
        # (an "attaching" record whose table is gone cannot be told from one whose rows were moved in)
        commits.mark(conf, once, key, "attaching", stored)
        self._attach(table, self.config.table, key)
        commits.mark(conf, once, key, "committed", stored)
        with contextlib.suppress(ConveyorError):
            conf.run(f"DROP TABLE IF EXISTS {self._q(table)}")
        return WriteStats(key, stored, sent.bytes, time.perf_counter() - start)

    def _finish_attach(self, plan: SinkPlan, key: str, table: str, rows: int, start: float) -> WriteStats:
        """An earlier attempt was stopped between its ATTACH and its record: the server's query log says which of
        the partition's parts it moved in; the rest are moved now, then it is recorded (see commits.py)."""
        once: commits.Once = plan.own.once

        def unknown(why: str) -> TransferError:
            return TransferError(f"partition {key}: an earlier attempt was stopped while moving its {rows:,} rows into "
                                 f"{once.target}, and {why}: whether they are there cannot be told", partition=key,
                                 hint=f"check the target; the rows are kept in {table}: attach them (ALTER TABLE ... ATTACH "
                                      "PARTITION ... FROM) or drop that table, then run again without resume")
        if not self._exists(table):
            raise unknown(f"its table {table} is gone")
        try:
            outcomes = commits.attach_outcomes(self.config, self._q(table))
        except ConveyorError as exc:
            raise unknown(f"the server's query log cannot say ({exc})") from None
        if "unknown" in outcomes.values():
            raise unknown("the server's query log shows an ATTACH that neither finished nor failed")
        commits.check_running(self.config, once.run_id, key)
        self._attach(table, self.config.table, key, skip={i for i, o in outcomes.items() if o == "done"})
        commits.mark(self.config, once, key, "committed", rows)
        with contextlib.suppress(ConveyorError):
            self.config.run(f"DROP TABLE IF EXISTS {self._q(table)}")
        return WriteStats(key, rows, 0, time.perf_counter() - start)

    def _exists(self, table: str, doing: str = "reading the target") -> bool:
        return bool(self.config.run(f"SELECT count() FROM system.tables WHERE database = {literal(self.config.database)} "
                                    f"AND name = {literal(table)}", doing=doing)[0][0] != "0")

    def _attach(self, source: str, target: str, key: str | None = None, skip: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Each partition of ``source`` into ``target`` (the statements logged: see commits.attach_outcomes)."""
        ids = self.config.run(f"SELECT DISTINCT partition_id FROM system.parts WHERE active AND database = {literal(self.config.database)} "
                              f"AND table = {literal(source)}", doing="listing a partition's parts", partition=key)
        steps = [f"ALTER TABLE {self._q(target)} ATTACH PARTITION ID {literal(i[0])} FROM {self._q(source)}" for i in ids if i[0] not in skip]
        if steps:
            self.config.run(*steps, doing=f"moving {source} into {target}", partition=key, settings={"log_queries": 1})

    def _staged_tables(self, plan: SinkPlan) -> dict[str, str]:
        once: commits.Once = plan.own.once
        return {k: commits.part_table(once.load_id, once.target, k) for k in (self.committed(plan) or {})}

    def target_rows(self, plan: SinkPlan) -> int:
        """What the target holds (append), or what the load's partitions' tables hold (before they are swapped in)."""
        if plan.load_mode == "append":
            return int(self.config.run(f"SELECT count() FROM {self._q()}", doing="counting")[0][0])
        tables = self._staged_tables(plan).values()
        if not tables:
            return 0
        union = " UNION ALL ".join(f"SELECT count() AS n FROM {self._q(t)}" for t in tables)
        return int(self.config.run(f"SELECT sum(n) FROM ({union})", doing="counting")[0][0])

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        try:
            if plan.load_mode == "merge":
                self._merge_in(plan, results)
            elif plan.load_mode != "append":
                self._swap_in(plan, results)
        finally:
            guard.release(self.options.run_id)

    def _swap_in(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        conf, own = self.config, plan.own
        stage = plan.write_target
        parts = self._staged_tables(plan)
        conf.run(f"DROP TABLE IF EXISTS {self._q(stage)}", own.create.format(table=self._q(stage)), doing=f"load_mode={plan.load_mode}")
        try:
            for table in parts.values():
                self._attach(table, stage)
            held = int(conf.run(f"SELECT count() FROM {self._q(stage)}", doing="counting")[0][0])
            check_taken(self._q(), held, sum(r.rows for r in results))
            if plan.load_mode == "create" or not self._exists(self.config.table):  # (replace of a table that is not there)
                conf.run(f"RENAME TABLE {self._q(stage)} TO {self._q()}", doing="load_mode=create")
            else:
                old = f"{commits.OLD_PREFIX}{self.options.run_id}"
                conf.run(f"RENAME TABLE {self._q()} TO {self._q(old)}, {self._q(stage)} TO {self._q()}", doing=f"load_mode={plan.load_mode}")
                conf.run(f"DROP TABLE {self._q(old)}", doing=f"load_mode={plan.load_mode}")
        except BaseException:
            with contextlib.suppress(Exception):
                conf.run(f"DROP TABLE IF EXISTS {self._q(stage)}")
            raise
        self._drop_parts(plan, parts.values())

    def _merge_in(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        """merge: the staged partitions into one table; a key staged twice refused by name; then the target's partitions
        those keys touch rebuilt with the staged rows in place of the target's (every partition with merge_delete=hard)
        and swapped in one by one (``chsync.rebuild``: what readers see is each partition before or after)."""
        conf, own = self.config, plan.own
        stage, made = plan.write_target, f"{plan.write_target}_merged"
        parts = self._staged_tables(plan)
        conf.run(f"DROP TABLE IF EXISTS {self._q(stage)}", own.create.format(table=self._q(stage)),
                 f"DROP TABLE IF EXISTS {self._q(made)}", own.create.format(table=self._q(made)), doing="load_mode=merge")
        try:
            for table in parts.values():
                self._attach(table, stage)
            held = int(conf.run(f"SELECT count() FROM {self._q(stage)}", doing="counting")[0][0])
            check_taken(self._q(), held, sum(r.rows for r in results))
            key = f"({', '.join(qident(k) for k in own.merge_keys)})"
            twice = conf.run(f"SELECT toString({key}), count() AS n FROM {self._q(stage)} GROUP BY {key} HAVING n > 1 LIMIT 5",
                             doing="load_mode=merge")
            if twice:
                raise SchemaError(f"load_mode=merge into {self._where()}: the source has key(s) {', '.join(k for k, _ in twice)} more "
                                  f"than once (by {', '.join(own.merge_keys)})", hint="merge from rows with one row per key; the "
                                                                                      "target was not changed")
            done = self.rebuild(stage, made, own.merge_keys, None, own.merge_delete, self._where())
            say(f"{self._where()}: merged {done.present:,} rows ({done.describe()}"
                + ("; every partition rebuilt from the source's rows: the rows it lacks are gone)" if own.merge_delete else ")"))
        finally:
            with contextlib.suppress(Exception):
                conf.run(f"DROP TABLE IF EXISTS {self._q(stage)}", f"DROP TABLE IF EXISTS {self._q(made)}")
        self._drop_parts(plan, parts.values())

    def _drop_parts(self, plan: SinkPlan, tables: Iterable[str]) -> None:
        once: commits.Once = plan.own.once
        with contextlib.suppress(ConveyorError):  # best effort: the load is in place (or was refused) already
            for table in tables:
                self.config.run(f"DROP TABLE IF EXISTS {self._q(table)}")
            commits.forget(self.config, once.load_id, once.target)

    def abort(self, plan: SinkPlan) -> None:
        try:
            if plan.load_mode != "append":
                self._drop_parts(plan, self._staged_tables(plan).values())
                with contextlib.suppress(ConveyorError):
                    self.config.run(f"DROP TABLE IF EXISTS {self._q(plan.write_target)}")
        finally:
            guard.release(self.options.run_id)

    def leftovers(self, remove: bool) -> list[str]:
        """Conveyor's tables in the target's database; with ``remove``, drop those whose run is gone."""
        found = commits.stages(self.config)
        if not remove:
            return [s.describe() for s in found]
        dropped = {s.name for s in commits.drop_stale(self.config)}
        if dropped:
            warn(f"dropped {len(dropped)} table(s) of runs that are gone; a killed staged load they belonged to loads again in full")
        return [("dropped " if s.name in dropped else "kept (in use) ") + s.describe() for s in found]


class _Sent:
    """Native blocks of the batches, counted (rows and bytes) as they are sent."""

    def __init__(self) -> None:
        self.rows = self.bytes = 0

    def blocks(self, batches: Iterable[Any], columns: Sequence[tuple[str, str]]) -> Iterator[bytes]:
        parsed = [(name, chtypes.parse(typ)) for name, typ in columns]
        for batch in batches:
            if not batch.num_rows:
                continue
            block = native.encode_block(batch, parsed)
            self.rows += batch.num_rows
            self.bytes += len(block)
            yield block
