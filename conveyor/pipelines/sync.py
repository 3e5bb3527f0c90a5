"""Sync jobs (``incremental.method=replication``): a source's tables kept equal to their targets, a
parallel snapshot load handed off exactly once to the source's change feed, through the two declared
contracts of :mod:`conveyor.core.changes` alone (the source a ``ChangeFeed``, the sink a ``ChangeApplier``).

First run: the feed begins the job (PostgreSQL: its publication and slot, the slot with an exported
snapshot), and the tables are loaded by the usual job (every strategy, any degree, Ray or local) in
that snapshot; each target then records the position. Every later run (or, with
``incremental.follow``, every N seconds, from the first run on): the feed fixes the run's end position
``L`` with a snapshot of it and says which keys the changes up to ``L`` touched; the rows those keys
hold in the snapshot are read by the exact readers into a stage beside each target (the sink's own
write), and the sink applies every table's stage in one transaction where it has them, recording
``L`` in it; the feed's position moves to ``L`` only after every target committed. A run killed
anywhere is followed by one that reads the changes from the feed's position again: applying a key
twice writes the row it has at the later run's position, so the end state is exact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from conveyor.config import JobSpec
from conveyor.core import cancel_requested, wait_for_cancel
from conveyor.core.changes import Change, ChangeApplier, ChangeFeed, DescribesApply, FeedSession, SyncRecord
from conveyor.errors import Cancelled, ConfigError, ConveyorError
from conveyor.log import note, say
from conveyor.pipelines.syncreport import SyncReport, SyncRun

#: the sink settings that say which target: with the source's, the slot's default name
_IDENTITY = ("host", "port", "dbname", "database", "path", "schema", "table", "tables", "exclude")


def slot_of(spec: JobSpec) -> str:
    """The job's name on the source (PostgreSQL: its slot and publication): ``incremental.slot``, else one made from
    the source's tables and the target."""
    plain = dataclasses.asdict(spec.sink.config) if dataclasses.is_dataclass(spec.sink.config) else {}
    target = spec.names.get("sink", "") + json.dumps({k: plain.get(k) for k in _IDENTITY if k in plain}, sort_keys=True, default=str)
    return spec.source.feed_slot(target, spec.incremental)


def check(spec: JobSpec) -> None:
    """A sync job's config, refused by name before anything connects."""
    if not isinstance(spec.source, ChangeFeed):
        raise ConfigError(f"incremental.method=replication: source {spec.names.get('source')} has no change feed (a sync reads the "
                          "source's changes)", key="incremental.method",
                          hint="sync from postgres (source.table or source.tables) or mysql (source.table)")
    if not isinstance(spec.sink, ChangeApplier):
        raise ConfigError(f"incremental.method=replication: sink {spec.names.get('sink')} cannot apply changes (it deletes and "
                          "inserts rows by key in one transaction)", key="sink",
                          hint="sync into postgres, duckdb, mysql, clickhouse, iceberg or delta")
    if spec.options.load_mode not in ("replace", "truncate", "create") and not (spec.migrate.schema and spec.options.load_mode == "append"):
        # (a migration's first load appends into the empty tables its definitions made)
        raise ConfigError(f"incremental.method=replication: load_mode={spec.options.load_mode}; a sync's first run loads each table "
                          "whole, and later runs apply changes", key="load_mode", hint="use load_mode=replace (or truncate / create)")
    if spec.incremental.chunk_keys <= 0 or spec.incremental.follow < 0 or spec.incremental.wait_timeout < 0:
        raise ConfigError("incremental.chunk_keys must be > 0, and incremental.follow and incremental.wait_timeout >= 0",
                          key="incremental")
    slot_of(spec)


