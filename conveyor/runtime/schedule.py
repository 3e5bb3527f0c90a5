"""The one scheduling loop of every runtime: at most ``degree`` tasks running, none started once
the run stops (Ctrl-C or SIGTERM, or a failed partition), one result per task.

What differs between runtimes is a :class:`Pool`: where a task is started (a thread of this
process, a Ray worker), how the loop waits for one to finish, how the running ones are asked to
stop, and what becomes of those that do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from conveyor.core import Task, TaskResult, cancel_requested
from conveyor.runtime.task import not_run

#: why a run stops when it is cancelled from outside
CANCELLED = "cancelled (Ctrl-C or SIGTERM) before it finished"


class Pool(Protocol):
    """Where a runtime's tasks run (a handle per running task)."""

    def submit(self, task: Task) -> Any:
        """Start ``task``; its handle."""

    def wait(self, handles: list[Any]) -> list[Any]:
        """The handles of tasks that finished, waiting at most a short while (the loop looks for
        Ctrl-C between waits)."""

    def result(self, handle: Any, task: Task, stopping: str | None) -> TaskResult:
        """The finished task's result (``stopping``: why the run stops, if it does)."""

    def stop(self, stopping: str) -> None:
        """The run stops (``stopping`` says why): ask the running tasks to stop."""

    def overdue(self, running: dict[Any, Task], stopping: str | None) -> list[TaskResult]:
        """Called after each wait: the results of running tasks given up on (removed from ``running``)."""


def schedule(tasks: Sequence[Task], degree: int, pool: Pool) -> list[TaskResult]:
    """Run every task in ``pool``, at most ``degree`` at once; stop starting new ones after a failure
    or Ctrl-C (those are reported not started). The results in the tasks' order."""
    results: list[TaskResult] = []
    pending = list(reversed(tasks))
    running: dict[Any, Task] = {}
    stopping: str | None = None
    try:
        while running or (pending and stopping is None):
            if stopping is None and cancel_requested():
                stopping = CANCELLED
                pool.stop(stopping)
            while pending and stopping is None and len(running) < degree:
                task = pending.pop()
                running[pool.submit(task)] = task
            if not running:
                break
            for handle in pool.wait(list(running)):
                result = pool.result(handle, running.pop(handle), stopping)
                results.append(result)
                if not result.ok and stopping is None:
                    stopping = f"cancelled after partition {result.partition} failed"
                    pool.stop(stopping)
            results += pool.overdue(running, stopping)
    finally:
        running.clear()  # a Ray run's references go while the driver is connected, on the way out of an exception too
    results += [not_run(task, f"not started: {stopping}") for task in pending]
    return sorted(results, key=lambda r: r.index)
