"""Strategies against a small in-memory source, and the local runtime's contract."""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from conveyor.core import FileEntry, FileSet, JobOptions, NullProgress, PlanRequest, SinkBase, SinkPlan, SourceInfo, Task, WholeSource, WriteStats
from conveyor.errors import PlanningError, TransferError
from conveyor.runtime.local import LocalRuntime, LocalRuntimeConfig
from conveyor.strategies.basic import FilesStrategy, FilesStrategyConfig, NoneStrategy, NoneStrategyConfig

SCHEMA = pa.schema([("x", pa.int64())])


class ListedFiles:
    def __init__(self, n: int) -> None:
        self.entries = [FileEntry(f"f{i}.parquet", rows=10) for i in range(n)]

    def list_files(self) -> list[FileEntry]:
        return self.entries


def _request(source: object, degree: int = 2) -> PlanRequest:
    return PlanRequest(source=source, info=SourceInfo(SCHEMA, "test", estimated_rows=70), degree=degree)


def test_none_is_one_partition() -> None:
    parts = NoneStrategy(NoneStrategyConfig(), JobOptions()).plan(_request(object())).partitions
    assert parts == [WholeSource(index=0, count=1)] and parts[0].estimated_rows == 70


def test_files_one_partition_per_file_covers_each_file_once() -> None:
    parts = FilesStrategy(FilesStrategyConfig(), JobOptions()).plan(_request(ListedFiles(7))).partitions
    assert [p.paths for p in parts] == [(f"f{i}.parquet",) for i in range(7)]
    assert [p.key for p in parts] == [f"files-{i:05d}" for i in range(7)]
    assert all(p.count == 7 and p.estimated_rows == 10 for p in parts)


def test_files_spread_over_degree() -> None:
    parts = FilesStrategy(FilesStrategyConfig(files_per_partition=0), JobOptions()).plan(_request(ListedFiles(7), degree=3)).partitions
    assert [len(p.paths) for p in parts] == [3, 3, 1]
    assert sorted(x for p in parts for x in p.paths) == sorted(f"f{i}.parquet" for i in range(7))


def test_files_on_a_source_without_files_is_a_planning_error() -> None:
    with pytest.raises(PlanningError, match="strategy=files needs a source made of files"):
        FilesStrategy(FilesStrategyConfig(), JobOptions()).plan(_request(object()))


def test_partitions_pickle_and_keep_their_key() -> None:
    part = FileSet(index=3, count=9, paths=("a", "b"), estimated_rows=5)
    assert pickle.loads(pickle.dumps(part)) == part and pickle.loads(pickle.dumps(part)).key == "files-00003"


# --- local runtime -----------------------------------------------------------------------------


@dataclass
class RangeSource:
    fail_first: set[int] = field(default_factory=set)
    retriable: bool = True

    def read(self, part):  # type: ignore[no-untyped-def]
        yield pa.record_batch([pa.array([part.index] * 3, pa.int64())], schema=SCHEMA)
        if part.index in self.fail_first:
            self.fail_first.discard(part.index)  # fails once per process copy, then works
            raise TransferError("connection dropped", retriable=self.retriable)


class CollectingSink(SinkBase):
    """Holds written rows in a class-level dict keyed by run, since tasks run on unpickled copies."""

    store: dict[str, list[int]] = {}
    lock = threading.Lock()
    active = 0
    peak = 0

    def __init__(self, run: str) -> None:
        self.run = run

    def write(self, plan, part, batches):  # type: ignore[no-untyped-def]
        import time

        with self.lock:
            CollectingSink.active += 1
            CollectingSink.peak = max(CollectingSink.peak, CollectingSink.active)
        try:
            rows = [v for b in batches for v in b.column(0).to_pylist()]  # test-side check only
            time.sleep(0.05)
        finally:
            with self.lock:
                CollectingSink.active -= 1
        with self.lock:  # commit only a whole partition, as a transaction would
            self.store.setdefault(self.run, []).extend(rows)
        return WriteStats(part.key, len(rows), 0, 0.0)


def _tasks(source: object, sink: object, n: int) -> list[Task]:
    plan = SinkPlan("t", "t", "append", ("x",), ("x",), SCHEMA)
    return [Task(source, sink, plan, WholeSource(index=i, count=n)) for i in range(n)]


