"""``runtime=auto``, the default: each job's tasks run in the driver's threads (as ``runtime=local``
runs them) or on Ray's workers (as ``runtime=ray``), chosen per job, and the report says which and why.

In the driver, where a Ray instance would run the tasks on the cores the driver has and only add
its start-up (starting a private instance takes seconds; a joined instance starts new worker
processes for every job):

- the sink writes every partition from one process (DuckDB);
- a job of one task with no instance to join (``one_task_in_driver``);
- a job whose source is at most ``in_driver_max_bytes`` (as it describes itself: a table's size on
  disk, the files' sizes) with no instance to join, at most one task per CPU;
- either of the last two on a joined instance that is this machine alone (one live node, the
  driver's), at most one task per CPU of that instance. Not on a cluster of several nodes (its head
  may be kept free of work), nor through a Ray client (``ray://``: the driver is elsewhere).

Everything else runs on Ray: an instance to join (``RAY_ADDRESS``, ``runtime.address``, one `ray
start` runs here), a source larger than ``in_driver_max_bytes`` or of unknown size, and any job with
``runtime.address=local``. ``runtime=ray`` always uses Ray's workers; ``runtime=local`` never does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.core import JobOptions, Progress, RuntimeBase, Task, TaskResult, sink_capabilities
from conveyor.log import note
from conveyor.runtime.local import LocalRuntime, LocalRuntimeConfig, in_threads
from conveyor.runtime.ray import RayRuntime, RayRuntimeConfig


@dataclass
class AutoRuntimeConfig(RayRuntimeConfig):
    #: a job of one task with no Ray instance to join runs that task in the driver process: a private
    #: instance would run it on the same cores after seconds of start-up. So does one on a joined
    #: instance that is this machine alone (its new worker processes start before the first task).
    #: false: the task goes to a Ray worker anyway
    one_task_in_driver: bool = True
    #: a job with no Ray instance to join whose source is at most this many bytes runs its tasks in the
    #: driver's threads, at most one per CPU: a private instance on this machine runs them on the same
    #: cores and costs more to start and stop than it can save on a job of about a minute. So does such a
    #: job on a joined instance that is this machine alone. A source of unknown size uses Ray's workers.
    #: 0: always use them
    in_driver_max_bytes: int = 8 * 1024**3

    def __post_init__(self) -> None:
        from conveyor.runtime.local import check_runtime_numbers

        check_runtime_numbers(self)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.3g} GiB" if nbytes >= 1024**3 else f"{nbytes / 1024**2:,.0f} MiB"


class AutoRuntime(RuntimeBase):
    config_class = AutoRuntimeConfig

    def __init__(self, config: AutoRuntimeConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self.ray = RayRuntime(config, options)
        self.report_note = ""
        #: why the sink keeps the tasks in the driver ("": it does not)
        self._one_process = ""
        #: why start_early found the job small enough for the driver's threads ("": it did not)
        self._small_job = ""
        #: the source's size as start_early heard it (None: unknown), for a small job on a joined instance
        self._estimated_bytes: int | None = None

    # --- the hooks the job calls ---------------------------------------------------------------

    def check(self, source: Any, sink: Any) -> None:
        """A sink written from one process keeps the tasks in the driver (``runtime=ray`` refuses it)."""
        single = sink_capabilities(sink).single_process
        self._one_process = f"sink {type(sink).__name__} writes every partition from one process" if single else ""

    def cpus(self) -> int:
        return (os.cpu_count() or 1) if self._one_process else self.ray.cpus()

    def start_early(self, degree: int, estimated_bytes: int | None = None) -> None:
        """Decide, once the source is described, whether the job is small enough for the driver with no
        instance to join; where it is not and the instance would be a private one, start it now, in the
        background, so that its start overlaps planning (an instance to join is looked at by ``run``)."""
        self._estimated_bytes = estimated_bytes
        if self._one_process:
            return
        instance = self.ray.instance
        if self.config.address != "local":  # runtime.address=local: the private instance, whatever the job
            if not instance.none_to_join():
                return
            # before the degree-1 rule: a small degree-1 job of several tasks runs in the driver too
            self._small_job = self._small(estimated_bytes)
            degree = JobOptions.resolve_degree(degree, self.cpus())  # the shipped pg_to_pg's -2 is 1 on two cores
            if self._small_job or (degree == 1 and self.config.one_task_in_driver):
                return
        self.ray.start_early(degree, estimated_bytes)

    def runs_tasks_here(self) -> bool:
        """Known to run in the driver once described: a sink of one process, or a small job with no
        instance to join (not a degree-1 job: only if it has one task; not where an instance is to be
        joined: that is decided by ``run``)."""
        return bool(self._one_process or self._small_job)

    def startup_seconds(self) -> float:
        return self.ray.startup_seconds()

    def release(self) -> None:
        self._small_job, self._estimated_bytes = "", None
        self.ray.release()

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        if tasks:
            self.check(tasks[0].source, tasks[0].sink)
        here = self._without_ray(tasks, degree)
        if here is not None:
            return self._in_driver(tasks, *here, progress)
        instance = self.ray.instance
        ray, started = instance.init()
        if started and not instance.private():  # a joined instance: is it this machine alone?
            here = self._on_this_machine_alone(ray, tasks, degree)
            if here is not None:
                instance.done(ray, started)  # left in the background while the tasks run
                return self._in_driver(tasks, *here, progress)
        self.report_note = f"runtime=auto: the tasks ran on Ray's workers ({self._why_ray(tasks)})"
        note(self.report_note)
        return self.ray.run_on(ray, started, tasks, degree, progress)

    # --- the choice -----------------------------------------------------------------------------

    def _small(self, estimated_bytes: int | None) -> str:
        """Why a job of this size runs in the driver's threads ("": it does not)."""
        limit = self.config.in_driver_max_bytes
        if limit <= 0 or estimated_bytes is None or estimated_bytes > limit:
            return ""
        return f"the source is about {_size(estimated_bytes)}, at most runtime.in_driver_max_bytes ({_size(limit)})"

    def _without_ray(self, tasks: Sequence[Task], degree: int) -> tuple[int, str] | None:
        """(tasks at once, why) where the tasks run in the driver without a look at Ray; None: Ray decides."""
        if self._one_process:
            return LocalRuntime.cap(degree), (f"runtime=auto: {self._one_process}: its {len(tasks)} task(s) ran in the driver "
                                              "process (runtime=ray refuses such a sink)")
        one = self.config.one_task_in_driver and len(tasks) == 1 and not self.ray.instance.started_early()
        if one and self.config.address != "local" and self.ray.instance.none_to_join():
            return 1, ("runtime=auto: one task and no Ray instance running: it ran in the driver process (a private instance "
                       "would add seconds of start-up; runtime=ray starts one anyway)")
        if self._small_job and len(tasks) > 1:
            degree = self.ray.slots(float(os.cpu_count() or 1), degree, "this machine")  # as its private instance would
            return degree, (f"runtime=auto: no Ray instance running and {self._small_job}: its {len(tasks)} tasks ran in the "
                            f"driver process, {degree} at a time (a private instance on this machine would add seconds of "
                            "start-up; runtime=ray starts one anyway)")
        return None

    def _on_this_machine_alone(self, ray: Any, tasks: Sequence[Task], degree: int) -> tuple[int, str] | None:
        """(tasks at once, why) where a job of one task or a small one runs in the driver's threads instead
        of on a joined instance's workers: the instance is this machine alone, whose new worker processes
        would run the tasks on the driver's cores after their start-up. None: they go to the workers."""
        one = self.config.one_task_in_driver and len(tasks) == 1
        small = self._small(self._estimated_bytes) if len(tasks) > 1 else ""
        if not (one or small):
            return None
        cpus = self.ray.instance.this_machine_alone(ray)
        if cpus < max(self.config.num_cpus_per_task, 0.01):
            return None
        if one:
            return 1, ("runtime=auto: one task, and the Ray instance is this machine alone: it ran in the driver process (a worker "
                       "process would run it on the same cores after its start-up; runtime=ray uses one)")
        degree = self.ray.slots(cpus, degree, "this machine's Ray instance")
        return degree, (f"runtime=auto: the Ray instance is this machine alone and {small}: its {len(tasks)} tasks ran in the "
                        f"driver process, {degree} at a time (worker processes would run them on the same cores after their "
                        "start-up; runtime=ray uses them)")

    def _why_ray(self, tasks: Sequence[Task]) -> str:
        instance = self.ray.instance
        if self.config.address == "local":
            return "runtime.address=local"
        if not instance.private():
            return f"the Ray instance at {instance.given() or instance.address()}"
        size, limit = self._estimated_bytes, self.config.in_driver_max_bytes
        if len(tasks) == 1 and not self.config.one_task_in_driver:
            why = "runtime.one_task_in_driver=false"
        elif limit <= 0:
            why = "runtime.in_driver_max_bytes=0"
        elif size is None:
            why = "the source's size is unknown"
        else:
            why = f"the source is about {_size(size)}, over runtime.in_driver_max_bytes ({_size(limit)})"
        return f"a private instance on this machine, as {why}"

    def _in_driver(self, tasks: Sequence[Task], degree: int, why: str, progress: Progress) -> list[TaskResult]:
        """The tasks in the driver's threads, as the local runtime runs them (Ctrl-C, a failed partition
        and retries behave the same)."""
        self.report_note = why
        note(why)
        config = LocalRuntimeConfig(max_retries=self.config.max_retries, prefetch_batches=self.config.prefetch_batches,
                                    prefetch_bytes=self.config.prefetch_bytes)
        return in_threads(tasks, degree, progress, config)
