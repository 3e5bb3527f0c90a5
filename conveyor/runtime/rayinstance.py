"""The Ray instance a job runs on: which one (an address given, ``$RAY_ADDRESS``, the one `ray start`
runs on this machine, else a private instance started for the job), starting or joining it (in the
background while the job plans, where it is a private one), and leaving or stopping it afterwards.

``address``: unset follows Ray's convention: the cluster named by ``RAY_ADDRESS`` when it is set
(as it is for a driver started by ``ray job submit``), else the instance ``ray start`` runs on this
machine, else a private instance (sized to this machine, stopped after the tasks, its processes
ended with the driver's however it ends: :mod:`conveyor.runtime.reaper`); ``local`` always starts
that private instance; ``auto`` joins the running cluster; or a ``ray://host:port`` /
``host:port`` address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from conveyor.errors import ConfigError, ConnectError, first_line
from conveyor.log import note, say
from conveyor.runtime.raylog import quiet_thread_note, quiet_token_note
from conveyor.runtime.reaper import Reaper

#: the driver's disconnect from a joined cluster, running in the background (None: none begun)
_DISCONNECTING: threading.Thread | None = None


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("running on Ray needs the ray package", key="runtime", hint="pip install 'conveyor[ray]', or use runtime=local") from None
    return ray


def disconnect_in_background(ray: Any) -> None:
    """``ray.shutdown()`` of a cluster this process joined, in a thread of its own: Ray's teardown of
    its gRPC clients waits on its own deadline (a completion-queue poll), which then overlaps the
    driver's verify, finalize, report and exit instead of preceding them. Not a daemon thread: the
    interpreter waits for it before its exit handlers run (Ray's own handler, had it still found the
    driver connected, would first sleep 0.5 s). The next job in this process waits for it before it
    looks at Ray (:func:`disconnected`)."""
    global _DISCONNECTING

    def disconnect() -> None:
        try:
            ray.shutdown()
        except Exception as exc:  # the connection ends with the process anyway
            note(f"ray: disconnecting from the cluster: {type(exc).__name__}: {first_line(exc)}")

    disconnected()
    thread = threading.Thread(target=disconnect, name="conveyor-ray-disconnect", daemon=False)
    _DISCONNECTING = thread
    thread.start()


def disconnected() -> None:
    """Wait for a disconnect begun in the background."""
    global _DISCONNECTING
    thread, _DISCONNECTING = _DISCONNECTING, None
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def running_here() -> str | None:
    """The address of a Ray instance `ray start` runs on this machine (the file Ray keeps for
    ``ray.init()`` to find it), as Ray wrote it, if something answers there; a stale file (an
    instance gone without `ray stop`) is ignored."""
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


def users_instance() -> bool:
    """A library user's own Ray instance is up in this process (the job runs on it)."""
    ray = sys.modules.get("ray")
    if ray is not None:
        disconnected()  # not the cluster a job before this one is still leaving
    return ray is not None and ray.is_initialized()


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """The process's Python handlers of SIGTERM and SIGINT, as they were before Ray's driver started, put
    back in front of the signals after it (from the main thread). ``ray.init`` in the main thread sets its
    own SIGTERM handler (``sys.exit``: the run ended with exit 2 and no report); in any thread it installs
    absl's failure-signal handler for SIGTERM, which prints a stack, passes the signal on, and arms a
    3-second alarm that aborts the process (SIGABRT, exit 134): a run that took longer to stop died
    without its report."""
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set from C by someone else, and not Python's to give back
                signal.signal(sig, handler)


