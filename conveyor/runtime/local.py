"""The local runtime: a pool of threads in this process, ``degree`` tasks at once.

Arrow, DuckDB and the database drivers release the GIL while they work, so threads run
partitions in parallel. Every task goes through pickle before it runs, so anything that
could not cross to a Ray worker fails here first, with the same message.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from conveyor.core import JobOptions, Progress, RuntimeBase, Task, TaskResult
from conveyor.errors import TransferError
from conveyor.log import warn
from conveyor.runtime.schedule import schedule
from conveyor.runtime.task import run_task


@dataclass
class LocalRuntimeConfig:
    #: how often a partition that failed with a retriable error is tried again
    max_retries: int = 2
    #: batches a task reads ahead of its writer, in a thread: reading overlaps writing
    prefetch_batches: int = 4
    #: and at most this many bytes of them (one batch larger than that still goes ahead alone; 0: no
    #: limit but the count): what a task holds ahead is bounded by bytes, not by how the source
    #: slices its rows into batches
    prefetch_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        check_runtime_numbers(self)


def check_runtime_numbers(config: Any) -> None:
    """A runtime's counts, refused where they mean nothing (a negative retry count or read-ahead)."""
    for name in ("max_retries", "prefetch_batches", "prefetch_bytes"):
        if getattr(config, name, 0) < 0:
            raise ValueError(f"{name}: {getattr(config, name)} must be >= 0")


def roundtrip(task: Task) -> Task:
    try:
        return pickle.loads(pickle.dumps(task))
    except Exception as exc:
        raise TransferError(
            f"partition {task.partition.key}: the task does not pickle: {type(exc).__name__}: {exc}",
            partition=task.partition.key,
            hint="plugins must hold only plain config; open connections inside read/write",
        ) from None


class Threads:
    """The local runtime's :class:`~conveyor.runtime.schedule.Pool`: a task per thread."""

    def __init__(self, pool: ThreadPoolExecutor, progress: Progress, config: LocalRuntimeConfig) -> None:
        self.pool, self.progress, self.config = pool, progress, config

    def submit(self, task: Task) -> Future[TaskResult]:
        return self.pool.submit(run_task, roundtrip(task), self.progress, self.config.max_retries, prefetch=self.config.prefetch_batches,
                                prefetch_bytes=self.config.prefetch_bytes)

    def wait(self, handles: list[Future[TaskResult]]) -> list[Future[TaskResult]]:
        # a timeout, so that Ctrl-C is seen while long partitions run
        return list(wait(handles, timeout=0.5, return_when=FIRST_COMPLETED).done)

    def result(self, handle: Future[TaskResult], task: Task, stopping: str | None) -> TaskResult:
        return handle.result()

    def stop(self, stopping: str) -> None:
        """Nothing to send: a thread's task sees Ctrl-C itself (the process's flag), and one that runs on
        after a failed partition ends as it would have."""

    def overdue(self, running: dict[Future[TaskResult], Task], stopping: str | None) -> list[TaskResult]:
        return []


def in_threads(tasks: Sequence[Task], degree: int, progress: Progress, config: LocalRuntimeConfig) -> list[TaskResult]:
    """The tasks in this process's threads, ``degree`` at once (the local runtime's run; runtime=auto's
    for a job it runs in the driver)."""
    with ThreadPoolExecutor(max_workers=max(1, degree), thread_name_prefix="conveyor") as pool:
        return schedule(tasks, degree, Threads(pool, progress, config))


class LocalRuntime(RuntimeBase):
    config_class = LocalRuntimeConfig

    def __init__(self, config: LocalRuntimeConfig, options: JobOptions) -> None:
        self.config = config

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        """Run every task, at most ``degree`` at once; stop starting new ones after a failure or Ctrl-C."""
        return in_threads(tasks, self.cap(degree), progress, self.config)

    @staticmethod
    def cap(degree: int) -> int:
        """Threads mostly wait on I/O, but thousands only contend: at most 4 per CPU."""
        cpus = os.cpu_count() or 1
        if degree > 4 * cpus:
            warn(f"degree={degree} capped to {4 * cpus}: runtime=local runs at most 4 tasks per CPU ({cpus} CPUs here)")
            return 4 * cpus
        return degree