def test_local_runtime_runs_at_most_degree_at_once_and_in_order() -> None:
    CollectingSink.peak = 0
    results = LocalRuntime(LocalRuntimeConfig(max_retries=0), JobOptions()).run(
        _tasks(RangeSource(), CollectingSink("deg"), 6), 2, NullProgress()
    )
    assert [r.index for r in results] == list(range(6)) and all(r.ok for r in results)
    assert CollectingSink.peak == 2
    assert sorted(CollectingSink.store["deg"]) == sorted(i for i in range(6) for _ in range(3))


def test_retriable_errors_are_retried_without_duplicates() -> None:
    runtime = LocalRuntime(LocalRuntimeConfig(max_retries=2), JobOptions())
    results = runtime.run(_tasks(RangeSource(fail_first={1, 3}), CollectingSink("retry"), 4), 2, NullProgress())
    assert all(r.ok for r in results)
    assert [r.attempts for r in results] == [1, 2, 1, 2]
    assert sorted(CollectingSink.store["retry"]) == sorted(i for i in range(4) for _ in range(3))
    # each retry is in the task's own account (which the driver writes into the run's log)
    assert [len([n for n in r.notes if "failed (retriable): connection dropped; retrying in" in n]) for r in results] == [0, 1, 0, 1]
    assert all(r.notes[0].startswith("ran on ") for r in results)


def test_fatal_errors_are_not_retried_and_stop_new_tasks() -> None:
    runtime = LocalRuntime(LocalRuntimeConfig(max_retries=5), JobOptions())
    results = runtime.run(_tasks(RangeSource(fail_first={0}, retriable=False), CollectingSink("fatal"), 5), 1, NullProgress())
    assert results[0].attempts == 1 and not results[0].ok and "connection dropped" in str(results[0].error)
    # degree 1: nothing else started after the failure; the other four are reported as not started
    assert [r.cancelled for r in results] == [False, True, True, True, True]
    assert all("not started: cancelled after partition whole-00000 failed" in str(r.error) for r in results[1:])


def test_a_task_that_cannot_pickle_fails_first_here() -> None:
    source = RangeSource()
    source.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(TransferError, match="does not pickle"):
        LocalRuntime(LocalRuntimeConfig(), JobOptions()).run(_tasks(source, CollectingSink("p"), 1), 1, NullProgress())


class StreamSink(CollectingSink):
    """A sink that declares it is not transactional (like Flight's do_put): a test double, since
    the rule under test is the runtime's, not a connector's."""

    from conveyor.core import SinkCapabilities

    capabilities = SinkCapabilities(transactional=False)


def test_a_sink_that_is_not_transactional_is_never_retried() -> None:
    runtime = LocalRuntime(LocalRuntimeConfig(max_retries=5), JobOptions())
    results = runtime.run(_tasks(RangeSource(fail_first={0}, retriable=True), StreamSink("stream"), 1), 1, NullProgress())
    assert results[0].attempts == 1 and not results[0].ok and "connection dropped" in str(results[0].error)
    # the transactional sink's retry of the same failure succeeds on its second attempt
    results = runtime.run(_tasks(RangeSource(fail_first={0}, retriable=True), CollectingSink("txn"), 1), 1, NullProgress())
    assert results[0].attempts == 2 and results[0].ok


def test_the_partition_that_failed_is_named_not_one_cancelled_after_it() -> None:
    from conveyor.core import TaskResult
    from conveyor.runtime.task import first_failure

    cancelled = TaskResult("a", 0, error=TransferError("partition a: cancelled after partition b failed"), cancelled=True)
    failed = TaskResult("b", 1, error=TransferError("partition b: value too long"))
    assert first_failure([cancelled, failed]) is failed
    assert first_failure([TaskResult("c", 2)]) is None


def test_the_manifest_is_a_journal_not_a_rewrite_per_partition(tmp_path) -> None:
    """10,000 partitions: manifest.json is written when the run starts and ends; each finished
    partition is one appended line; a run killed before its end is resumed from the journal."""
    import json

    from conveyor.core import TaskResult, ValueSet
    from conveyor.pipelines.manifest import JOURNAL, Manifest, load_for_resume

    config = {"source": {"type": "postgres", "table": "t", "password": "s3cr3t-pw"}, "sink": {"type": "postgres", "table": "u"},
              "load_mode": "append", "map_method": "name"}
    parts = [ValueSet(index=i, count=10000, column="k", values=(i,)) for i in range(10000)]
    manifest = Manifest(tmp_path / "manifest.json", config, NullProgress())
    manifest.start("run1", "run1", parts, None, {})
    written = (tmp_path / "manifest.json").stat().st_mtime_ns
    for p in parts[:6000]:
        manifest.finished(TaskResult(p.key, p.index, rows=1))
    assert (tmp_path / "manifest.json").stat().st_mtime_ns == written  # not rewritten per partition
    assert len((tmp_path / JOURNAL).read_text().splitlines()) == 6000
    assert "s3cr3t-pw" not in (tmp_path / "manifest.json").read_text()
    previous = load_for_resume(str(tmp_path), config)  # killed before the end: the journal answers
    assert len(previous.done) == 6000 and len(previous.partitions) == 10000 and previous.load_id == "run1"
    manifest.close()
    final = json.loads((tmp_path / "manifest.json").read_text())
    assert sum(e["status"] == "done" for e in final["partitions"].values()) == 6000


