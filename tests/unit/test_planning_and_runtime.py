"""Strategies against a small in-memory source, and the local runtime's contract."""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from conveyor.core import FileEntry, FileSet, JobOptions, PlanRequest, SinkPlan, SourceInfo, WholeSource, WriteStats
from conveyor.errors import PlanningError, TransferError
from conveyor.runtime.local import LocalRuntime, LocalRuntimeConfig
from conveyor.runtime.task import NullProgress, Task
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
    parts = NoneStrategy(NoneStrategyConfig(), JobOptions()).plan(_request(object()))
    assert parts == [WholeSource(index=0, count=1)] and parts[0].estimated_rows == 70


def test_files_one_partition_per_file_covers_each_file_once() -> None:
    parts = FilesStrategy(FilesStrategyConfig(), JobOptions()).plan(_request(ListedFiles(7)))
    assert [p.paths for p in parts] == [(f"f{i}.parquet",) for i in range(7)]
    assert [p.key for p in parts] == [f"files-{i:05d}" for i in range(7)]
    assert all(p.count == 7 and p.estimated_rows == 10 for p in parts)


def test_files_spread_over_degree() -> None:
    parts = FilesStrategy(FilesStrategyConfig(files_per_partition=0), JobOptions()).plan(_request(ListedFiles(7), degree=3))
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


class CollectingSink:
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
