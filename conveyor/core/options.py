"""Job-wide options every plugin may read, and cancellation (Ctrl-C / SIGTERM): every task in
this process stops at its next batch."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pyarrow is imported where batches are made, not at start-up

    pass


LoadMode = Literal["truncate", "append", "create", "replace", "merge"]


MapMethod = Literal["name", "position"]


LOAD_MODES: tuple[str, ...] = ("truncate", "append", "create", "replace", "merge")


MAP_METHODS: tuple[str, ...] = ("name", "position")


#: what a load into an existing target does with source columns the target lacks (``schema_drift``)
SCHEMA_DRIFTS: tuple[str, ...] = ("fail", "evolve", "ignore")


@dataclass(frozen=True)
class JobOptions:
    """The job-wide settings every plugin may read (built from the top level of the config)."""

    load_mode: LoadMode = "append"
    map_method: MapMethod = "name"
    #: source columns an existing target lacks: fail (named, before a row moves), evolve (the sink adds
    #: them as nullable columns first, where it can), ignore (loaded without them, said in the log)
    schema_drift: str = "fail"
    batch_size: int = 65536
    #: as configured: N > 0 tasks at once, N < 0 a fraction of the runtime's CPUs (the job resolves
    #: it once, against the runtime, see :func:`resolve_degree`; plugins get the resolved number)
    degree: int = 1
    run_id: str = "run"
    #: count | checksum | none
    verify: str = "count"
    #: what names this load's commits in the target (commit markers, file names): the run id, or,
    #: when resuming, the load id of the run being resumed, so its committed partitions are known
    load_id: str = ""
    #: incremental.cursor: the column whose last committed value starts the next run's window
    cursor: str | None = None

    @property
    def load(self) -> str:
        return self.load_id or self.run_id

    @staticmethod
    def resolve_degree(degree: int, cpus: int | None = None) -> int:
        """``N > 0`` runs N tasks at once; ``N < 0`` uses CPUs / ``|N|`` (at least one)."""
        if degree > 0:
            return degree
        if degree == 0:
            raise ValueError("degree must not be 0")
        cpus = cpus or os.cpu_count() or 1
        return max(1, cpus // -degree)


_CANCEL = threading.Event()


def request_cancel() -> None:
    """Ask every running task in this process to stop at its next batch (and roll back)."""
    _CANCEL.set()


def cancel_requested() -> bool:
    return _CANCEL.is_set()


def wait_for_cancel(timeout: float) -> bool:
    """Block until a cancel is requested (True) or ``timeout`` seconds pass (False)."""
    return _CANCEL.wait(timeout)


def reset_cancel() -> None:
    _CANCEL.clear()


__all__ = [
    "LoadMode",
    "MapMethod",
    "LOAD_MODES",
    "MAP_METHODS",
    "SCHEMA_DRIFTS",
    "JobOptions",
    "request_cancel",
    "cancel_requested",
    "wait_for_cancel",
    "reset_cancel",
]
