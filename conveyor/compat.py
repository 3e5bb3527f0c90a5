"""What Conveyor takes from other libraries beyond their public API, in one place.

Each use is a function here, and tests/unit/test_compat.py checks each against the installed
library (the name is there, with the parameters used), so that an upgrade that changes one fails
that test loudly instead of a run failing, or silently doing less, later. The pins in
pyproject.toml (Hydra 1.3, Ray, fsspec) are the versions these were written against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# --- CPython ---------------------------------------------------------------------------------------


def interpreter_exit_steps() -> None:
    """What the interpreter does at exit that a job needs before ``os._exit``: threading's own shutdown
    (its exit callbacks, then every non-daemon thread joined), then the atexit handlers, once."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()  # type: ignore[attr-defined]


# --- Hydra 1.3 -------------------------------------------------------------------------------------


@contextlib.contextmanager
def hydra_mode_unset() -> Iterator[None]:
    """While the block runs, Hydra's lookup of ``hydra.mode`` (a whole composition of the config, done
    before the one that runs the job) answers None at once, as it would where nothing sets it."""
    try:
        from hydra._internal.hydra import Hydra
    except ImportError:  # another Hydra: compose as it does
        yield
        return
    if not hasattr(Hydra, "get_mode"):
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = original  # type: ignore[method-assign]


def config_store_group(store: Any, group: str) -> dict[str, Any] | None:
    """The dict a ConfigStore keeps a group's nodes in (None where the store is not Hydra 1.3's): a node
    put there may be made only when a composition asks for it."""
    repo = getattr(store, "repo", None)
    groups = repo.get(group) if isinstance(repo, dict) else None
    return groups if isinstance(groups, dict) else None


# --- Ray -------------------------------------------------------------------------------------------

#: the loggers of Ray's own notes that Conveyor filters (token authentication on a local instance; no
#: SIGTERM handler from ray.init outside the main thread)
RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_WORKER_LOGGER = "ray._private.worker"


def ray_task_attempt() -> int:
    """Which execution of the current Ray task this is (0: the first; 1: Ray ran it again after its worker
    was lost, ...): Ray's core worker knows it (``get_current_task_attempt_number``), its public runtime
    context does not say. 0 where it cannot tell."""
    try:
        import ray

        worker = ray._private.worker.global_worker
        return int(worker.core_worker.get_current_task_attempt_number())
    except Exception:
        return 0


def ray_job_put(client: Any, name: str, data: bytes) -> Any:
    """PUT ``data`` into the cluster's package store under ``name`` through a JobSubmissionClient: the
    one write the job API offers that stays out of the job's info (``_do_request``). Returns the response."""
    return client._do_request("PUT", f"/api/packages/gcs/{name}", data=data)


def ray_kv_take(key: str) -> bytes | None:
    """Read and delete ``key`` from the connected cluster's internal key-value store (where ``ray_job_put``
    put it)."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    data = _internal_kv_get(key)
    _internal_kv_del(key)
    return data


# --- fsspec ----------------------------------------------------------------------------------------


def fs_path(fs: Any, path: str) -> str:
    """A path as ``fs`` names it internally, without its protocol (``s3://b/k`` -> ``b/k``)."""
    return fs._strip_protocol(path)


__all__ = ["RAY_TOKEN_LOGGER", "RAY_WORKER_LOGGER", "config_store_group", "fs_path", "hydra_mode_unset", "interpreter_exit_steps",
           "ray_job_put", "ray_kv_take", "ray_task_attempt"]
