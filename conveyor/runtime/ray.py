"""The Ray runtime: one Ray task per partition, on local cores or across a Ray cluster.

``address``: unset (the default) follows Ray's convention: the cluster named by ``RAY_ADDRESS``
when it is set (as it is for a driver started by ``ray job submit``), else the instance ``ray start``
runs on this machine, else a Ray instance started for the job (sized to this machine) and stopped
afterwards, unless the job is small enough (``in_driver_max_bytes``) or of one task, which then
runs in the driver's threads as the local runtime would (so does such a job on a joined instance
that is this machine alone: its workers would run the tasks on the same cores after a second of
start-up); ``local`` always starts that private
instance; ``auto`` joins the running cluster; or a ``ray://host:port`` / ``host:port`` address.
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
import dataclasses
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.compat import RAY_TOKEN_LOGGER, RAY_WORKER_LOGGER
from conveyor.core import (
    JobOptions,
    NullProgress,
    Progress,
    RuntimeBase,
    Task,
    TaskResult,
    cancel_requested,
    request_cancel,
    reset_cancel,
    sink_capabilities,
)
from conveyor.errors import ConfigError, ConnectError, TransferError, first_line
from conveyor.log import note, say, warn
from conveyor.runtime.reaper import Reaper
from conveyor.runtime.task import asked, not_run, retries_allowed, run_task, stopped

# seconds a stopping run waits for killed tasks to be confirmed before it reports them as stopped
_STOP_SECONDS = 10.0
# seconds between a task's looks for the run's stop signal
_STOP_POLL = 0.2


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
    #: for the progress display: an actor is a worker process of its own (about a second of CPU on
    #: this 2-core machine, ~0.4 s of a short job's wall time); a shorter run shows each partition's
    #: rows when it finishes. Off a terminal, not before the log's first progress line (10 s), which is
    #: the first to show running partitions' rows. 0: from the start
    progress_actor_after: float = 5.0
    #: a job of one task with no Ray instance to join runs that task in the driver process, as the
    #: local runtime would: starting a private instance for it costs seconds (5-7 s to start and
    #: stop on a 2-core machine) and buys nothing. So does one on a joined instance that is this
    #: machine alone (one node, the driver's): Ray starts new worker processes for every job, 1.2-1.4 s
    #: before their first task here, on the same cores. false: the task goes to a Ray worker anyway
    one_task_in_driver: bool = True
    #: a job with no Ray instance to join whose source is at most this many bytes (as it describes
    #: itself: a table's size on disk, the files' sizes) runs its tasks in the driver's threads, at
    #: most one per CPU, as the local runtime would: a private instance on this machine runs them on
    #: the same cores and costs seconds to start and stop, more than it can save on a job of about a
    #: minute. So does such a job on a joined instance that is this machine alone (one node, the
    #: driver's), at most one task per CPU of that instance: its new worker processes would run the
    #: tasks on the same cores after a second of start-up. A source of unknown size uses Ray's
    #: workers. 0: always use them
    in_driver_max_bytes: int = 8 * 1024**3
    #: seconds a stopping run (Ctrl-C, SIGTERM, a failed partition) gives its running tasks to stop
    #: themselves: each rolls back at its next batch or before its commit, as the local runtime's
    #: threads do; the workers of those still running then are killed (their transactions roll back)
    stop_wait: float = 10.0


#: the driver's disconnect from a joined cluster, running in the background (None: none begun)
_DISCONNECTING: threading.Thread | None = None


def _disconnect_in_background(ray: Any) -> None:
    """``ray.shutdown()`` of a cluster this process joined, in a thread of its own: Ray's teardown of
    its gRPC clients waits about 0.27 s here (a completion-queue poll that ends on its own deadline;
    0.02 CPU-s), which then overlaps the driver's verify, finalize, report and exit instead of
    preceding them. Not a daemon thread: the interpreter waits for it before its exit handlers run
    (Ray's own handler, had it still found the driver connected, would first sleep 0.5 s). The next
    job in this process waits for it before it looks at Ray (:func:`_disconnected`)."""
    global _DISCONNECTING

    def disconnect() -> None:
        try:
            ray.shutdown()
        except Exception as exc:  # the connection ends with the process anyway
            note(f"ray: disconnecting from the cluster: {type(exc).__name__}: {first_line(exc)}")

    _disconnected()
    thread = threading.Thread(target=disconnect, name="conveyor-ray-disconnect", daemon=False)
    _DISCONNECTING = thread
    thread.start()


def _disconnected() -> None:
    """Wait for a disconnect begun in the background (it takes about 0.3 s)."""
    global _DISCONNECTING
    thread, _DISCONNECTING = _DISCONNECTING, None
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def _remote_run(task: Task, max_retries: int, prefetch: int, collector: str | None, env: dict[str, str] | None = None,
                stop: str | None = None, prefetch_bytes: int = 0) -> TaskResult:
    """Runs on a Ray worker: the same task code as the local runtime, progress sent to the run's
    collector actor, named ``collector``, once the driver has made it (or nowhere, when nobody
    watches), with the forwarded environment set while it runs. Once an actor named ``stop`` exists
    (the driver makes it when the run stops), the task is cancelled as the local runtime's are: it
    rolls back at its next batch and returns a cancelled result (:func:`_watch_for_stop`)."""
    from unittest import mock  # the standard library's way to set and restore os.environ

    from conveyor.compat import ray_task_attempt

    with mock.patch.dict(os.environ, env or {}), _watch_for_stop(stop):
        result = run_task(task, _RemoteProgress(collector) if collector is not None else NullProgress(), max_retries,
                          prefetch=prefetch, prefetch_bytes=prefetch_bytes)
    lost = ray_task_attempt()  # Ray ran this task again after its worker was lost (max_retries): those attempts count too
    if lost:
        result = dataclasses.replace(result, attempts=result.attempts + lost,
                                     notes=(*result.notes, f"Ray ran it {lost} more time(s) after losing the worker it ran on"))
    return result


@contextlib.contextmanager
def _watch_for_stop(stop: str | None) -> Iterator[None]:
    """While the block runs, a thread looks every ``_STOP_POLL`` s for the actor named ``stop`` and,
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
        while not done.wait(_STOP_POLL):
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


class _Stop:
    """The run's stop signal: its name exists while the run stops (see :func:`_watch_for_stop`)."""


def _running_here() -> str | None:
    """The address of a Ray instance `ray start` runs on this machine (the file Ray keeps for
    ``ray.init()`` to find it), as Ray wrote it, if something answers there; a stale file (an
    instance gone without `ray stop`) is ignored."""
    import socket
    import tempfile
    from pathlib import Path

    # where Ray keeps the file (ray._common.utils.get_default_system_temp_dir): looked at first without
    # importing ray, which costs most of a second; no file there, no instance to join
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or ("/tmp" if os.name == "posix" else tempfile.gettempdir())
    if not (Path(tmp) / "ray" / "ray_current_cluster").exists():
        return None
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:  # another Ray: no discovery, as before
        return None

    try:
        address = Path(get_ray_address_file(None)).read_text().strip()
    except OSError:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    # the file names this machine by the address Ray picked for its node (its own address here, even
    # under `ray start --node-ip-address=127.0.0.1`): ray.init() joins it there, and so do we
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
    except OSError:
        return None
    return address


def _size(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.3g} GiB" if nbytes >= 1024**3 else f"{nbytes / 1024**2:,.0f} MiB"


class _Dropped(logging.Filter):
    """Drops one of Ray's log lines, by how its message starts; every other line passes."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def _dropped(logger: str, prefix: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    drop = _Dropped(prefix)
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _quiet_token_note(address: str) -> contextlib.AbstractContextManager[None]:
    """Ray's WARNING that token authentication is on: on Conveyor's own instance (``address=local``)
    and on the one `ray start` runs here, joined by discovery (``auto``), that is Ray's default and
    the one we want (the instance listens on this machine's address), and the line only said, on
    every run, that nothing was wrong. Joining a named cluster, it passes untouched;
    RAY_AUTH_MODE=disabled still opts out, as Ray documents."""
    if address not in ("local", "auto"):
        return contextlib.nullcontext()
    return _dropped(RAY_TOKEN_LOGGER, "Token authentication is enabled for this Ray cluster")


def _quiet_thread_note() -> contextlib.AbstractContextManager[None]:
    """Ray's WARNING that ``ray.init`` outside the main thread sets no SIGTERM handler: the instance
    start_early starts in a thread, and SIGTERM is Conveyor's to handle (it cancels the run)."""
    return _dropped(RAY_WORKER_LOGGER, "SIGTERM handler is not set")


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """The process's Python handlers of SIGTERM and SIGINT, as they were before Ray's driver started, put
    back in front of the signals after it (from the main thread). ``ray.init`` in the main thread sets its
    own SIGTERM handler (``sys.exit``: the run ended with exit 2 and no report); in any thread it installs
    absl's failure-signal handler for SIGTERM, which prints a stack, passes the signal on, and arms a
    3-second alarm that aborts the process (SIGABRT, exit 134): a run that took longer to stop died
    without its report."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set from C by someone else, and not Python's to give back
                signal.signal(sig, handler)


class _RemoteProgress:
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


class _Collector:
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


class _Settled:
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


class RayRuntime(RuntimeBase):
    config_class = RayRuntimeConfig

    def __init__(self, config: RayRuntimeConfig, options: JobOptions) -> None:
        self.config = config
        self.options = options
        self._reaper: Reaper | None = None
        #: seconds spent starting or joining Ray in this job (reported apart from the transfer)
        self._startup = 0.0
        #: cpus() connected to the cluster: run() disconnects when done
        self._connected_here = False
        #: what the report says of where the tasks ran, when it is not the usual
        self.report_note = ""
        #: the private instance starting in the background while the job plans (start_early)
        self._early: threading.Thread | None = None
        self._early_started = False
        self._early_error: BaseException | None = None
        self._early_seconds = 0.0
        self._early_ready = threading.Event()
        self._early_done = threading.Event()
        self._early_joined = False
        #: why start_early found the job small enough for the driver's threads ("": it did not)
        self._small_job = ""
        #: the source's size as start_early heard it (None: unknown), for a small job on a joined instance
        self._estimated_bytes: int | None = None

    # --- connecting ----------------------------------------------------------------------------

    def _init(self) -> tuple[Any, bool]:
        """(ray, whether this call started it)."""
        ray = self._import()
        _disconnected()
        if self._early is not None and not self._early_joined:
            return ray, self._join_early()
        if ray.is_initialized():
            return ray, False
        started_at = time.perf_counter()
        try:
            return self._start(ray)
        finally:
            self._startup += time.perf_counter() - started_at

    @staticmethod
    def _import() -> Any:
        try:
            import ray
        except ModuleNotFoundError:
            raise ConfigError("runtime=ray needs the ray package", key="runtime", hint="pip install 'conveyor[ray]', or use runtime=local") from None
        return ray

    def startup_seconds(self) -> float:
        """Seconds the job waited for Ray (a start overlapped with planning counts only the wait)."""
        return self._startup

    # --- starting while the job plans ----------------------------------------------------------

    def start_early(self, degree: int, estimated_bytes: int | None = None) -> None:
        """Start the private instance in a background thread while the driver plans and prepares
        (seconds of start-up then overlap them), where the job will want one: no instance to join,
        not a degree-1 job (its single task runs in the driver), and not a job small enough for the
        driver's threads (``in_driver_max_bytes``; ``run`` runs it there)."""
        self._estimated_bytes = estimated_bytes  # run() asks it again of a joined instance that is this machine alone
        if self._early is not None or self._address() != "local" or self._users_instance():
            return
        if self.config.address != "local":  # runtime.address=local: the private instance, whatever the job
            # before the degree-1 rule: a small degree-1 job of several tasks runs in the driver too
            self._small_job = self._small(estimated_bytes)
            degree = JobOptions.resolve_degree(degree, self.cpus())  # the shipped pg_to_pg's -2 is 1 on two cores
            if self._small_job or (degree == 1 and self.config.one_task_in_driver):
                return
        self._early_ready, self._early_done, self._early_joined = threading.Event(), threading.Event(), False
        self._early = threading.Thread(target=self._start_in_background, name="conveyor-ray-start", daemon=True)
        self._early.start()

    def runs_tasks_here(self) -> bool:
        """Whether start_early found that the tasks run in the driver: a small job with no instance to join
        (False where an instance to join decides later, where a small job may still run in the driver, and
        for a degree-1 job, whose tasks run here only if it has one: not known yet)."""
        return bool(self._small_job)

    def _small(self, estimated_bytes: int | None) -> str:
        """Why a job of this size runs in the driver's threads ("": it does not)."""
        limit = self.config.in_driver_max_bytes
        if limit <= 0 or estimated_bytes is None or estimated_bytes > limit:
            return ""
        return f"the source is about {_size(estimated_bytes)}, at most runtime.in_driver_max_bytes ({_size(limit)})"

    def _start_in_background(self) -> None:
        began = time.perf_counter()
        try:
            ray = self._import()
            self._early_started = self._start(ray)[1]
        except BaseException as exc:  # raised where the job waits for the instance
            self._early_error = exc
            return
        finally:
            self._early_seconds = time.perf_counter() - began
            self._early_ready.set()
        # Ray ties the GCS and the raylet to the *thread* that started them (PR_SET_PDEATHSIG fires
        # when that thread ends): this one stays until the job is done with the instance, then stops
        # it (about 1.5 s of waiting for its processes, while the driver verifies and finalizes)
        self._early_done.wait()
        if self._early_started:
            try:
                ray.shutdown()
            except Exception as exc:  # the processes end with the driver anyway (the reaper)
                note(f"ray: stopping the private instance: {type(exc).__name__}: {first_line(exc)}")
            self._end_reaper()

    def _join_early(self) -> bool:
        """Wait for the instance start_early began (the wait counts as start-up); whether it was
        started here (and so is stopped after the tasks); its start's error is raised here."""
        assert self._early is not None
        waited_from = time.perf_counter()
        self._early_ready.wait()
        waited = time.perf_counter() - waited_from
        self._startup += waited
        self._early_joined = True
        if self._early_error is not None:
            err, self._early_error = self._early_error, None
            self._let_go()
            raise err
        note(f"ray: private instance started in {self._early_seconds:.1f} s while the job planned; the tasks waited {waited:.1f} s for it")
        return self._early_started

    def _let_go(self) -> None:
        """The instance start_early began is no longer needed: the thread that started it stops it."""
        if self._early is not None:
            self._early_done.set()

    def release(self) -> None:
        """Stop the instance start_early began (if the tasks did not already let it go), and wait
        until it is stopped; leave a cluster that ``cpus()`` joined and no task used (``conveyor plan``,
        a job that failed before its tasks), in the background."""
        self._small_job, self._estimated_bytes = "", None
        if self._connected_here:
            self._connected_here = False
            _disconnect_in_background(self._import())
        if self._early is None:
            return
        self._early_done.set()
        self._early.join()
        self._early = None
        self._early_error, self._early_started = None, False

    def _start(self, ray: Any) -> tuple[Any, bool]:
        address = self._address()
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        if address == "local":
            kwargs.update(address="local", include_dashboard=False, num_cpus=os.cpu_count() or 1,
                          object_store_memory=256 * 1024 * 1024)
            self._reaper = Reaper().start()  # the private instance's processes end with this one
        else:
            self._check_reachable(address)
            # an instance found here is joined as ray.init() joins it, by discovery ("auto"): only that
            # turns on the token authentication `ray start` enables where this machine has a token
            # (~/.ray/auth_token, made by any ray.init() of a local instance); Ray never does for an address
            # given outright, and the join then failed after ~20 s with "Failed to connect"
            kwargs["address"] = address if self._given() else "auto"
        try:
            with _quiet_token_note(kwargs["address"]), _quiet_thread_note():
                ray.init(**kwargs)
        except BaseException as exc:
            self._end_reaper(reap=True)
            if not isinstance(exc, Exception):
                raise
            first = first_line(exc)
            what = "could not start a local Ray instance" if address == "local" else f"ray cluster {address}"
            token = ("a cluster with token authentication needs RAY_AUTH_MODE=token and its token here "
                     "(RAY_AUTH_TOKEN or ~/.ray/auth_token); "
                     if address != "local" and self._given() and os.environ.get("RAY_AUTH_MODE") != "token" else "")
            raise ConnectError(f"{what}: {type(exc).__name__}: {first}",
                               hint=f"is the cluster running? (ray status); {token}runtime=local needs no Ray at all") from None
        if address != "local":  # where the job runs is worth a line when it is not this machine's own instance
            say(f"ray: joined the cluster at {address} ({int(ray.cluster_resources().get('CPU', 1))} CPUs)")
        return ray, True

    def _address(self) -> str:
        """Where to run, as ``ray.init()`` decides: the configured address, else $RAY_ADDRESS, else
        the instance ``ray start`` runs on this machine (joined in well under a second, where starting
        one costs seconds), else ``local`` (a private instance)."""
        return self._given() or _running_here() or "local"

    def _given(self) -> str:
        """The address the user gave: runtime.address, else $RAY_ADDRESS ("": none, so an instance
        `ray start` runs here is found by Ray's file)."""
        return self.config.address or os.environ.get("RAY_ADDRESS", "").strip()

    def _check_reachable(self, address: str) -> None:
        """Fail within ``connect_timeout`` on an address nothing listens on (ray.init waits far longer)."""
        import socket

        if address == "auto":
            address = os.environ.get("RAY_ADDRESS", "auto")
            if address == "auto":
                return
        hostport = address.split("://", 1)[-1]
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"runtime.address: {address!r} is not local, auto, ray://host:port or host:port", key="runtime.address")
        deadline = time.monotonic() + self.config.connect_timeout
        while True:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConnectError(f"ray cluster {address}: cannot connect: {exc}",
                                       hint="is the cluster running? start one with `ray start --head`") from None
                time.sleep(0.5)

    def cpus(self) -> int:
        """The CPUs tasks run on: this machine's for a private instance (started later, by ``run``),
        else the cluster's (connecting now; ``run`` keeps using the connection)."""
        if self._address() == "local":
            return os.cpu_count() or 1
        ray, started = self._init()
        self._connected_here = self._connected_here or started
        return int(ray.cluster_resources().get("CPU", 1))

    # --- running -----------------------------------------------------------------------------

    def check(self, source: Any, sink: Any) -> None:
        """Refuse, before anything moves, a sink that cannot be written from several processes."""
        if sink_capabilities(sink).single_process:
            raise ConfigError(f"sink {type(sink).__name__} writes from one process and cannot run on Ray workers",
                              key="runtime", hint="use runtime=local")

    def run(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        if tasks:
            self.check(tasks[0].source, tasks[0].sink)
        if self._in_driver(tasks):
            self.report_note = ("ray: one task and no Ray instance running: it ran in the driver process (a private instance "
                                "would add seconds of start-up; runtime.one_task_in_driver=false starts one anyway)")
            return self._run_in_driver(tasks, 1, progress)
        if self._small_job and len(tasks) > 1:
            degree = self._slots(float(os.cpu_count() or 1), degree, "this machine")  # as its private instance would
            self.report_note = (f"ray: no Ray instance running and {self._small_job}: its {len(tasks)} tasks ran in the driver "
                                f"process, {degree} at a time (a private instance on this machine would add seconds of start-up; "
                                "runtime.in_driver_max_bytes=0 starts one anyway)")
            return self._run_in_driver(tasks, degree, progress)
        with _signals_kept():
            ray, started = self._init()
        started, self._connected_here = started or self._connected_here, False
        if started and self._reaper is None:
            here = self._here_instead(ray, tasks, degree)
            if here is not None:
                _disconnect_in_background(ray)  # while the tasks run
                return self._run_in_driver(tasks, here, progress)
        try:
            return self._run(ray, tasks, self._slots(float(ray.cluster_resources().get("CPU", 1)), degree), progress)
        finally:
            if self._early is not None:
                self._let_go()  # stopped in the background while the job verifies and finalizes (release waits)
            elif started and self._reaper is None:  # a joined cluster: left in the background
                _disconnect_in_background(ray)
            elif started:  # a private instance started here: its processes stop with it
                ray.shutdown()
                self._end_reaper()

    def _run_in_driver(self, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        """The tasks in the driver's threads, as the local runtime runs them (Ctrl-C, a failed
        partition and retries behave the same)."""
        from conveyor.runtime.local import LocalRuntime, LocalRuntimeConfig

        note(self.report_note)
        local = LocalRuntime(LocalRuntimeConfig(max_retries=self.config.max_retries, prefetch_batches=self.config.prefetch_batches,
                                                  prefetch_bytes=self.config.prefetch_bytes),
                             self.options)
        return local.run(tasks, degree, progress)

    def _one_task(self, tasks: Sequence[Task]) -> bool:
        """A job of one task that may run in the driver (``one_task_in_driver``; no private instance
        started early for it)."""
        return self.config.one_task_in_driver and len(tasks) == 1 and self._early is None

    def _here_instead(self, ray: Any, tasks: Sequence[Task], degree: int) -> int | None:
        """How many of the tasks run at once in the driver's threads instead of on the joined cluster's
        workers (None: they go to the workers): a job of one task (``one_task_in_driver``) or one whose
        source is at most ``in_driver_max_bytes``, on a cluster that is this machine alone (one node,
        the one the driver is attached to). Its worker processes would run the tasks on the same cores
        as the driver, after 1.2-1.4 s of start-up here (Ray starts new workers for every job:
        importing Ray, joining, importing the task's modules): on TPC-H orders the shipped Parquet
        jobs took about twice their time with no instance to join. Not a cluster of several nodes
        (its head may be kept free of work), nor a Ray client (``ray://``: the driver is elsewhere)."""
        one = self._one_task(tasks)
        small = self._small(self._estimated_bytes) if len(tasks) > 1 else ""
        if not (one or small) or self._given().startswith("ray://"):
            return None
        cpus = self._this_machine_alone(ray)
        if cpus < max(self.config.num_cpus_per_task, 0.01):
            return None
        if one:
            self.report_note = ("ray: one task, and the Ray instance is this machine alone: it ran in the driver process (a worker "
                                "process would run it on the same cores after about a second of start-up; "
                                "runtime.one_task_in_driver=false uses one)")
            return 1
        degree = self._slots(cpus, degree, "this machine's Ray instance")
        self.report_note = (f"ray: the Ray instance is this machine alone and {small}: its {len(tasks)} tasks ran in the driver "
                            f"process, {degree} at a time (worker processes would run them on the same cores after about a second "
                            "of start-up; runtime.in_driver_max_bytes=0 uses them)")
        return degree

    @staticmethod
    def _this_machine_alone(ray: Any) -> float:
        """The CPUs of the joined cluster when it is this machine alone (one live node, the driver's); 0 when it is not."""
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            here = ray.get_runtime_context().get_node_id()
        except Exception as exc:  # the tasks then run as usual, on workers
            note(f"ray: could not tell whether the cluster is this machine alone: {type(exc).__name__}: {first_line(exc)}")
            return 0.0
        if len(nodes) != 1 or nodes[0].get("NodeID") != here:
            return 0.0
        return float(nodes[0].get("Resources", {}).get("CPU", 0))

    def _in_driver(self, tasks: Sequence[Task]) -> bool:
        """One task, and only a private instance to run it on (none running here, none named)."""
        if not self._one_task(tasks) or self._connected_here:
            return False
        if self._users_instance():  # use it
            return False
        return self._address() == "local" and self.config.address != "local"

    @staticmethod
    def _users_instance() -> bool:
        """A library user's own Ray instance is up in this process (the job runs on it)."""
        ray = sys.modules.get("ray")
        if ray is not None:
            _disconnected()  # not the cluster a job before this one is still leaving
        return ray is not None and ray.is_initialized()

    def _end_reaper(self, reap: bool = False) -> None:
        if self._reaper is not None:
            self._reaper.stop(reap)
            self._reaper = None

    def _slots(self, cpus: float, degree: int, where: str = "the Ray cluster") -> int:
        """At most as many tasks at once as the cluster has CPUs for (more would only queue)."""
        slots = max(1, int(cpus / max(self.config.num_cpus_per_task, 0.01)))
        if degree > slots:
            warn(f"degree={degree} capped to {slots}: {where} has {cpus:g} CPUs for tasks of "
                 f"{self.config.num_cpus_per_task:g} CPU each")
            return slots
        return degree

    def _run(self, ray: Any, tasks: Sequence[Task], degree: int, progress: Progress) -> list[TaskResult]:
        retries = retries_allowed(tasks[0].sink, self.config.max_retries) if tasks else 0
        remote = ray.remote(_remote_run).options(num_cpus=self.config.num_cpus_per_task, max_retries=retries, retry_exceptions=False)
        # An actor is a worker process of its own (about a second of start-up CPU here): made only
        # when something shows progress and the tasks have run progress_actor_after seconds (the
        # tasks find it by its name), and polled without blocking the scheduling loop.
        name = f"conveyor-progress-{uuid.uuid4().hex}" if not isinstance(progress, NullProgress) else None
        # not before the display shows running partitions' rows (off a terminal: its first log line)
        actor_after = max(self.config.progress_actor_after, progress.live_rows_after)
        collector = None
        began = time.monotonic()
        missing = [k for k in self.config.forward_env if k not in os.environ]
        if missing:
            warn(f"runtime.forward_env: {', '.join(missing)} not set here: not forwarded")
        env = {k: os.environ[k] for k in self.config.forward_env if k in os.environ}
        env_ref = ray.put(env) if env else None  # once, shared by every task; not in any log
        progress = _Settled(progress)
        poll: Any = None  # the collector's count request in flight
        pending = list(reversed(tasks))
        running: dict[Any, Task] = {}
        results: list[TaskResult] = []
        stopping: str | None = None  # why nothing more starts: Ctrl-C, or a failed partition
        killed: set[Any] = set()  # the tasks that did not stop when asked: their workers are killed
        stop_name = f"conveyor-stop-{uuid.uuid4().hex}"
        signal: Any = None  # the stop actor, once made
        ask_until = deadline = None  # until when the running tasks may stop themselves; then, for the killed ones
        try:
            while running or (pending and stopping is None):
                if stopping is None and cancel_requested():
                    stopping = "cancelled (Ctrl-C or SIGTERM) before it finished"
                    signal, ask_until = self._ask_to_stop(ray, stop_name)
                while pending and stopping is None and len(running) < degree:
                    task = pending.pop()
                    progress.started(task.partition.key)
                    running[remote.remote(task, self.config.max_retries, self.config.prefetch_batches, name, env_ref, stop_name,
                                                 prefetch_bytes=self.config.prefetch_bytes)] = task
                if name is not None and collector is None and running and time.monotonic() - began >= actor_after:
                    collector = ray.remote(num_cpus=0)(_Collector).options(name=name).remote()
                done, _ = ray.wait(list(running), num_returns=1, timeout=self.config.progress_interval)
                if collector is not None:
                    poll = self._forward(ray, collector, poll, progress)
                for ref in done:
                    result = self._result(ray, ref, running.pop(ref), stopping)
                    if ref in killed:
                        result = stopped(result, stopping or "cancelled")
                    elif stopping is not None:
                        result = asked(result, stopping)
                    results.append(result)
                    progress.finished(result)
                    if not result.ok and stopping is None:
                        stopping = f"cancelled after partition {result.partition} failed"
                        signal, ask_until = self._ask_to_stop(ray, stop_name)
                if ask_until is not None and deadline is None and running and time.monotonic() > ask_until:
                    deadline = self._stop(ray, running, killed)  # they did not stop when asked
                if deadline is not None and running and time.monotonic() > deadline:
                    for task in running.values():  # killed, but Ray did not confirm in time
                        results.append(not_run(task, f"{stopping} (its worker was killed)"))
                    running.clear()
        finally:
            # the run's Ray references are dropped while the driver is connected, on the way out of an
            # exception too (its traceback keeps this frame): an ObjectRef released after the driver left the
            # cluster ends the process (Ray's "The core worker has already been shutdown ... The process will
            # exit"), exit status 1 after a committed run
            poll = env_ref = None
            running.clear()
            killed.clear()
            for actor in (collector, signal):
                if actor is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(actor)
        results += [not_run(task, f"not started: {stopping}") for task in pending]
        return sorted(results, key=lambda r: r.index)

    def _ask_to_stop(self, ray: Any, name: str) -> tuple[Any, float]:
        """Ask the running tasks to stop: the actor named ``name`` their watchers look for
        (:func:`_watch_for_stop`; None if it could not be made: the tasks are killed when the time is
        up), and until when they may take to do so."""
        try:
            signal = ray.remote(num_cpus=0)(_Stop).options(name=name).remote()
        except Exception:
            signal = None
        return signal, time.monotonic() + self.config.stop_wait

    def _stop(self, ray: Any, running: dict[Any, Task], killed: set[Any]) -> float:
        """Kill the workers of the tasks still running after they were asked to stop (their open
        transactions roll back), adding them to ``killed``; a deadline to hear back. A task that has
        already finished keeps its own result, failed or committed."""
        finished = set(ray.wait(list(running), num_returns=len(running), timeout=0)[0]) if running else set()
        for ref in running:
            if ref in finished:
                continue
            killed.add(ref)
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        return time.monotonic() + _STOP_SECONDS

    @staticmethod
    def _forward(ray: Any, collector: Any, poll: Any, progress: Progress) -> Any:
        """Hand the collector's counts to ``progress`` if they are there (never waits for them); the
        request still in flight (``poll``: None once answered, a new one is then made)."""
        if poll is None:
            poll = collector.take.remote()
        if not ray.wait([poll], timeout=0)[0]:
            return poll
        for key, (rows, nbytes) in ray.get(poll).items():
            progress.advanced(key, rows, nbytes)
        return None

    def _result(self, ray: Any, ref: Any, task: Task, stopping: str | None) -> TaskResult:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        key = task.partition.key
        try:
            return ray.get(ref)
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
