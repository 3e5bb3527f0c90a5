"""What runs on a Ray worker, and how what it does reaches the driver.

:func:`remote_run` is the Ray task: the same task code as the local runtime, with the run's stop
signal watched (:func:`watch_for_stop`) and its progress sent to the run's collector actor
(:class:`RemoteProgress` -> :class:`Collector`), which the driver polls and hands to the display
through :class:`Settled` (a finished partition's totals are its result's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from conveyor.core import NullProgress, Progress, Task, TaskResult, request_cancel, reset_cancel
from conveyor.runtime.task import run_task

# seconds between a task's looks for the run's stop signal
STOP_POLL = 0.2


def remote_run(task: Task, max_retries: int, prefetch: int, collector: str | None, env: dict[str, str] | None = None,
                stop: str | None = None, prefetch_bytes: int = 0) -> TaskResult:
    """Runs on a Ray worker: the same task code as the local runtime, progress sent to the run's
    collector actor, named ``collector``, once the driver has made it (or nowhere, when nobody
    watches), with the forwarded environment set while it runs. Once an actor named ``stop`` exists
    (the driver makes it when the run stops), the task is cancelled as the local runtime's are: it
    rolls back at its next batch and returns a cancelled result (:func:`watch_for_stop`)."""
    from unittest import mock  # the standard library's way to set and restore os.environ

    from conveyor.compat import ray_task_attempt

    with mock.patch.dict(os.environ, env or {}), watch_for_stop(stop):
        result = run_task(task, RemoteProgress(collector) if collector is not None else NullProgress(), max_retries,
                          prefetch=prefetch, prefetch_bytes=prefetch_bytes)
    lost = ray_task_attempt()  # Ray ran this task again after its worker was lost (max_retries): those attempts count too
    if lost:
        result = dataclasses.replace(result, attempts=result.attempts + lost,
                                     notes=(*result.notes, f"Ray ran it {lost} more time(s) after losing the worker it ran on"))
    return result


@contextlib.contextmanager
def watch_for_stop(stop: str | None) -> Iterator[None]:
    """While the block runs, a thread looks every ``STOP_POLL`` s for the actor named ``stop`` and,
    once it is there, asks this worker's task to stop (``request_cancel``: the flag the task checks
    at each batch, and the connectors' guards wait on). The driver stops a run this way, not with
    ``ray.cancel``: a cancel that meets a task's completion on its way back fails a check in Ray's
    core worker, which ends the driver process (``Check failed: it != submissible_tasks_.end()
    Tried to complete task that was not pending``, Ray 2.60; seen here on a Ctrl-C that met a
    partition's commit), and a task stopped this way rolls back on its own instead of by its
    worker's death. The flag is cleared before and after: Ray runs the job's next task in this process."""
    if stop is None:
        yield
        return
    import ray

    reset_cancel()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(STOP_POLL):
            try:
                ray.get_actor(stop)
            except ValueError:  # not there: the run goes on
                continue
            except Exception:  # the driver or the instance going away: the task ends with them anyway
                return
            request_cancel()
            return

    watcher = threading.Thread(target=watch, name="conveyor-stop-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        reset_cancel()


class Stop:
    """The run's stop signal: its name exists while the run stops (see :func:`watch_for_stop`)."""


class RemoteProgress:
    """A task's counts, sent to the run's collector actor; until the driver has made it (looked up
    by name at most once a second), they add up here and go together once it is found."""

    live_rows_after = 0.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.actor: Any = None
        self.held: dict[str, list[int]] = {}
        self.looked = 0.0

    def started(self, key: str) -> None:
        pass

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        if self.actor is not None:
            self.actor.add.remote(key, rows, nbytes)
            return
        held = self.held.setdefault(key, [0, 0])
        held[0] += rows
        held[1] += nbytes
        if time.monotonic() - self.looked < 1.0:
            return
        self.looked = time.monotonic()
        import ray

        try:
            self.actor = ray.get_actor(self.name)
        except Exception:  # not made yet (a short run never makes it); progress never fails a partition
            return
        for k, (r, b) in self.held.items():
            self.actor.add.remote(k, r, b)
        self.held = {}

    def finished(self, result: TaskResult) -> None:
        pass


class Collector:
    """A Ray actor adding up rows and bytes per partition while tasks run."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, key: str, rows: int, nbytes: int) -> None:
        c = self.counts.setdefault(key, [0, 0])
        c[0] += rows
        c[1] += nbytes

    def take(self) -> dict[str, list[int]]:
        out, self.counts = self.counts, {}
        return out


class Settled:
    """Progress whose per-partition totals end at what each finished task reports.

    Workers send counts to the collector fire-and-forget, so some arrive after their task has
    returned: a finished partition is topped up from its result and later counts for it dropped.
    """

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.live_rows_after = progress.live_rows_after
        self.seen: dict[str, list[int]] = {}
        self.closed: set[str] = set()

    def started(self, key: str) -> None:
        self.progress.started(key)

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        if key in self.closed:
            return
        seen = self.seen.setdefault(key, [0, 0])
        seen[0] += rows
        seen[1] += nbytes
        self.progress.advanced(key, rows, nbytes)

    def finished(self, result: TaskResult) -> None:
        rows, nbytes = self.seen.get(result.partition, (0, 0))
        if result.ok and (result.rows > rows or result.bytes > nbytes):
            self.progress.advanced(result.partition, max(result.rows - rows, 0), max(result.bytes - nbytes, 0))
        self.closed.add(result.partition)
        self.progress.finished(result)