def test_datadriven_packs_many_values_into_balanced_ranges() -> None:
    from conveyor.core import KeyRange
    from conveyor.strategies.keyed import DataDrivenStrategy, DataDrivenStrategyConfig

    class Keys:
        def key_stats(self, column):  # type: ignore[no-untyped-def]
            raise AssertionError("not needed")

        def key_quantiles(self, column, buckets, exact):  # type: ignore[no-untyped-def]
            raise AssertionError("not needed")

        def key_values(self, column, limit=None):  # type: ignore[no-untyped-def]
            values = [(None, 7)] + [(v, 1 + v % 3) for v in range(10000)]
            return values[:limit]

        def key_runs(self, column, runs):  # type: ignore[no-untyped-def]
            # what SqlSource.key_runs computes in SQL, over the same values: where each run of about equal rows starts
            total, running, bounds = 20000, 0, {}
            for v in range(10000):
                bounds.setdefault(running * runs // total, v)
                running += 1 + v % 3
            return [bounds[b] for b in sorted(bounds) if b > 0]

        def query_values(self, query):  # type: ignore[no-untyped-def]
            return list(range(200))

    request = PlanRequest(source=Keys(), info=SourceInfo(SCHEMA, "keys", estimated_rows=20007), degree=2)
    parts = DataDrivenStrategy(DataDrivenStrategyConfig(distribute_key="k"), JobOptions()).plan(request).partitions
    assert len(parts) == 8 and all(isinstance(p, KeyRange) for p in parts)
    assert parts[0].lower is None and parts[0].nulls and parts[-1].upper is None
    assert all(a.upper == b.lower for a, b in zip(parts, parts[1:]))  # contiguous: every value in exactly one
    rows = [sum(1 + v % 3 for v in range(10000) if (p.lower is None or v >= p.lower) and (p.upper is None or v < p.upper))
            for p in parts]
    assert max(rows) - min(rows) <= 10
    listed = DataDrivenStrategy(DataDrivenStrategyConfig(distribute_key="k", datadriven_query="q"), JobOptions()).plan(request).partitions
    assert len(listed) == 64 and sorted(v for p in listed for v in p.values) == list(range(200))


@pytest.mark.parametrize(("gib", "degree", "ranges"), [
    (0.2, 2, 2),     # TPC-H SF1 orders: one range per stream
    (0.9, 2, 2),     # lineitem SF1
    (0.9, 1, 1),     # one stream reads the table as one range
    (5, 2, 4),       # 2.5 GiB a stream: two ranges each
    (20, 2, 8),      # 10 GiB a stream: at most 4 each
    (1, 4, 4),
])
def test_ctid_plans_one_range_per_stream_until_a_stream_reads_more_than_a_gib(gib: float, degree: int, ranges: int) -> None:
    """On main ctid planned 4 page ranges per stream whatever the table's size: each range's start and
    end cost its stream time nothing overlapped, 20% of PostgreSQL -> Parquet on TPC-H SF1 lineitem at
    degree 2 (13.5-16.3 s against 11.5-12.5 s with one range per stream)."""
    from conveyor.strategies.ctid import CtidStrategy
    from conveyor.strategies.keyed import KeyedStrategyConfig

    class Heap:
        def ctid_pages(self) -> int:
            return 1_000_000

    info = SourceInfo(schema=pa.schema([("a", pa.int64())]), label="t", estimated_bytes=int(gib * (1 << 30)))
    plan = CtidStrategy(KeyedStrategyConfig(), JobOptions()).plan(PlanRequest(source=Heap(), info=info, degree=degree))
    assert len(plan.partitions) == ranges
    assert plan.partitions[0].start == 0 and plan.partitions[-1].stop is None


def test_the_runtimes_say_when_the_tasks_will_run_in_this_process(monkeypatch) -> None:
    """What the job asks before it lets a source get ready for its reads (Source.warm_up): the local
    runtime always runs them here, runtime=ray never; runtime=auto, once start_early has heard the source's
    size, for a job small enough for the driver's threads with no instance to join, and for a sink of one
    process; not where an instance is to be joined (it decides there later). No Ray instance is started here."""
    from conveyor.core import SinkBase, SinkCapabilities
    from conveyor.runtime import rayinstance
    from conveyor.runtime.auto import AutoRuntime, AutoRuntimeConfig
    from conveyor.runtime.ray import RayRuntime, RayRuntimeConfig

    assert LocalRuntime(LocalRuntimeConfig(), JobOptions()).runs_tasks_here()
    assert not RayRuntime(RayRuntimeConfig(), JobOptions()).runs_tasks_here()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(rayinstance, "running_here", lambda: "")  # no `ray start` instance on this machine
    small = AutoRuntime(AutoRuntimeConfig(), JobOptions())
    small.start_early(2, 1 << 30)
    assert small.runs_tasks_here() and not small.ray.instance.started_early()

    class OneProcess(SinkBase):
        capabilities = SinkCapabilities(single_process=True)

    single = AutoRuntime(AutoRuntimeConfig(), JobOptions())
    single.check(None, OneProcess())
    single.start_early(2, 1 << 40)
    assert single.runs_tasks_here() and not single.ray.instance.started_early()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # an instance to join: nothing is decided yet
    joined = AutoRuntime(AutoRuntimeConfig(), JobOptions())
    joined.start_early(2, 1 << 30)
    assert not joined.runs_tasks_here() and not joined.ray.instance.started_early()


class _SampledHeap:
    """A heap whose live rows sit where ``rows_at`` says (rows on page p), sampled as the PostgreSQL
    source samples: every k-th page, empty ones included. Records what the strategy asked."""

    def __init__(self, pages: int, rows_at) -> None:
        self.pages, self.rows_at, self.asked = pages, rows_at, []

    def ctid_pages(self) -> int:
        self.asked.append("pages")
        return self.pages

    def ctid_pages_sampled(self, target: int, min_pages: int):
        self.asked.append(("sampled", target, min_pages))
        step = max(1, self.pages // target)
        return self.pages, [(p, self.rows_at(p)) for p in range(step // 2, self.pages, step)]


@pytest.mark.parametrize(("degree", "live_from"), [(2, 0.5), (4, 0.75), (3, 0.0)])
def test_ctid_splits_by_the_sampled_rows_where_equal_page_ranges_would_be_uneven(degree: int, live_from: float) -> None:
    """Rows only in the pages from ``live_from`` of the table on (a purge of its oldest rows): each
    range holds about an equal share of them. On the main this started from the ranges were equal
    page ranges (at degree 2, one with no row). An even table (live_from 0) keeps equal page ranges."""
    from conveyor.strategies.ctid import CtidStrategy, rows_in_ranges
    from conveyor.strategies.keyed import KeyedStrategyConfig

    pages = 100_000
    heap = _SampledHeap(pages, lambda p: 50 if p >= live_from * pages else 0)
    info = SourceInfo(schema=pa.schema([("a", pa.int64())]), label="t", estimated_bytes=pages * 8192)
    plan = CtidStrategy(KeyedStrategyConfig(), JobOptions()).plan(PlanRequest(source=heap, info=info, degree=degree))
    parts = plan.partitions
    assert len(parts) == degree and parts[0].start == 0 and parts[-1].stop is None
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
    truth = [(p, heap.rows_at(p)) for p in range(pages)]  # every page's rows, not the sample's
    held = rows_in_ranges(truth, [p.start for p in parts])
    share = sum(held) / degree
    assert all(abs(h - share) <= 0.02 * share for h in held), held
    if live_from == 0:
        assert [p.start for p in parts] == list(range(0, pages, -(-pages // degree))) and "about equal rows" not in plan.note
    else:
        assert "about equal rows" in plan.note
    assert heap.asked == [("sampled", 256, 4096)]  # one call: the pages and the sample on one connection


def test_ctid_asks_no_sample_for_one_range() -> None:
    from conveyor.strategies.ctid import CtidStrategy
    from conveyor.strategies.keyed import KeyedStrategyConfig

    heap = _SampledHeap(100_000, lambda p: 50)
    info = SourceInfo(schema=pa.schema([("a", pa.int64())]), label="t", estimated_bytes=100_000 * 8192)
    plan = CtidStrategy(KeyedStrategyConfig(), JobOptions()).plan(PlanRequest(source=heap, info=info, degree=1))
    assert len(plan.partitions) == 1 and heap.asked == ["pages"]
