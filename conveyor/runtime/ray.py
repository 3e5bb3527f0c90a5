"""The Ray runtime: one Ray task per partition, on a Ray instance's workers (local cores or a
cluster). Asked for Ray, it uses Ray: whether a job is better run in the driver's threads is
``runtime=auto``'s choice (:mod:`conveyor.runtime.auto`), not this runtime's.

Which instance (``address``) and its start, join and stop: :mod:`conveyor.runtime.rayinstance`.
At most ``degree`` tasks run at once; a negative degree is a fraction of the cluster's CPUs.

Failures: a task whose worker process dies is retried by Ray (``max_retries``); a retriable
error (dropped connection, server restart, deadlock) is retried inside the task with backoff.
Since the sink writes each partition in one transaction, a retry neither duplicates nor loses
rows. A fatal error or a Ctrl-C asks the running tasks to stop (each rolls back at its next
batch, as the local runtime's threads do, and reports itself cancelled); the workers of those
that have not stopped after ``stop_wait`` seconds are killed (their open transactions roll back),
and the killed partitions are reported cancelled, even when their task reported the failure the
kill caused first (psql killed with its worker). The job's error is the partition that stopped it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.core import JobOptions, NullProgress, Progress, RuntimeBase, Task, TaskResult, sink_capabilities
from conveyor.errors import ConfigError, TransferError, first_line
from conveyor.log import warn
from conveyor.runtime.rayinstance import RayInstance
from conveyor.runtime.rayworker import Collector, Settled, Stop, remote_run
from conveyor.runtime.schedule import schedule
from conveyor.runtime.task import asked, not_run, retries_allowed, stopped

# seconds a stopping run waits for killed tasks to be confirmed before it reports them as stopped
_STOP_SECONDS = 10.0


@dataclass
class RayRuntimeConfig:
    #: null: $RAY_ADDRESS when set (e.g. inside `ray job submit`), else the instance `ray start` runs on
    #: this machine, else a private instance for the job;
    #: local (always the private instance) | auto (the running cluster) | ray://host:port | host:port
    address: str | None = None
    #: how often a partition is tried again after a retriable error or a dead worker
    max_retries: int = 2
    #: CPUs Ray reserves for each task
    num_cpus_per_task: float = 1.0
    #: seconds to wait for a cluster to answer
    connect_timeout: float = 30.0
    #: names of environment variables (e.g. PGPASSWORD) forwarded to the workers: their values go
    #: with the tasks (Ray's object store, never its logs; not Ray's runtime_env, whose agent logs
    #: them in plain text) and are set around each task on the worker
    forward_env: list[str] = field(default_factory=list)
    #: batches a task reads ahead of its writer, in a thread: reading overlaps writing
    prefetch_batches: int = 4
    #: and at most this many bytes of them (one batch larger than that still goes ahead alone; 0: no
    #: limit but the count): what a task holds ahead is bounded by bytes, not by how the source
    #: slices its rows into batches
    prefetch_bytes: int = 32 * 1024 * 1024
    #: seconds between progress polls on the driver
    progress_interval: float = 0.5
    #: seconds a run's tasks go before the driver starts the actor that gathers their rows and bytes
    #: for the progress display: an actor is a worker process of its own (it costs CPU and wall time
    #: a short job notices); a shorter run shows each partition's rows when it finishes. Off a
    #: terminal, not before the log's first progress line, which is the first to show running
    #: partitions' rows. 0: from the start
    progress_actor_after: float = 5.0
    #: seconds a stopping run (Ctrl-C, SIGTERM, a failed partition) gives its running tasks to stop
    #: themselves: each rolls back at its next batch or before its commit, as the local runtime's
    #: threads do; the workers of those still running then are killed (their transactions roll back)
    stop_wait: float = 10.0

    def __post_init__(self) -> None:
        from conveyor.runtime.local import check_runtime_numbers

        check_runtime_numbers(self)


class RayRuntime(RuntimeBase):
    config_class = RayRuntimeConfig

    def __init__(self, config: RayRuntimeConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.instance = RayInstance(config)

    def check(self, source: Any, sink: Any) -> None:
        """Refuse, before anything moves, a sink that cannot be written from several processes."""
        if sink_capabilities(sink).single_process:
            raise ConfigError(f"sink {type(sink).__name__} writes from one process and cannot run on Ray workers",
                              key="runtime", hint="use runtime=local (or runtime=auto: it runs such a job in the driver)")

    def cpus(self) -> int:
        return self.instance.cpus()

    def each(self, work: Any, items: Any, degree: int, names: Any = ()) -> list[Any]:
        """``work(item)`` of every item as Ray tasks (each named, e.g. ``conveyor verify <partition>``) on the job's instance."""
        ray, started = self.instance.init()
        try:
            remote = ray.remote(_each_call)
            refs = [remote.options(name=name, num_cpus=1, max_retries=1).remote(work, item)
                    for item, name in zip(items, list(names) or [f"conveyor task {i}" for i in range(len(items))])]
            return ray.get(refs)
        finally:
            self.instance.done(ray, started)

    def start_early(self, degree: int, estimated_bytes: int | None = None) -> None:
        """A private instance (nothing to join) starts in the background while the driver plans."""
        self.instance.start_early()

    def runs_tasks_here(self) -> bool:
        return False

    def startup_seconds(self) -> float:
        """Seconds the job waited for Ray (a start overlapped with planning counts only the wait)."""
        return self.instance.startup

    def release(self) -> None:
        self.instance.release()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        ray, started = self.instance.init()  # the jobs inside find it initialized: they neither start nor stop it
        try:
            yield
        finally:
            self.instance.done(ray, started)

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        if tasks:
            self.check(tasks[0].source, tasks[0].sink)
        ray, started = self.instance.init()
        return self.run_on(ray, started, tasks, degree, progress)

    def run_on(self, ray: Any, started: bool, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        """The tasks on the instance ``init`` gave (``started``: by this job, which leaves or stops it after)."""
        try:
            slots = self.slots(float(ray.cluster_resources().get("CPU", 1)), degree)
            with Workers(ray, tasks, self.config, progress) as workers:
                return schedule(tasks, slots, workers)
        finally:
            self.instance.done(ray, started)

    def slots(self, cpus: float, degree: int, where: str = "the Ray cluster") -> int:
        """At most as many tasks at once as the cluster has CPUs for (more would only queue)."""
        slots = max(1, int(cpus / max(self.config.num_cpus_per_task, 0.01)))
        if degree > slots:
            warn(f"degree={degree} capped to {slots}: {where} has {cpus:g} CPUs for tasks of "
                 f"{self.config.num_cpus_per_task:g} CPU each")
            return slots
        return degree


class Workers:
    """The Ray runtime's :class:`~conveyor.runtime.schedule.Pool`: a Ray task per partition, the
    progress collector made once the tasks have run a while, the stop signal, the kill of tasks that
    do not stop when asked."""

    def __init__(self, ray: Any, tasks: Sequence[Task], config: RayRuntimeConfig, progress: Progress) -> None:
        self.ray, self.config = ray, config
        retries = retries_allowed(tasks[0].sink, config.max_retries) if tasks else 0
        # each task named by its partition (Ray's dashboard and `ray list tasks` show that, not the function's name)
        self.remote, self.task_options = ray.remote(remote_run), {"num_cpus": config.num_cpus_per_task, "max_retries": retries,
                                                                   "retry_exceptions": False}
        # An actor is a worker process of its own: made only when something shows progress and the
        # tasks have run progress_actor_after seconds (the tasks find it by its name), and polled
        # without blocking the scheduling loop.
        self.name = f"conveyor-progress-{uuid.uuid4().hex}" if not isinstance(progress, NullProgress) else None
        # not before the display shows running partitions' rows (off a terminal: its first log line)
        self.actor_after = max(config.progress_actor_after, progress.live_rows_after)
        self.collector: Any = None
        self.poll: Any = None  # the collector's count request in flight
        self.began = time.monotonic()
        missing = [k for k in config.forward_env if k not in os.environ]
        if missing:
            warn(f"runtime.forward_env: {', '.join(missing)} not set here: not forwarded")
        env = {k: os.environ[k] for k in config.forward_env if k in os.environ}
        self.env_ref = ray.put(env) if env else None  # once, shared by every task; not in any log
        self.progress = Settled(progress)
        self.stop_name = f"conveyor-stop-{uuid.uuid4().hex}"
        self.signal: Any = None  # the stop actor, once made
        self.ask_until: float | None = None  # until when the running tasks may stop themselves
        self.deadline: float | None = None  # then, until when their kill may take to be confirmed
        self.killed: set[Any] = set()  # the tasks that did not stop when asked: their workers are killed

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        # the run's Ray references are dropped while the driver is connected, on the way out of an
        # exception too (its traceback keeps the loop's frame): an ObjectRef released after the driver
        # left the cluster ends the process (Ray's "The core worker has already been shutdown ... The
        # process will exit"), exit status 1 after a committed run
        self.poll = self.env_ref = None
        self.killed.clear()
        for actor in (self.collector, self.signal):
            if actor is not None:
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)

    def submit(self, task: Task) -> Any:
        self.progress.started(task.partition.key)
        named = self.remote.options(**self.task_options, name=f"conveyor {task.partition.key}")
        return named.remote(task, self.config.max_retries, self.config.prefetch_batches, self.name, self.env_ref, self.stop_name,
                                  prefetch_bytes=self.config.prefetch_bytes)

    def wait(self, handles: list[Any]) -> list[Any]:
        if self.name is not None and self.collector is None and handles and time.monotonic() - self.began >= self.actor_after:
            self.collector = self.ray.remote(num_cpus=0)(Collector).options(name=self.name).remote()
        done, _ = self.ray.wait(handles, num_returns=1, timeout=self.config.progress_interval)
        if self.collector is not None:
            self._forward()
        return done

    def result(self, handle: Any, task: Task, stopping: str | None) -> TaskResult:
        result = self._result(handle, task, stopping)
        if handle in self.killed:
            result = stopped(result, stopping or "cancelled")
        elif stopping is not None:
            result = asked(result, stopping)
        self.progress.finished(result)
        return result

    def stop(self, stopping: str) -> None:
        """Ask the running tasks to stop: the actor named ``stop_name`` their watchers look for
        (:func:`~conveyor.runtime.rayworker.watch_for_stop`; if it cannot be made, the tasks are
        killed when the time is up)."""
        try:
            self.signal = self.ray.remote(num_cpus=0)(Stop).options(name=self.stop_name).remote()
        except Exception:
            self.signal = None
        self.ask_until = time.monotonic() + self.config.stop_wait

    def overdue(self, running: dict[Any, Task], stopping: str | None) -> list[TaskResult]:
        """Kill the workers of the tasks still running after they were asked to stop (their open
        transactions roll back); once their kill is not confirmed in time, give them up. A task that has
        already finished keeps its own result, failed or committed."""
        now = time.monotonic()
        if self.ask_until is not None and self.deadline is None and running and now > self.ask_until:
            finished = set(self.ray.wait(list(running), num_returns=len(running), timeout=0)[0])
            for ref in running:
                if ref not in finished:
                    self.killed.add(ref)
                    with contextlib.suppress(Exception):
                        self.ray.cancel(ref, force=True)
            self.deadline = now + _STOP_SECONDS
        if self.deadline is None or not running or now <= self.deadline:
            return []
        given_up = [not_run(task, f"{stopping} (its worker was killed)") for task in running.values()]
        running.clear()
        return given_up

    def _forward(self) -> None:
        """Hand the collector's counts to the display if they are there (never waits for them)."""
        if self.poll is None:
            self.poll = self.collector.take.remote()
        if not self.ray.wait([self.poll], timeout=0)[0]:
            return
        counts, self.poll = self.ray.get(self.poll), None
        for key, (rows, nbytes) in counts.items():
            self.progress.advanced(key, rows, nbytes)

    def _result(self, ref: Any, task: Task, stopping: str | None) -> TaskResult:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        key = task.partition.key
        try:
            return self.ray.get(ref)
        except TaskCancelledError:
            return not_run(task, stopping or "cancelled")
        except RayError as exc:
            if stopping is not None:  # its worker was killed because the run stops
                return not_run(task, stopping)
            cause = exc.cause if isinstance(exc, RayTaskError) else None
            first = first_line(cause or exc)
            err = TransferError(f"partition {key}: the Ray task failed after {self.config.max_retries} retries: {type(exc).__name__}: {first}",
                                partition=key)
            return TaskResult(key, task.partition.index, attempts=self.config.max_retries + 1, error=err)


def _each_call(work: Any, item: Any) -> Any:
    """A Ray task of :meth:`RayRuntime.each`."""
    return work(item)
