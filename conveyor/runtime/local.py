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

from conveyor.core import JobOptions, Progress, RuntimeBase, Task, TaskResult, cancel_requested
from conveyor.errors import TransferError
from conveyor.log import warn
from conveyor.runtime.task import not_run, run_task


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


def roundtrip(task: Task) -> Task:
    try:
        return pickle.loads(pickle.dumps(task))
    except Exception as exc:
        raise TransferError(
            f"partition {task.partition.key}: the task does not pickle: {type(exc).__name__}: {exc}",
            partition=task.partition.key,
            hint="plugins must hold only plain config; open connections inside read/write",
        ) from None


class LocalRuntime(RuntimeBase):
    config_class = LocalRuntimeConfig

    def __init__(self, config: LocalRuntimeConfig, options: JobOptions) -> None:
        self.config = config

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        """Run every task, at most ``degree`` at once; stop starting new ones after a failure or Ctrl-C."""
        degree = self._cap(degree)
        results: list[TaskResult] = []
        pending = list(reversed(tasks))
        running: set[Future[TaskResult]] = set()
        stopping: str | None = None
        with ThreadPoolExecutor(max_workers=max(1, degree), thread_name_prefix="conveyor") as pool:
            while running or (pending and stopping is None):
                if stopping is None and cancel_requested():
                    stopping = "cancelled (Ctrl-C or SIGTERM) before it finished"
                while pending and stopping is None and len(running) < degree:
                    task = roundtrip(pending.pop())
                    running.add(pool.submit(run_task, task, progress, self.config.max_retries, prefetch=self.config.prefetch_batches,
                                              prefetch_bytes=self.config.prefetch_bytes))
                if not running:
                    break
                # a timeout, so that Ctrl-C is seen while long partitions run
                done, running = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in done:
                    result = fut.result()
                    results.append(result)
                    if not result.ok and stopping is None:
                        stopping = f"cancelled after partition {result.partition} failed"
        results += [not_run(task, f"not started: {stopping}") for task in pending]
        return sorted(results, key=lambda r: r.index)

    @staticmethod
    def _cap(degree: int) -> int:
        """Threads mostly wait on I/O, but thousands only contend: at most 4 per CPU."""
        cpus = os.cpu_count() or 1
        if degree > 4 * cpus:
            warn(f"degree={degree} capped to {4 * cpus}: runtime=local runs at most 4 tasks per CPU ({cpus} CPUs here)")
            return 4 * cpus
        return degree
