"""PostgreSQL sink: binary COPY from Arrow batches (ADBC), or a binary COPY pass-through.

Each partition is written in one transaction, so a failed or retried partition leaves
nothing. Load modes:

- append: COPY into the target, one transaction per partition.
- truncate: COPY into an UNLOGGED staging table copied from the target's definition; at
  the end, in one transaction, TRUNCATE the target and INSERT the staged rows.
- create: COPY into a new staging table made from the source schema, renamed to the target
  at the end (fails, before any row moves, if the target exists).
- replace: like create (or, if the target exists, a staging table LIKE the target INCLUDING
  ALL), then DROP the old target and rename the staging table in one transaction.

A failed run drops the staging table: the target is as it was.

This module is the lifecycle (prepare, finalize, abort, verification, clean-up); the catalog
checks are in ``target``, the Arrow writers in ``writers``, the pass-through in ``passthrough``
and exactly-once (markers, the driver's guard) in ``commits``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.connectors.postgres import commits, partitioned, passthrough, routing, writers
from conveyor.connectors.postgres import target as targets
from conveyor.connectors.postgres.common import PgConnConfig, connect, ident, row_hash_sql, translate
from conveyor.connectors.postgres.target import Target
from conveyor.connectors.postgres.types import PgColumn, column_ddl, read_columns
from conveyor.connectors.postgres.writers import PgLoad, pg_column_type
from conveyor.core import (
    INFINITY,
    CursorState,
    CursorWindow,
    ForeignKey,
    JobOptions,
    NativeStream,
    Partition,
    PrepareRequest,
    SinkCapabilities,
    SinkPlan,
    TargetLayout,
    WriteStats,
    decode_cursor,
    encode_cursor,
    target_for,
)
from conveyor.errors import ConfigError, ConveyorError, SchemaError
from conveyor.kit import merge as merging
from conveyor.kit.arrowutil import length_checked
from conveyor.kit.casts import ColumnType, check_casts
from conveyor.kit.mapping import map_columns
from conveyor.kit.merge import MergeOptions
from conveyor.kit.staged import StagedSink, check_mode, check_taken, swap_steps
from conveyor.log import note, warn

COPY_PATHS = ("auto", "arrow", "passthrough")
WRITERS = ("auto", "pgpq", "adbc")
TRUNCATE_METHODS = ("auto", "in_place", "staged")
ROUTINGS = ("auto", "leaves", "parent")
_IN_PLACE = "truncate in one transaction (TRUNCATE, then COPY straight into the target)"
#: measured (make bench, partitioned group): into partitions without an index the pass-through through
#: the parent beats decoding to Arrow to route on the client; with indexes routing wins by far
_UNINDEXED = "rows routed by the server through the parent (no partition has an index: the pass-through costs less than routing here)"


@dataclass
class PostgresSinkConfig(MergeOptions, PgConnConfig):
    schema: str = "public"
    table: str = "???"
    #: create / replace make the new table UNLOGGED (faster, not crash-safe, not replicated)
    unlogged: bool = False
    #: create / replace: load the new table UNLOGGED (its rows write no WAL), then SET LOGGED just
    #: before it is swapped in (one pass writes it to the WAL): the target ends as logged as ever
    unlogged_load: bool = False
    #: at most this many partitions write into the target at once, across every worker (0: as many
    #: as the degree runs): a target stops scaling past its lock contention knee (relation extension,
    #: free-space map) while the source can still take more readers
    max_streams: int = 0
    #: truncate: drop the target's indexes that back no constraint before the final insert and build
    #: them again after it, in the same transaction (a failure leaves table and indexes as they were)
    rebuild_indexes: bool = False
    #: how load_mode=truncate replaces the rows, atomically either way. in_place: one transaction
    #: (TRUNCATE, then COPY ... FREEZE into the target: every row written once, and no WAL on a
    #: wal_level=minimal server; readers of the target wait until it commits), for a plan of one
    #: partition. staged: partitions in parallel into an UNLOGGED staging table, copied into the
    #: target in one transaction at the end (every row written twice; readers see the old rows
    #: until then). auto: in_place when the plan has one partition (and verify is not checksum)
    truncate_method: str = "auto"
    #: create / replace: the new table's access method (e.g. columnar); null: the server's default
    #: for create, the target's own for replace
    access_method: str | None = None
    #: auto: pass a PostgreSQL source's binary COPY stream through untouched when the column
    #: types are identical, else Arrow; arrow: always decode to Arrow; passthrough: require it
    copy_path: str = "auto"
    #: the Arrow path's binary COPY encoder. auto: pgpq where it encodes every column (it costs
    #: about a third of ADBC's client CPU), else ADBC; pgpq: require it; adbc: ADBC's adbc_ingest
    writer: str = "auto"
    #: a partitioned target (append, or a truncate in one transaction): leaves: each task computes every
    #: row's leaf partition on the client (Arrow / numpy over whole batches: range, list and hash on
    #: integer, date and timestamp keys, list on text) and COPYs each leaf's rows straight into it
    #: (the Arrow path); parent: COPY into the parent, the server routes every row; auto: leaves where
    #: the client can route the top level, unless no partition has an index and the source's COPY
    #: stream could pass through (the parent costs less there), else the parent (`conveyor plan` says
    #: which and why)
    routing: str = "auto"
    #: routed loads: the Arrow batches (MiB) one task holds, grouped by partition, before it COPYs
    #: each partition's share and lets them all go
    routing_buffer_mb: int = 64
    #: a target of another access method than heap (Citus columnar: a stripe holds one transaction's rows,
    #: up to its stripe_row_limit): the rows each partition's transaction should hold at least, so the
    #: plan makes whole stripes instead of many small ones (read from columnar.options where Citus has
    #: it; 0: plan as for a heap table)
    stripe_rows: int = 150000
    #: run ANALYZE on the target after the load
    analyze: bool = False
    #: create / replace making a new table from a source table with a primary key: make the same key
    #: (built after the rows, before the table is swapped in)
    primary_key: bool = True
    #: a job over several tables creating its targets (create / replace): make the source's foreign
    #: keys between them after every table is loaded (each checks every row)
    foreign_keys: bool = False
    #: record each partition's commit in <schema>._conveyor_commits, in the partition's own
    #: transaction: retries and resumes never load a partition twice. false: no marker table (then
    #: a partition retried after a lost worker, or resumed after a killed driver, may load twice)
    commit_markers: bool = True
    #: columns whose values may change type by PostgreSQL's own cast (e.g. timestamp -> timestamptz
    #: in the session's TimeZone, text -> integer); ["*"]: every column. By default a type change that
    #: could alter a value is refused before anything moves (see conveyor/kit/casts.py for the rules)
    allow_cast: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.copy_path not in COPY_PATHS:
            raise ValueError(f"copy_path: {self.copy_path!r} is not one of {', '.join(COPY_PATHS)}")
        if self.writer not in WRITERS:
            raise ValueError(f"writer: {self.writer!r} is not one of {', '.join(WRITERS)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing: {self.routing!r} is not one of {', '.join(ROUTINGS)}")
        if self.truncate_method not in TRUNCATE_METHODS:
            raise ValueError(f"truncate_method: {self.truncate_method!r} is not one of {', '.join(TRUNCATE_METHODS)}")
        self.check_merge_options()


class PostgresSink:
    config_class = PostgresSinkConfig
    capabilities = SinkCapabilities(transactional=True, load_modes=("truncate", "append", "create", "replace", "merge"))

    def __init__(self, config: PostgresSinkConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options

    def for_table(self, schema: str, table: str, options: JobOptions) -> PostgresSink:
        """This sink aimed at the target for one table of a job over several (``sink.table`` a template)."""
        return PostgresSink(dataclasses.replace(self.config, table=target_for(self.config.table, schema, table, "sink.table")), options)

    @property
    def name(self) -> str:
        return f"{self.config.schema}.{self.config.table}"

    @property
    def _where(self) -> str:
        return f"postgres table {self.name}"

    def _qualified(self, table: str | None = None) -> str:
        return ident(self.config.schema, table or self.config.table)

    def _stage(self) -> str:
        return commits.stage_name(self.options.run_id)

    def _inspect(self, con: Any) -> Target:
        target = targets.inspect(con, self.config.schema, self.config.table)
        targets.check_access(con, target, self.options.load_mode, self.config.user, self.config.commit_markers,
                             self.config.where(), self._where)
        return target

    # --- prepare ------------------------------------------------------------------------------

    def prepare(self, request: PrepareRequest) -> SinkPlan:
        mode, names, where = self.options.load_mode, request.column_names, self._where
        con = connect(self.config, autocommit=True)
        stage_created = False
        try:
            commits.hold_guard(self.config, self.options.run_id)
            for stale in commits.drop_stale(con, self.config.schema, self.name):
                warn(f"removed a staging table left by a run that is gone: {stale.describe()}")
            target = self._inspect(con)
            check_mode(mode, target.exists, where, self.config.where())
            chosen_am = self._access_method(con, mode)
            if self.config.rebuild_indexes and mode != "truncate":
                raise ConfigError(f"sink.rebuild_indexes: applies to load_mode=truncate (one transaction drops, loads and rebuilds); "
                                  f"load_mode={mode} commits partitions apart, so a failed run would leave the target without them",
                                  key="sink.rebuild_indexes")
            if mode == "replace" and target.relkind == "p":
                raise SchemaError(f"{where} is partitioned: replace would lose its partitions", hint="use load_mode=truncate")
            source_cols = passthrough.source_columns(request.info.native)
            write_table = self.config.table
            in_place = mode == "truncate" and self._in_place(request.partitions)
            new_table = mode in ("create", "replace") and not target.exists
            if new_table:
                ddl = ", ".join(f"{ident(f.name)} {column_ddl(f, source_cols.get(f.name))}" for f in request.schema)
                unlogged = "UNLOGGED " if self.config.unlogged or self.config.unlogged_load else ""
                con.execute(f"CREATE {unlogged}TABLE {self._qualified(self._stage())} ({ddl}){chosen_am}")
                commits.label_stage(con, self.config.schema, self.options.run_id, self.name)
                pairs = [(n, n) for n in names]
                write_table, stage_created = self._stage(), True
            else:
                pairs = map_columns(names, target.mapping, self.options.map_method, where)
                if mode in ("truncate", "replace", "merge") and not in_place:
                    like = "INCLUDING ALL" if mode == "replace" else "INCLUDING DEFAULTS"
                    unlogged = "UNLOGGED " if mode != "replace" or self.config.unlogged or self.config.unlogged_load else ""
                    using = (chosen_am or targets.access_method(con, target)) if mode == "replace" else ""
                    con.execute(f"CREATE {unlogged}TABLE {self._qualified(self._stage())} (LIKE {self._qualified()} {like}){using}")
                    commits.label_stage(con, self.config.schema, self.options.run_id, self.name)
                    write_table, stage_created = self._stage(), True
            if self.config.commit_markers:
                commits.ensure_markers(con, self.config.schema)
            if request.window is not None:
                self._record_window(con, request.window)
            route = self._routing(con, target) if target.relkind == "p" and (mode == "append" or in_place) else None
            plan = self._plan(request, pairs, write_table, con, self._one_transaction(con, target) if in_place else None, route)
            if mode == "append" and target.relkind == "p":
                plan = dataclasses.replace(plan, own=dataclasses.replace(plan.own, leaves=partitioned.leaves(con, target, self.config.schema)))
            if request.window is not None:
                plan = dataclasses.replace(plan, own=dataclasses.replace(plan.own, window=request.window))
            key = request.info.primary_key
            if new_table and self.config.primary_key and key and set(key) <= set(names):
                plan = dataclasses.replace(plan, own=dataclasses.replace(plan.own, primary_key=tuple(key)))
            if mode == "merge":
                merge = merging.plan(self.config, targets.primary_key(con, target), [t for _, t in pairs],
                                     [c.name for c in target.columns], where)
                plan = dataclasses.replace(plan, own=dataclasses.replace(plan.own, merge=merge))
            if mode == "append" and self.options.verify == "checksum":  # what was there, to compare what was added
                n, h = con.execute(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) FROM {self._qualified()}").fetchone()
                plan = dataclasses.replace(plan, rows_before=n, own=dataclasses.replace(plan.own, checksum_before=(n, h)))
            elif mode == "append":  # the target is not scanned: each partition's rows are checked before its commit
                plan = dataclasses.replace(plan, rows_before=None)
        except BaseException as exc:
            if stage_created:
                with contextlib.suppress(Exception):
                    con.execute(f"DROP TABLE IF EXISTS {self._qualified(self._stage())}")
            commits.release_guard(self.options.run_id)
            if isinstance(exc, ConveyorError) or not isinstance(exc, Exception):
                raise
            raise translate(exc, self.config, f"preparing {where}") from None
        finally:
            con.close()
        return plan

    # --- incremental cursors (<schema>._conveyor_cursors) ----------------------------------------

    def cursor_state(self, column: str) -> CursorState:
        """The cursor the last finished load committed into this target, and an unfinished run's window."""
        con = connect(self.config, autocommit=True)
        try:
            row = commits.cursor_row(con, self.config.schema, self.name, column)
            if row is None:
                return CursorState()
            value, kind, load, mode, low, high, pkind = row
            state = CursorState(value=decode_cursor(value, kind) if value is not None else None)
            if load:
                window = CursorWindow(column, decode_cursor(low, pkind) if low is not None else None,
                                      decode_cursor(high, pkind) if high is not None else None)
                done = len(commits.committed(con, self.config.schema, load, self.name)) if mode == "append" else 0
                state = dataclasses.replace(state, pending=window, pending_load=load, pending_mode=mode, pending_committed=done)
            return state
        except Exception as exc:
            raise translate(exc, self.config, "reading the incremental cursor") from None
        finally:
            con.close()

    def _record_window(self, con: Any, window: CursorWindow) -> None:
        if self.options.load_mode == "append" and not self.config.commit_markers:
            raise ConfigError("incremental.cursor with load_mode=append needs sink.commit_markers=true: they tell a run that "
                              "stopped half way from one that loaded nothing", key="sink.commit_markers")
        commits.ensure_cursors(con, self.config.schema)
        commits.record_pending(con, self.config.schema, self.name, window.column, self.options.load, self.options.load_mode,
                               encode_cursor(window.low) if window.low is not None else None,
                               encode_cursor(window.high) if window.high is not None else None)

    def _commit_cursor(self, con: Any, plan: SinkPlan) -> None:
        """In the transaction that makes the load visible: the window's upper end becomes the cursor."""
        window: CursorWindow | None = plan.own.window
        if window is None:
            return
        value = None if window.empty else encode_cursor(window.high)
        con.execute(commits.commit_cursor_sql(self.config.schema, self.name, window.column, self.options.load, value))

    def _in_place(self, partitions: int) -> bool:
        """Whether load_mode=truncate loads in one transaction (sink.truncate_method)."""
        method = self.config.truncate_method
        if method == "staged":
            return False
        if method == "in_place":
            if partitions != 1:
                raise ConfigError(f"sink.truncate_method=in_place: the whole load is one transaction, and the plan has "
                                  f"{partitions or 'an unknown number of'} partitions", key="sink.truncate_method",
                                  hint="plan one partition (strategy=none, or strategy.partitions=1), or use truncate_method=auto")
            if self.options.verify == "checksum":
                raise ConfigError("sink.truncate_method=in_place with verify=checksum: the checksum is compared after the load "
                                  "is committed, too late to keep the old rows", key="sink.truncate_method",
                                  hint="use verify=count (checked inside the transaction), or truncate_method=staged")
            return True
        return partitions == 1 and self.options.verify != "checksum"

    def _one_transaction(self, con: Any, target: Target) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
        """A truncate in the partition's own transaction: (statements before its rows, after them,
        COPY FREEZE). TRUNCATE first, so COPY may freeze the rows (a plain table) and a wal_level=minimal
        server skips their WAL; with rebuild_indexes, the loose indexes are dropped before and built after."""
        drop, build = targets.loose_indexes(con, target) if self.config.rebuild_indexes else ([], [])
        return (f"TRUNCATE {self._qualified()}", *drop), tuple(build), target.relkind == "r"

    def _access_method(self, con: Any, mode: str) -> str:
        """' USING <am>' for ``sink.access_method`` (checked to exist here), '' when unset."""
        am = self.config.access_method
        if not am:
            return ""
        if mode not in ("create", "replace"):
            raise ConfigError(f"sink.access_method={am}: applies to load_mode=create or replace (load_mode={mode} keeps the target's own)",
                              key="sink.access_method")
        if con.execute("SELECT 1 FROM pg_am WHERE amname = %s AND amtype = 't'", [am]).fetchone() is None:
            found = [r[0] for r in con.execute("SELECT amname FROM pg_am WHERE amtype = 't' ORDER BY 1").fetchall()]
            raise SchemaError(f"{self.config.where()}: table access method {am!r} does not exist (there: {', '.join(found)})",
                              hint="install its extension first (Citus: CREATE EXTENSION citus_columnar), or leave sink.access_method unset")
        return f" USING {ident(am)}"

    def _routing(self, con: Any, target: Target) -> tuple[routing.Tree | None, str]:
        """(the tree to route rows into, or None; why not) for a partitioned target (sink.routing)."""
        if self.config.routing == "parent":
            return None, "rows routed by the server through the parent (sink.routing=parent)"
        tree, why = routing.read_tree(con, target.qualified)
        if tree is None and self.config.routing == "leaves":
            raise SchemaError(f"{self._where}: sink.routing=leaves is not possible: {why}", hint="use sink.routing=auto or parent")
        if tree is not None and self.config.copy_path == "passthrough":
            if self.config.routing == "leaves":
                raise ConfigError("sink.routing=leaves routes Arrow batches, and sink.copy_path=passthrough relays the source's "
                                  "COPY stream untouched", key="sink.routing", hint="use sink.copy_path=auto with routing=leaves")
            return None, "rows routed by the server through the parent (sink.copy_path=passthrough)"
        return tree, f"rows routed by the server through the parent ({why})" if tree is None else ""

    def _route_these(self, route: tuple[routing.Tree | None, str], request: PrepareRequest, pairs: list[tuple[str, str]],
                     tcols: list[PgColumn]) -> tuple[routing.Tree | None, str]:
        """The routing decision once the columns are known: a partition key the rows do not carry
        (the server fills it from its default) leaves the routing to the server; so does routing=auto
        into partitions without an index from a source whose COPY stream can pass through (the
        parent costs less there: measured in make bench's partitioned group)."""
        tree, note = route
        if tree is None:
            return route
        unloaded = sorted(tree.key_columns() - {t for _, t in pairs})
        if unloaded:
            why_not = f"the partition key column {unloaded[0]} is not loaded (the server fills it)"
            if self.config.routing == "leaves":
                raise SchemaError(f"{self._where}: sink.routing=leaves is not possible: {why_not}", hint="use sink.routing=auto or parent")
            return None, f"rows routed by the server through the parent ({why_not})"
        if (self.config.routing == "auto" and not tree.indexed
                and passthrough.negotiate(request.info.native, pairs, tcols, self.config.copy_path)[0] is not None):
            return None, _UNINDEXED
        return tree, note

    def _plan(self, request: PrepareRequest, pairs: list[tuple[str, str]], write_table: str, con: Any,
              one_transaction: tuple[tuple[str, ...], tuple[str, ...], bool] | None = None,
              route: tuple[routing.Tree | None, str] | None = None) -> SinkPlan:
        target_cols = {c.name: c for c in read_columns(con, f"SELECT * FROM {self._qualified(write_table)} LIMIT 0")}
        tcols = [target_cols[t] for _, t in pairs]
        forced = self._check_casts(request, pairs, tcols)
        tree, route_note = self._route_these(route or (None, ""), request, pairs, tcols)
        native, reason = passthrough.negotiate(request.info.native, pairs, tcols, "arrow" if tree else self.config.copy_path)
        if tree is not None:
            reason = reason.replace("copy_path=arrow", "routing rows into partitions")
        before, after, freeze = one_transaction or ((), (), False)
        once = commits.Once(self.config, self.config.schema, self.name, self.config.table, self._stage(), self.options.load,
                            self.config.commit_markers, self.options.run_id, self.config.max_streams, before, after, freeze,
                            check_stored=self.options.verify != "none")
        load = PgLoad(once, target_types=tuple(c.type_sql for c in tcols))
        if native is None:
            casts, writer, why, pgpq_types = writers.plan_arrow(self.config, self.config.writer, self.options.run_id, request.schema,
                                                                pairs, self._qualified(write_table), self._where, tcols, forced)
            load = dataclasses.replace(load, writer=writer, casts=casts, pgpq_types=pgpq_types,
                                       lengths=writers.length_limits(pairs, passthrough.source_columns(request.info.native), tcols, forced))
            if tree is not None and (writer != "pgpq" or None in casts):
                why_not = f"the {writer} encoder ({why})" if writer != "pgpq" else "PostgreSQL casts a column (through a temp table)"
                if self.config.routing == "leaves":
                    raise SchemaError(f"{self._where}: sink.routing=leaves is not possible: {why_not}", hint="use sink.routing=auto or parent")
                return self._plan(request, pairs, write_table, con, one_transaction,
                                  (None, f"rows routed by the server through the parent ({why_not})"))
            if tree is not None:
                load = dataclasses.replace(load, route=tree, route_buffer=self.config.routing_buffer_mb << 20)
                route_note = tree.describe()
            reason = f"{reason}; {writer} encoder" + (f" ({why})" if why else "")
            if forced:
                reason += f"; cast by PostgreSQL (sink.allow_cast): {', '.join(forced)}"
        if route_note:
            reason += "; " + route_note
        if one_transaction is not None:
            reason += "; " + _IN_PLACE + (" + COPY FREEZE" if freeze and (native or load.writer == "pgpq") else "")
        return SinkPlan(
            target=f"{self.config.where()} {self.name}",
            write_target=write_table,
            load_mode=self.options.load_mode,
            columns=tuple(t for _, t in pairs),
            source_columns=tuple(s for s, _ in pairs),
            schema=request.schema if native is None else None,  # the pass-through's tasks read no Arrow
            native=native,
            path_reason=reason,
            keeps=(INFINITY,) if load.writer == "pgpq" else (),
            own=load,
            # append and a truncate in one transaction commit final rows: each partition's count is checked before
            checks_before_commit=one_transaction is not None or self.options.load_mode == "append",
        )

    def _check_casts(self, request: PrepareRequest, pairs: list[tuple[str, str]], tcols: list[PgColumn]) -> list[str]:
        """Refuse, before anything moves, a column whose values the target type would change
        (conveyor/kit/casts.py); the target columns ``sink.allow_cast`` lets PostgreSQL cast anyway."""
        src_cols = passthrough.source_columns(request.info.native)

        def unchanged(s: str, t: PgColumn) -> bool:
            """A PostgreSQL column into one of its very type and typmod: no value changes, so it is not
            judged (nor is the source's Arrow schema made for it, which a pass-through never needs)."""
            col = src_cols.get(s)
            return col is not None and col.typmod == t.typmod and passthrough.same_type(col, t)

        judged = [(pair, t) for pair, t in zip(pairs, tcols) if not unchanged(pair[0], t)]
        sources = []
        for (s, _), _t in judged:
            f = request.schema.field(s)
            col = src_cols.get(s)
            if col is not None:
                sources.append(pg_column_type(col, f.type, as_text=col.unconstrained_numeric or not col.native))
            else:
                sources.append(ColumnType.of_field(f))
        targets_ = [pg_column_type(t, None) for _, t in judged]
        return check_casts([pair for pair, _ in judged], sources, targets_, self._where, self.config.allow_cast)

    def explain_path(self, request: PrepareRequest) -> str:
        """Which path a run would take (for ``conveyor plan``); reads the target, changes nothing."""
        mode = self.options.load_mode
        in_place = mode == "truncate" and self._in_place(request.partitions)
        con = connect(self.config, autocommit=True)
        try:
            target = self._inspect(con)
            tree, route_note = self._routing(con, target) if target.relkind == "p" and (mode == "append" or in_place) else (None, "")
        finally:
            con.close()
        if target.exists and self.options.load_mode not in ("create",):
            pairs = map_columns(request.column_names, target.mapping, self.options.map_method, self._where)
            by_name = {c.name: c for c in target.columns}
            tcols = [by_name[t] for _, t in pairs]
            self._check_casts(request, pairs, tcols)
        else:  # a new table gets the source's built-in types
            pairs = [(n, n) for n in request.column_names]
            src = passthrough.source_columns(request.info.native)
            tcols = [src[n] if n in src and src[n].type_oid < 16384 else PgColumn(n, 0, -1, "", "", "", "") for n in request.column_names]
        tree, route_note = self._route_these((tree, route_note), request, pairs, tcols)
        reason = passthrough.negotiate(request.info.native, pairs, tcols, "arrow" if tree else self.config.copy_path)[1]
        if tree is not None:  # the encoder is chosen in prepare: a column pgpq cannot encode sends the rows through the parent
            reason = reason.replace("copy_path=arrow", "routing rows into partitions") + "; " + tree.describe()
        elif route_note:
            reason += "; " + route_note
        if self.options.load_mode == "truncate":
            reason += "; " + (_IN_PLACE if in_place else
                              "truncate through an UNLOGGED staging table, copied into the target at the end")
        return reason

    def partition_rows(self, request: PrepareRequest) -> tuple[int, str]:
        """For a non-heap (columnar) target: the rows a partition's transaction should hold, to make
        whole stripes (append, create and replace write into it; other modes through a heap stage)."""
        mode = self.options.load_mode
        if not self.config.stripe_rows or mode not in ("append", "create", "replace"):
            return 0, ""
        con = connect(self.config, autocommit=True)
        try:
            target = targets.inspect(con, self.config.schema, self.config.table)
            am = self.config.access_method if mode != "append" and self.config.access_method else None
            if am is None and target.exists and mode != "create":
                am = targets.table_access_method(con, target)
            if am is None or am == "heap":
                return 0, ""
            rows = targets.stripe_row_limit(con, target if target.exists else None) or self.config.stripe_rows
        except Exception as exc:
            raise translate(exc, self.config, f"reading the access method of {self._where}") from None
        finally:
            con.close()
        return rows, f"the {am} target {self.name} (a stripe holds one transaction's rows, up to {rows:,}: sink.stripe_rows)"

    # --- partitioned targets (conveyor/connectors/postgres/partitioned.py) --------------------------

    def target_layout(self, request: PrepareRequest) -> TargetLayout | None:
        """The target's range partitions (append into a table partitioned by range on one column)."""
        return partitioned.layout(self.config, self.options.load_mode, self._where)

    def _into(self, plan: SinkPlan, part: Partition) -> SinkPlan:
        return partitioned.into(plan, part, self.config.table)

    # --- write -------------------------------------------------------------------------------

    def write(self, plan: SinkPlan, part: Partition, batches: Iterable[Any]) -> WriteStats:
        plan = self._into(plan, part)
        if plan.own.lengths:  # varchar(n) / char(n) targets: each value's length, before PostgreSQL sees it
            batches = length_checked(batches, plan.own.lengths, part.key, "PostgreSQL")
        if plan.own.writer == "pgpq":
            return writers.write_pgpq(self.config, plan, part, batches)
        return writers.write_adbc(self.config, self.options.run_id, plan, part, batches)

    def write_native(self, plan: SinkPlan, part: Partition, stream: NativeStream) -> WriteStats:
        """The pass-through: the source's binary COPY stream, relayed into the target in one transaction.
        The target's COPY count must be the rows the source's COPY said it sent (where it says),
        checked before the commit."""
        plan = self._into(plan, part)
        once: commits.Once = plan.own.once
        attempt = commits.Attempt(once, part.key, plan.expecting)
        con = connect(self.config, partition=part.key)

        def relayed() -> tuple[int, int, int | None]:
            stored, nbytes = passthrough.relay(con, self._qualified(plan.write_target), plan.columns, stream, part.key, once.freeze)
            return stored, nbytes, getattr(stream, "rows", None)  # what the source's COPY said it sent, where it says

        try:
            stats = attempt.run(con, con.execute, lambda sql: con.execute(sql).fetchone(), relayed)
        finally:
            con.close()
        return stats if stats.already_committed else dataclasses.replace(stats, source_rows=getattr(stream, "rows", None))

    def leftovers(self, remove: bool) -> list[str]:
        """Conveyor's staging tables in the target's schema; with ``remove``, drop those whose run is gone."""
        con = connect(self.config, autocommit=True)
        try:
            found = commits.stages(con, self.config.schema)
            if remove:
                dropped = {s.name for s in commits.drop_stale(con, self.config.schema)}
                return [("dropped " if s.name in dropped else "kept (in use) ") + s.describe() for s in found]
            return [s.describe() for s in found]
        except Exception as exc:
            raise translate(exc, self.config, "listing staging tables") from None
        finally:
            con.close()

    def add_foreign_keys(self, plan: SinkPlan, keys: Sequence[tuple[ForeignKey, Any]]) -> list[str]:
        """``sink.foreign_keys``: the source's foreign keys between targets this job created, in one transaction."""
        if not self.config.foreign_keys or plan.load_mode not in ("create", "replace"):
            return []
        made, steps = [], []
        for fk, ref in keys:
            if not isinstance(ref, PostgresSink) or (ref.config.host, ref.config.port, ref.config.dbname) != (
                    self.config.host, self.config.port, self.config.dbname):
                continue
            cols, ref_cols = ", ".join(ident(c) for c in fk.columns), ", ".join(ident(c) for c in fk.columns_referenced)
            steps.append(f"ALTER TABLE {self._qualified()} ADD FOREIGN KEY ({cols}) REFERENCES {ref._qualified()} ({ref_cols})"
                         + (f" {fk.actions}" if fk.actions else ""))
            made.append(f"{self.name} ({', '.join(fk.columns)}) -> {ref.name} ({', '.join(fk.columns_referenced)})")
        if not steps:
            return []
        con = connect(self.config)
        try:
            for step in steps:
                con.execute(step)
            con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            raise SchemaError(f"{self._where}: its foreign keys could not be made (the rows are loaded): "
                              f"{translate(exc, self.config, 'adding foreign keys').message}",
                              hint="the tables are loaded without them; see the rows the key refuses, or sink.foreign_keys=false") from None
        finally:
            con.close()
        return made

    def committed(self, plan: SinkPlan) -> dict[str, int] | None:
        """{partition: rows} committed into this target under the plan's load id (None: no markers kept)."""
        once: commits.Once = plan.own.once
        if not once.markers:
            return None
        con = connect(self.config, autocommit=True)
        try:
            return commits.committed(con, once.schema, once.load_id, once.target)
        except Exception as exc:
            raise translate(exc, self.config, "reading commit markers") from None
        finally:
            con.close()

    # --- verification ---------------------------------------------------------------------------

    def _one(self, sql: str) -> tuple[Any, ...]:
        con = connect(self.config, autocommit=True)
        try:
            return con.execute(sql).fetchone()
        except Exception as exc:
            raise translate(exc, self.config, "verifying") from None
        finally:
            con.close()

    def count_rows(self, plan: SinkPlan) -> int:
        return int(self._one(f"SELECT count(*) FROM {self._qualified(plan.write_target)}")[0])

    def checksum(self, plan: SinkPlan) -> str:
        n, h = self._one(f"SELECT count(*), coalesce(sum({row_hash_sql(plan.columns)}), 0) FROM {self._qualified(plan.write_target)}")
        n0, h0 = plan.own.checksum_before
        return f"{n - n0}:{h - h0}"

    # --- finalize / abort -----------------------------------------------------------------------

    def finalize(self, plan: SinkPlan, results: Sequence[WriteStats]) -> None:
        con = connect(self.config)
        target = Target(self.config.schema, self.config.table, True)
        try:
            if StagedSink.staged(plan, self.config.table):
                if plan.load_mode == "merge":
                    merged = merging.apply(con, plan.own.merge, self._qualified(), self._qualified(plan.write_target), self._where, ident,
                                           has_merge=con.info.server_version >= 150000, values=self.options.verify == "checksum")
                    con.execute(f"DROP TABLE {self._qualified(plan.write_target)}")
                    note(f"{self.name}: {merged.describe()} (read back from the target before the merge committed)")
                else:
                    self._swap_in(con, plan, target, sum(r.rows for r in results))
                self._forget_markers(con, plan)  # a staged load is visible whole: its markers served their purpose
            self._commit_cursor(con, plan)
            con.commit()
            partitioned.say_default_rows(con, target, self.name)
            if self.config.analyze:
                con.execute(f"ANALYZE {self._qualified()}")
                con.commit()
        except Exception as exc:
            with contextlib.suppress(Exception):
                con.rollback()
            if isinstance(exc, ConveyorError):
                raise
            raise translate(exc, self.config, f"finalizing {self.name}") from None
        finally:
            con.close()
            commits.release_guard(self.options.run_id)

    def _swap_in(self, con: Any, plan: SinkPlan, target: Target, staged: int) -> None:
        """truncate / create / replace, in the finalize's transaction: the staged rows made the target's."""
        stage = self._qualified(plan.write_target)
        if plan.load_mode == "replace" and con.execute("SELECT to_regclass(%s) IS NOT NULL", [self._qualified()]).fetchone()[0]:
            targets.keep_identity(con, target, plan.write_target)  # the new table takes the old one's owner, grants and comment
        steps = swap_steps(plan.load_mode, self._qualified(), stage, ident(self.config.table), [ident(c) for c in plan.columns],
                           empty="TRUNCATE")
        if self.config.unlogged_load and not self.config.unlogged and plan.load_mode in ("create", "replace"):
            steps.insert(0, f"ALTER TABLE {stage} SET LOGGED")  # with its indexes
        if plan.own.primary_key:  # built once over the loaded rows; a duplicate fails here, the target untouched
            steps.insert(0, f"ALTER TABLE {stage} ADD PRIMARY KEY ({', '.join(ident(c) for c in plan.own.primary_key)})")
        insert = steps[1] if plan.load_mode == "truncate" else None
        if plan.load_mode == "truncate" and self.config.rebuild_indexes:
            drop, build = targets.loose_indexes(con, target)
            steps = [steps[0], *drop, steps[1], *build, *steps[2:]]  # empty, drop, insert, build, drop stage
        for step in steps:
            done = con.execute(step)
            if step is insert:
                check_taken(self._where, done.rowcount, staged)
        if plan.load_mode != "truncate":
            targets.rename_stage_indexes(con, target, plan.write_target)

    def _forget_markers(self, con: Any, plan: SinkPlan) -> None:
        once: commits.Once = plan.own.once
        if once.markers:
            commits.forget(con, once.schema, once.load_id, once.target)

    def abort(self, plan: SinkPlan) -> None:
        try:
            if plan.write_target == self.config.table:
                return
            con = connect(self.config, autocommit=True)
            try:
                con.execute(f"DROP TABLE IF EXISTS {self._qualified(plan.write_target)}")
                self._forget_markers(con, plan)
                if plan.own.window is not None:  # nothing of a staged load stayed: its window is not pending
                    commits.clear_pending(con, self.config.schema, self.name, plan.own.window.column, self.options.load)
            finally:
                con.close()
        finally:
            commits.release_guard(self.options.run_id)