class RayInstance:
    """The instance of one job: ``config`` is the runtime's (``address``, ``connect_timeout``).

    ``start_early`` starts a private instance in a thread while the driver plans; ``init`` waits for
    it, or starts or joins the instance now; ``done`` leaves or stops it after the tasks; ``release``
    stops what was started and not used, and leaves a cluster that only ``cpus`` joined."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self._reaper: Reaper | None = None
        #: seconds spent starting or joining Ray in this job (reported apart from the transfer)
        self.startup = 0.0
        #: cpus() connected to the cluster: the run keeps using the connection and leaves it after
        self._connected_here = False
        #: the private instance starting in the background while the job plans (start_early)
        self._early: threading.Thread | None = None
        self._early_started = False
        self._early_error: BaseException | None = None
        self._early_seconds = 0.0
        self._early_ready = threading.Event()
        self._early_done = threading.Event()
        self._early_joined = False

    # --- which instance ------------------------------------------------------------------------

    def address(self) -> str:
        """Where to run, as ``ray.init()`` decides: the configured address, else $RAY_ADDRESS, else
        the instance ``ray start`` runs on this machine (joined in well under a second, where starting
        one costs seconds), else ``local`` (a private instance)."""
        return self.given() or running_here() or "local"

    def given(self) -> str:
        """The address the user gave: runtime.address, else $RAY_ADDRESS ("": none, so an instance
        `ray start` runs here is found by Ray's file)."""
        return self.config.address or os.environ.get("RAY_ADDRESS", "").strip()

    def none_to_join(self) -> bool:
        """No instance to join: the job's would be a private one, started for it (none named, none
        running here, none of the library user's in this process)."""
        return not self._connected_here and not users_instance() and self.address() == "local"

    def started_early(self) -> bool:
        """``start_early`` began a private instance for this job."""
        return self._early is not None

    def private(self) -> bool:
        """The instance the tasks ran on was started by this job (not joined)."""
        return self._reaper is not None or self._early_started

    def cpus(self) -> int:
        """The CPUs tasks run on: this machine's for a private instance (started later, by ``init``),
        else the cluster's (connecting now; ``init`` keeps using the connection)."""
        if self.address() == "local":
            return os.cpu_count() or 1
        ray, started = self.init()
        self._connected_here = self._connected_here or started
        return int(ray.cluster_resources().get("CPU", 1))

    def this_machine_alone(self, ray: Any) -> float:
        """The CPUs of the joined cluster when it is this machine alone (one live node, the driver's); 0 when it is
        not (nor for a Ray client, ``ray://``: the driver is elsewhere)."""
        if self.given().startswith("ray://"):
            return 0.0
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            here = ray.get_runtime_context().get_node_id()
        except Exception as exc:  # the tasks then run as usual, on workers
            note(f"ray: could not tell whether the cluster is this machine alone: {type(exc).__name__}: {first_line(exc)}")
            return 0.0
        if len(nodes) != 1 or nodes[0].get("NodeID") != here:
            return 0.0
        return float(nodes[0].get("Resources", {}).get("CPU", 0))

    # --- starting while the job plans ----------------------------------------------------------

    def start_early(self) -> None:
        """Start the private instance in a background thread (seconds of start-up then overlap the
        driver's planning), where the job's instance is one: nothing to join."""
        if self._early is not None or not self.none_to_join():
            return
        self._early_ready, self._early_done, self._early_joined = threading.Event(), threading.Event(), False
        self._early = threading.Thread(target=self._start_in_background, name="conveyor-ray-start", daemon=True)
        self._early.start()

    def _start_in_background(self) -> None:
        began = time.perf_counter()
        try:
            ray = import_ray()
            self._early_started = self._start(ray)[1]
        except BaseException as exc:  # raised where the job waits for the instance
            self._early_error = exc
            return
        finally:
            self._early_seconds = time.perf_counter() - began
            self._early_ready.set()
        # Ray ties the GCS and the raylet to the *thread* that started them (PR_SET_PDEATHSIG fires
        # when that thread ends): this one stays until the job is done with the instance, then stops
        # it (waiting for its processes, while the driver verifies and finalizes)
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
        self.startup += waited
        self._early_joined = True
        if self._early_error is not None:
            err, self._early_error = self._early_error, None
            self._early_done.set()
            raise err
        note(f"ray: private instance started in {self._early_seconds:.1f} s while the job planned; the tasks waited {waited:.1f} s for it")
        return self._early_started

    # --- starting or joining, leaving or stopping ----------------------------------------------

    def init(self) -> tuple[Any, bool]:
        """(ray, whether this job started or joined it now, and so leaves or stops it after the tasks)."""
        ray = import_ray()
        disconnected()
        if self._early is not None and not self._early_joined:
            return ray, self._join_early()
        if ray.is_initialized():
            started, self._connected_here = self._connected_here, False
            return ray, started
        started_at = time.perf_counter()
        try:
            with signals_kept():
                return self._start(ray)
        finally:
            self.startup += time.perf_counter() - started_at

    def done(self, ray: Any, started: bool) -> None:
        """After the tasks: a private instance started early is stopped in the background (``release``
        waits), one started now is stopped now; a joined cluster is left in the background."""
        if self._early is not None:
            self._early_done.set()
        elif started and self._reaper is None:
            disconnect_in_background(ray)
        elif started:
            ray.shutdown()
            self._end_reaper()

    def release(self) -> None:
        """Stop the instance start_early began (if the tasks did not already let it go), and wait
        until it is stopped; leave a cluster that ``cpus()`` joined and no task used (``conveyor plan``,
        a job that failed before its tasks), in the background."""
        if self._connected_here:
            self._connected_here = False
            disconnect_in_background(import_ray())
        if self._early is None:
            return
        self._early_done.set()
        self._early.join()
        self._early = None
        self._early_error, self._early_started = None, False

    def _start(self, ray: Any) -> tuple[Any, bool]:
        address = self.address()
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
            kwargs["address"] = address if self.given() else "auto"
        try:
            with quiet_token_note(kwargs["address"]), quiet_thread_note():
                ray.init(**kwargs)
        except BaseException as exc:
            self._end_reaper(reap=True)
            if not isinstance(exc, Exception):
                raise
            first = first_line(exc)
            what = "could not start a local Ray instance" if address == "local" else f"ray cluster {address}"
            token = ("a cluster with token authentication needs RAY_AUTH_MODE=token and its token here "
                     "(RAY_AUTH_TOKEN or ~/.ray/auth_token); "
                     if address != "local" and self.given() and os.environ.get("RAY_AUTH_MODE") != "token" else "")
            raise ConnectError(f"{what}: {type(exc).__name__}: {first}",
                               hint=f"is the cluster running? (ray status); {token}runtime=local needs no Ray at all") from None
        if address != "local":  # where the job runs is worth a line when it is not this machine's own instance
            say(f"ray: joined the cluster at {address} ({int(ray.cluster_resources().get('CPU', 1))} CPUs)")
        return ray, True

    def _check_reachable(self, address: str) -> None:
        """Fail within ``connect_timeout`` on an address nothing listens on (ray.init waits far longer)."""
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

    def _end_reaper(self, reap: bool = False) -> None:
        if self._reaper is not None:
            self._reaper.stop(reap)
            self._reaper = None