def run(spec: JobSpec, load: Callable[[JobSpec], Any], on_run: Callable[[Any], None] | None = None,
        before_load: Callable[[Any], None] | None = None) -> Any:
    """The sync job ``spec`` describes: its first load, then (with ``incremental.follow``) or else its applies (every
    ``incremental.follow`` seconds until Ctrl-C / SIGTERM, which raise :class:`Cancelled` with every applied change
    committed). Returns the job's report (a :class:`~conveyor.pipelines.job.JobReport`, its ``sync`` this
    :class:`SyncReport`); ``on_run`` gets it after every run; ``before_load`` gets the first position's snapshot before
    the first load reads it (a migration makes the target's tables there)."""
    check(spec)
    start = time.perf_counter()
    slot = slot_of(spec)
    with spec.source.change_feed(slot, spec.incremental) as feed, _Held(spec.runtime) as runtime:
        sinks = _targets(spec, feed)
        sync = SyncReport(slot=slot, target=", ".join(s.sync_target for s in sinks), text=feed.text,
                          held=feed.held_on_source)
        states = [s.sync_state(slot) for s in sinks]
        held = feed.position()
        report = None
        if held is None or any(s is None for s in states):
            if held is not None and feed.held_on_source:
                note(f"sync: slot {slot} exists but the target has no record of the load that began with it (a first run that "
                     "stopped): loading again")
            elif any(s is not None for s in states):
                raise ConveyorError(f"sync: {sync.target} holds a sync of slot {slot}, and the source has no such slot (dropped, or "
                                    "the source is another server): the changes since the target's position are lost to it",
                                    hint="conveyor clean --drop (this job's settings), then run it again: the first run loads the "
                                         "tables again")
            report, sync.position = _first(spec, feed, sinks, load, before_load)
            sync.first_load = (report.rows, report.seconds)
            report.sync = sync
            if feed.live:
                # the load read live rows (no snapshot to share): a run reads again what changed while it read
                done, _ = _apply(spec, feed, sinks, runtime)
                sync.add(done)
                say(done.describe())
            if not _again(spec, feed, report, start, on_run):
                return report
        while True:
            done, stages = _apply(spec, feed, sinks, runtime)
            sync.add(done)
            say(done.describe())
            report = _applied(spec, sync, done, stages, report)
            if not _again(spec, feed, report, start, on_run):
                return report


def _applied(spec: JobSpec, sync: SyncReport, done: SyncRun, stages: list[Any], first: Any) -> Any:
    """The job's report after a run: its first load's (this process made one), or one of the run's stage loads
    (``stages``), each a table of it; ``sync`` says what every run applied."""
    if first is not None:
        return first
    import pyarrow as pa

    from conveyor.core import SourceInfo
    from conveyor.pipelines.job import JobReport, combined
    from conveyor.pipelines.plan import JobPlan

    label = f"the changes of {', '.join(done.tables) or 'the tables'}"
    plan = JobPlan(spec=dataclasses.replace(spec, names={**spec.names, "strategy": "native"}), info=SourceInfo(schema=pa.schema([]), label=label),
                   partitions=[p for r in stages for p in r.plan.partitions], degree=max((r.plan.degree for r in stages), default=1),
                   note=f"the changed keys' rows of {len(stages)} table(s), staged", tables=tuple(r.plan for r in stages))
    report = JobReport(plan=plan, results=[r for s in stages for r in s.results], seconds=done.seconds, target=sync.target,
                       tables=list(stages), sync=sync)
    report.verification = combined(stages)
    return report


def _again(spec: JobSpec, feed: FeedSession, report: Any, start: float, on_run: Callable[[Any], None] | None) -> bool:
    """After a first load or an apply: the report, then whether another run follows (``incremental.follow``, after its
    wait; Ctrl-C or SIGTERM during it raise :class:`Cancelled`)."""
    sync = report.sync
    sync.retained_bytes = feed.retained()
    sync.seconds = time.perf_counter() - start
    if on_run is not None:
        on_run(report)
    if not spec.incremental.follow:
        return False
    if wait_for_cancel(spec.incremental.follow):
        raise Cancelled(f"sync stopped: {sync.target} holds the source as of {feed.text(sync.position)}, every applied "
                        "change committed", hint="run it again to go on from there")
    return True


def _targets(spec: JobSpec, feed: FeedSession) -> list[Any]:
    """Each table's target (a job over several tables: the sink aimed at each)."""
    if not spec.source.many():
        return [spec.sink]
    return [spec.sink.for_target(t.schema, t.name, spec.options) for t in feed.tables]


def _live(spec: JobSpec, feed: FeedSession, full: bool = True) -> Any:
    """A whole table read live (a feed without a shared snapshot: its rows move while the partitions read them) is not
    counted again at the source after (a count then is of other rows): each partition's commit checks the rows the
    target stored against the rows read, and the run that follows reads again what changed."""
    if not (full and feed.live) or spec.options.verify == "none":
        return spec.options
    note(f"sync: verify={spec.options.verify} is not run on a whole table read live (the source moves while it is read); each "
         "partition's commit checks what the target stored, and conveyor verify compares the two once the source is quiet")
    return dataclasses.replace(spec.options, verify="none")


