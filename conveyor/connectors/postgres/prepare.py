"""The PostgreSQL sink's prepare, on the driver, once: the decision (``decide``) carried out.

A staging table made (create, replace, truncate through a stage, merge), the commit markers and an
incremental window's pending state recorded, and the plan the tasks get: how each writes (the
pass-through, or pgpq / ADBC with each column's cast), exactly once (``commits.Once``), routed into
partitions or written straight into the range partition it aligns with.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from conveyor.connectors.postgres import commits, decide, definition, encoding, partitioned, passthrough, writers
from conveyor.connectors.postgres import target as targets
from conveyor.connectors.postgres.common import SCRATCH_STORAGE, connect, ident, row_hash_sql, translate
from conveyor.connectors.postgres.types import column_ddl, read_columns, source_column_ddl
from conveyor.connectors.postgres.writers import PgLoad
from conveyor.core import INFINITY, PrepareRequest, SinkPlan, TableDefinition
from conveyor.errors import ConveyorError, SchemaError
from conveyor.kit import merge as merging
from conveyor.log import say, warn


class Preparer:
    """One prepare of the sink ``sink`` (its config, options, names), in one connection."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.config, self.options = sink, sink.config, sink.options
        self.where = sink.where

    def _qualified(self, table: str | None = None) -> str:
        return ident(self.config.schema, table or self.config.table)

    def run(self, request: PrepareRequest) -> SinkPlan:
        stage = commits.stage_name(self.options.run_id)
        con = connect(self.config, autocommit=True)
        made, added = False, ()
        try:
            commits.hold_guard(self.config, self.options.run_id)
            for stale in commits.drop_stale(con, self.config.schema, self.sink.name):
                warn(f"removed a staging table left by a run that is gone: {stale.describe()}")
            ins = decide.inspect(con, self.config, self.options, self.where)
            d = decide.decide(ins, request, self.config, self.options, self.where, request.partitions)
            if request.agreement is not None and request.agreement.native != d.native:
                raise SchemaError(f"{self.where}: the target changed between the plan and the load (the agreed path was "
                                  f"{request.agreement.path!r})", hint="run it again")
            if d.added:  # schema_drift=evolve: the new columns first (nullable: no rewrite), then the load as into any target
                con.execute(f"ALTER TABLE {self._qualified()} " + ", ".join(f"ADD COLUMN {ident(n)} {t}" for n, t in d.added))
                added = tuple(n for n, _ in d.added)
                say(f"{self.where}: schema_drift=evolve: added column(s) {', '.join(f'{n} {t}' for n, t in d.added)}")
                ins = decide.inspect(con, self.config, self.options, self.where)
                d = decide.decide(ins, request, self.config, self.options, self.where, request.partitions)
            write_table, made = self._stage(con, request, d, ins, stage)
            if self.config.commit_markers:
                commits.ensure_markers(con, self.config.schema)
            if request.window is not None:
                self.sink.record_window(con, request.window)
            plan = self._plan(request, d, ins, write_table, con)
            plan = dataclasses.replace(plan, own=dataclasses.replace(plan.own, added=added))
            return self._extras(con, plan, request, d, ins)
        except BaseException as exc:
            if made:
                with contextlib.suppress(Exception):
                    con.execute(f"DROP TABLE IF EXISTS {self._qualified(stage)}")
            with contextlib.suppress(Exception):
                drop_added(con, self._qualified(), added)
            commits.release_guard(self.options.run_id)
            if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
                raise
            raise translate(exc, self.config, f"preparing {self.where}") from None
        finally:
            con.close()

    def _stage(self, con: Any, request: PrepareRequest, d: decide.Decision, ins: decide.Inspected, stage: str) -> tuple[str, bool]:
        """The table the tasks write into, and whether it is a staging table made here."""
        mode, am = self.options.load_mode, self.config.access_method
        using = f" USING {ident(am)}" if am else ""
        if d.new_table:
            source_cols = passthrough.source_columns(request.info.native)
            made = self._definition(request)
            typed = {c.name: c.type_sql for c in d.tcols if c.name in (self.config.column_types or {})}
            # each column's type: the one asked for, the source's own, else the Arrow field's (only then is a deferred
            # schema made: a PostgreSQL source's jsonb or uuid column would have ADBC's driver asked, ~20 ms a table)
            fields = ([_Named(n) for n in request.column_names]
                      if all(n in typed or source_column_ddl(source_cols.get(n)) is not None for n in request.column_names) else list(request.schema))
            ddl = ", ".join(f"{ident(f.name)} {typed.get(f.name) or column_ddl(f, source_cols.get(f.name))}{definition.not_null(made, f.name)}"
                            for f in fields)
            unlogged = "UNLOGGED " if self.config.unlogged or self.config.unlogged_load else ""
            con.execute(f"CREATE {unlogged}TABLE {self._qualified(stage)} ({ddl}){using}")
        elif mode in ("truncate", "replace", "merge") and not d.in_place:
            like = "INCLUDING ALL" if mode == "replace" else "INCLUDING DEFAULTS"
            unlogged = "UNLOGGED " if mode != "replace" or self.config.unlogged or self.config.unlogged_load else ""
            if mode == "replace":
                using = using or targets.access_method(con, ins.target)
            else:  # a scratch table, dropped at the end
                using = SCRATCH_STORAGE
            con.execute(f"CREATE {unlogged}TABLE {self._qualified(stage)} (LIKE {self._qualified()} {like}){using}")
        else:
            return self.config.table, False
        commits.label_stage(con, self.config.schema, self.options.run_id, self.sink.name)
        return stage, True

    def _plan(self, request: PrepareRequest, d: decide.Decision, ins: decide.Inspected, write_table: str, con: Any) -> SinkPlan:
        pairs = list(d.pairs)
        tcols = list(d.tcols)
        if d.new_table:  # the columns as the stage was made: what the writers write into
            made = {c.name: c for c in read_columns(con, f"SELECT * FROM {self._qualified(write_table)} LIMIT 0")}
            tcols = [made[t] for _, t in pairs]
        before, after, freeze = self._one_transaction(con, ins.target) if d.in_place else ((), (), False)
        once = commits.Once(self.config, self.config.schema, self.sink.name, self.config.table, commits.stage_name(self.options.run_id),
                            self.options.load, self.config.commit_markers, self.options.run_id, self.config.max_streams, before, after,
                            freeze, check_stored=self.options.verify != "none")
        load = PgLoad(once, target_types=tuple(c.type_sql for c in tcols))
        details = []
        if d.native is None:
            casts, writer, why, pgpq_types = writers.plan_arrow(self.config, self.config.writer, self.options.load, request.schema,
                                                                pairs, self._qualified(write_table), self.where, tcols, list(d.forced))
            if d.tree is not None and (writer != "pgpq" or None in casts):  # decide() chose routing for pgpq's batches only
                raise SchemaError(f"{self.where}: the target changed between the plan and the load (its rows were to be routed "
                                  "into its partitions)", hint="run it again")
            sources = passthrough.source_columns(request.info.native)
            load = dataclasses.replace(load, writer=writer, casts=casts, pgpq_types=pgpq_types,
                                       lengths=encoding.length_limits(pairs, sources, tcols, list(d.forced)),
                                       fractions=encoding.fraction_limits(pairs, request.schema, sources, tcols, list(d.forced)))
            if d.tree is not None:
                load = dataclasses.replace(load, route=d.tree, route_buffer=self.config.routing_buffer_mb << 20)
            details.append(f"{writer} encoder" + (f" ({why})" if why else ""))
        if freeze and (d.native or load.writer == "pgpq"):
            details.append("COPY FREEZE (the rows are written frozen in the transaction that truncated the table)")
        return SinkPlan(
            target=f"{self.config.where()} {self.sink.name}", write_target=write_table, load_mode=self.options.load_mode,
            columns=tuple(t for _, t in pairs), source_columns=tuple(s for s, _ in pairs),
            schema=request.schema if d.native is None else None,  # the pass-through's tasks read no Arrow
            native=d.native, checks_before_commit=self.options.load_mode == "append" or d.in_place, path=d.path,
            path_reason="; ".join(details), keeps=(INFINITY,) if load.writer == "pgpq" else (), own=load)

    def _definition(self, request: PrepareRequest) -> Any:
        """The PostgreSQL source table's definition this new table takes (None: none, or sink.definition=false)."""
        made = request.info.definition
        if not self.config.definition or made is None:
            return None
        if made.dialect != "postgres":  # another engine's: its NOT NULL and comments; its SQL (defaults, indexes, ...) said, not carried
            return TableDefinition("postgres", made.table, made.not_null, made.comment, made.column_comments,
                                   not_carried=tuple(made.beyond_keys()))
        return made

    def _types_not_carried(self, request: PrepareRequest, plan: SinkPlan) -> list[str]:
        """The PostgreSQL source table's column types (not built in: an enum, a domain, a composite, an extension's type) that
        a new table does not take as they are, each named with what the column was made of; a type that
        ``sink.column_types`` set is the user's choice, not said."""
        made_of = request.info.definition
        if made_of is None or made_of.dialect != "postgres":
            return []
        declared = {name: (sql, kind) for name, sql, kind in made_of.declared_types}
        chosen = set(self.config.column_types or {})
        return [f"column {t}'s type {declared[s][0]} ({declared[s][1]}): made {made}"
                for s, t, made in zip(plan.source_columns, plan.columns, plan.own.target_types)
                if s in declared and t not in chosen and declared[s][0] != made]

    def _one_transaction(self, con: Any, target: targets.Target) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
        """A truncate in the partition's own transaction: (statements before its rows, after them, COPY
        FREEZE). TRUNCATE first, so COPY may freeze the rows (a plain table) and a wal_level=minimal server
        skips their WAL; with rebuild_indexes, the loose indexes are dropped before and built after."""
        drop, build = targets.loose_indexes(con, target) if self.config.rebuild_indexes else ([], [])
        return (f"TRUNCATE {targets.only(target.relkind)}{self._qualified()}", *drop), tuple(build), target.relkind == "r"

    def _extras(self, con: Any, plan: SinkPlan, request: PrepareRequest, d: decide.Decision, ins: decide.Inspected) -> SinkPlan:
        """What some loads carry beyond the writers: the range partitions an append writes straight into,
        the window, the new table's primary key, merge's keys, what an append's checksum compares with."""
        mode, own = self.options.load_mode, plan.own
        if mode == "append" and ins.target.relkind == "p":
            own = dataclasses.replace(own, leaves=partitioned.leaves(con, ins.target, self.config.schema))
        if request.window is not None:
            own = dataclasses.replace(own, window=request.window)
        key = request.info.primary_key
        if d.new_table and self.config.primary_key and key and set(key) <= set(request.column_names):
            own = dataclasses.replace(own, primary_key=tuple(key))
        changed = self._types_not_carried(request, plan) if d.new_table else []
        if d.new_table and self._definition(request) is not None:
            made = self._definition(request)
            own = dataclasses.replace(own, definition=dataclasses.replace(made, not_carried=made.not_carried + tuple(changed)))
            plan = dataclasses.replace(plan, definition=definition.said(own.definition))
        elif changed:  # no definition carried (sink.definition=false): the types that changed are still said
            plan = dataclasses.replace(plan, definition="not carried: " + "; ".join(changed))
            say(f"{self.where}: {plan.definition}")
        if mode == "merge":
            own = dataclasses.replace(own, merge=merging.plan(self.config, list(ins.primary_key), [t for _, t in d.pairs],
                                                                [c.name for c in ins.target.columns], self.where))
        plan = dataclasses.replace(plan, own=own)
        if mode == "append" and self.options.verify == "checksum":  # what was there, to compare what was added
            n, h = con.execute(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) "
                               f"FROM {targets.scan(con, self._qualified())}").fetchone()
            return dataclasses.replace(plan, rows_before=n, own=dataclasses.replace(own, checksum_before=(n, h)))
        if mode == "append":  # the target is not scanned: each partition's rows are checked before its commit
            return dataclasses.replace(plan, rows_before=None)
        return plan


def drop_added(con: Any, table: str, added: tuple[str, ...]) -> None:
    """The columns schema_drift=evolve added, dropped again: a run that left nothing in the target leaves it as it was."""
    if added:
        con.execute(f"ALTER TABLE {table} " + ", ".join(f"DROP COLUMN IF EXISTS {ident(n)}" for n in added))


class _Named:
    """A column known by its name alone (its type comes from the source's column)."""

    def __init__(self, name: str) -> None:
        self.name = name


__all__ = ["Preparer", "drop_added"]