def _first(spec: JobSpec, feed: FeedSession, sinks: list[Any], load: Callable[[JobSpec], Any],
           before_load: Callable[[Any], None] | None = None) -> tuple[Any, int]:
    """The first load, in the snapshot the feed's first position came with; each target records the position."""
    with feed.first() as (position, snapshot):
        say(f"sync: slot {feed.slot} made at {feed.text(position)}: loading the tables in its snapshot")
        if before_load is not None:
            before_load(snapshot)
        job = load(dataclasses.replace(spec, source=feed.snapshot_source(snapshot), options=_live(spec, feed)))
    for table, sink in zip(feed.tables, sinks):
        sink.record_sync(SyncRecord(feed.slot, table.label, position, table.signature))
    return job, position


class _Held:
    """The job's runtime kept ready from a sync's first stage load to its end (a Ray instance is not started again for
    every table of every run)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.stack, self.on = runtime, contextlib.ExitStack(), False

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stack.close()

    def ready(self) -> None:
        if not self.on:
            self.on = True
            self.stack.enter_context(self.runtime.held())


def _apply(spec: JobSpec, feed: FeedSession, sinks: list[Any], runtime: _Held) -> tuple[SyncRun, list[Any]]:
    """One run: the changes since the targets' position up to a position fixed now, applied; with the reports of its
    stage loads."""
    began = time.perf_counter()
    states = [s.sync_state(feed.slot) for s in sinks]
    if any(s is None for s in states):
        raise ConveyorError(f"sync: the sync state of {', '.join(s.sync_target for s, st in zip(sinks, states) if st is None)} is gone",
                            hint=f"conveyor clean --drop (this job's settings) drops slot {feed.slot}; the next run loads the tables again")
    at = min(s.position for s in states)
    feed.check(states)
    with feed.run(at) as changes:
        taken = time.time()
        done = SyncRun(start=at, upto=changes.upto, changes=changes.changes, text=feed.text)
        lap = done.lap("decode", began)
        order, referenced = feed.order()
        staged: list[tuple[Any, str]] = []
        plan: list[Change] = []
        stages: list[Any] = []
        try:
            for i in order:
                if cancel_requested():
                    raise Cancelled("cancelled")
                table, sink = feed.tables[i], sinks[i]
                record = SyncRecord(feed.slot, table.label, changes.upto, table.signature)
                what = changes.changed(table)
                lap = done.lap("keys", lap)
                if not what.full and not what.keys:
                    plan.append(Change(sink, None, table.keys, False, record, states[i].position, i in referenced))
                    continue
                stage = sink.sync_stage(feed.slot)
                staged.append((sink, stage))
                parts = _parts(spec, what.keys)
                runtime.ready()
                options = _live(spec, feed, what.full)
                stages.append(_stage(dataclasses.replace(spec, options=options), changes.rows(table, parts, options), sink, stage))
                done.staged.append(_summary(stages[-1]))
                lap = done.lap("stage", lap)
                plan.append(Change(sink, stage, table.keys, what.full, record, states[i].position, i in referenced))
            if cancel_requested():
                raise Cancelled("cancelled")
            applied = sinks[0].apply_changes(plan)
            done.lap("apply", lap)
        except Cancelled:
            raise Cancelled("sync stopped while applying: every target holds this run's changes or the last run's, each committed "
                            "whole", hint="run it again: it applies the changes from there") from None
        finally:
            for sink, stage in staged:
                with contextlib.suppress(Exception):  # the next run makes it again; conveyor clean --drop removes a left one
                    sink.drop_stage(stage)
        by_table = {c.record.source: a for c, a in zip(plan, applied) if c.record is not None}
        done.tables = {t.label: by_table[t.label] for t in feed.tables}
        changes.advance()
        done.lag_bytes = changes.lag()
        done.lag_seconds = time.time() - taken
    done.seconds = time.perf_counter() - began
    return done, stages


#: fewer changed keys than this per partition are not worth a task of their own
MIN_KEYS_PER_PART = 100_000


def _parts(spec: JobSpec, keys: int) -> int:
    """How many partitions a table's changed keys are read in: no more than ``incremental.chunk_keys`` keys each, and
    up to the job's degree where there are enough keys to share out."""
    from conveyor.core import resolve_degree

    wanted = min(resolve_degree(spec.runtime, spec.options.degree), -(-keys // MIN_KEYS_PER_PART))
    return max(-(-keys // spec.incremental.chunk_keys), wanted, 1)


def _summary(report: Any) -> dict[str, Any]:
    """A stage load's report as a run keeps it: its target, the rows the stage stored, its partitions, seconds, runtime."""
    return {"target": report.target, "rows": report.rows, "partitions": len(report.plan.partitions), "seconds": round(report.seconds, 3),
            "runtime": report.plan.spec.names.get("runtime", "")}


def _stage(spec: JobSpec, rows: Any, sink: Any, stage: str) -> Any:
    """The rows of a table's changed keys, read in the run's snapshot by the usual exact path into the stage: a job of
    its own through the one job loop, its partitions the ones the feed's source hands out (``strategy=native``), on the
    job's runtime at the job's degree (each partition's commit checks what the stage stored)."""
    from omegaconf import OmegaConf

    from conveyor.config import build_plugin
    from conveyor.pipelines.job import run_job

    options = dataclasses.replace(spec.options, load_mode=sink.stage_load_mode, run_id=uuid.uuid4().hex[:12], load_id="",
                                  cursor=None)
    rows.options = options
    strategy = build_plugin("strategy", OmegaConf.create({"strategy": {"type": "native"}}), options)[1]
    job = dataclasses.replace(spec, source=rows, sink=sink.stage_sink(stage, options), options=options, strategy=strategy,
                              names={**spec.names, "strategy": "native"})
    return run_job(job)


def plan_lines(spec: JobSpec) -> list[str]:
    """What ``conveyor plan`` says of a sync job: its slot, what it holds on the source, and each target's position."""
    check(spec)
    slot = slot_of(spec)
    with spec.source.change_feed(slot, spec.incremental, exclusive=False) as feed:  # beside a running sync
        held, retained = feed.position(), feed.retained()
        sinks = _targets(spec, feed)
        states = [s.sync_state(slot) for s in sinks]
        at = ", ".join(feed.text(s.position) for s in states if s is not None) or "(none)"
        # what a run rewrites where a target says it (ClickHouse: the partitions a run's changes touch)
        applies = [line for s in sinks if isinstance(s, DescribesApply) for line in s.apply_plan()]
        return _holds(feed, slot, held, retained, states, at) + applies


def _holds(feed: FeedSession, slot: str, held: int | None, retained: int, states: list[Any], at: str) -> list[str]:
    """What ``conveyor plan`` says of the job's position on the source and the targets'."""
    if not feed.held_on_source:
        if any(s is None for s in states):
            return [f"sync: job {slot}: the first run loads the table, then reads again what changed while it read"]
        return [f"sync: job {slot}: the target is at {at}; the source's log goes from {feed.text(held or 0)}: a run applies the "
                "changes since the target's position"]
    if held is None:
        return [f"sync: no slot yet: the first run makes slot {slot} (and its publication) and loads the tables in its snapshot"]
    return [f"sync: slot {slot} at {feed.text(held)} holds {retained:,} bytes of WAL on the source; the targets are at {at}: "
            "a run applies the changes since"]


def leftovers(spec: JobSpec, remove: bool) -> list[str]:
    """``conveyor clean`` of a sync job: what it keeps on the source, its state and stage beside each target; dropped with
    ``remove`` (the next run then loads the tables again)."""
    check(spec)
    slot = slot_of(spec)
    with spec.source.change_feed(slot, spec.incremental, exclusive=remove) as feed:  # a drop waits for no running sync: refused
        sinks = _targets(spec, feed)
        if not remove:
            out = ([f"replication slot {slot}: holds {feed.retained():,} bytes of WAL on the source"]
                   if feed.held_on_source and feed.position() is not None else [])
            return out + [f"sync state of {s.sync_target} ({slot})" for s in sinks if s.sync_state(slot) is not None]
        out = [f"dropped {what}" for what in feed.drop()]
    return out + [f"dropped {what}" for s in sinks for what in s.forget_sync(slot)]
