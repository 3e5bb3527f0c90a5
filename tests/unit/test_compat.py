"""conveyor/compat.py: what Conveyor takes from other libraries beyond their public API, each checked
here against the installed library, so that an upgrade that changes it fails this test loudly."""

from __future__ import annotations

import inspect
import os

import pytest


def test_cpythons_exit_steps_are_there() -> None:
    """In a process of its own: once run, this process could register no more exit handlers."""
    import subprocess
    import sys

    code = ("import atexit, threading; atexit.register(print, 'handler ran')\n"
            "threading.Thread(target=lambda: __import__('time').sleep(0.2)).start()\n"
            "from conveyor.compat import interpreter_exit_steps; interpreter_exit_steps(); print('after')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["handler", "ran", "after"], out  # run once, before the exit


def test_hydras_mode_lookup_is_told_it_is_unset() -> None:
    from hydra._internal.hydra import Hydra

    from conveyor.compat import hydra_mode_unset

    assert list(inspect.signature(Hydra.get_mode).parameters) == ["self", "config_name", "overrides"]
    original = Hydra.get_mode
    with hydra_mode_unset():
        assert Hydra.get_mode(None, "config", []) is None
    assert Hydra.get_mode is original


def test_hydras_config_store_keeps_groups_in_a_dict() -> None:
    from hydra.core.config_store import ConfigStore

    from conveyor.compat import config_store_group

    store = ConfigStore.instance()
    store.store(group="conveyor_compat_probe", name="x", node={"a": 1})
    group = config_store_group(store, "conveyor_compat_probe")
    assert isinstance(group, dict) and "x.yaml" in group


def test_rays_private_names_are_there() -> None:
    import importlib

    from ray.experimental import internal_kv
    from ray.job_submission import JobSubmissionClient

    from conveyor.compat import RAY_TOKEN_LOGGER, RAY_WORKER_LOGGER

    for logger in (RAY_TOKEN_LOGGER, RAY_WORKER_LOGGER):
        importlib.import_module(logger)  # the loggers are named after these modules
    params = list(inspect.signature(JobSubmissionClient._do_request).parameters)
    assert params[:3] == ["self", "method", "endpoint"] and "data" in params
    assert callable(internal_kv._internal_kv_get) and callable(internal_kv._internal_kv_del)
    import ray._raylet

    assert hasattr(ray._raylet.CoreWorker, "get_current_task_attempt_number")


def test_fsspec_strips_a_protocol() -> None:
    import fsspec

    from conveyor.compat import fs_path

    assert fs_path(fsspec.filesystem("memory"), "memory://bucket/key.parquet") == "/bucket/key.parquet"
    assert fs_path(fsspec.filesystem("file"), "file:///tmp/x.parquet") == "/tmp/x.parquet"


@pytest.mark.slow
def test_ray_says_which_execution_of_a_task_this_is(tmp_path) -> None:
    """Ray's core worker's attempt number: 0 on a task's first run, 1 when Ray runs it again after its worker died."""
    import ray

    from conveyor.compat import ray_task_attempt

    assert ray_task_attempt() == 0  # not in a task: nothing to tell
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        @ray.remote(max_retries=1)
        def attempt(marker: str) -> int:
            from conveyor.compat import ray_task_attempt as seen

            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # the worker dies: Ray runs the task again
            return seen()

        assert ray.get(attempt.remote(str(tmp_path / "died"))) == 1
        assert ray.get(attempt.remote(str(tmp_path / "died"))) == 0
    finally:
        ray.shutdown()


def test_ray_datas_datasink_and_datasource_are_as_conveyor_ray_data_uses_them() -> None:
    """conveyor.ray_data uses Ray Data's public (developer) API only; what it relies on of it: ``on_write_start`` gets
    the first block's schema (Ray 2.60), a write task's context has its index (the partition key a retry shares),
    ``min_bytes_per_write`` exists (set, the write is an operator of its own, whose first input's schema is the
    Dataset's), a read task takes a schema, and a write's result holds each task's return and Ray's row count."""
    pytest.importorskip("ray.data")
    from ray.data import Datasink, ReadTask
    from ray.data.datasource.datasink import WriteResult

    assert "schema" in inspect.signature(Datasink.on_write_start).parameters
    assert isinstance(inspect.getattr_static(Datasink, "min_bytes_per_write"), property)
    assert {"read_fn", "metadata", "schema", "per_task_row_limit"} <= set(inspect.signature(ReadTask).parameters)
    assert {"num_rows", "write_returns"} <= {f.name for f in __import__("dataclasses").fields(WriteResult)}
    from ray.data._internal.execution.interfaces.task_context import TaskContext

    assert "task_idx" in {f.name for f in __import__("dataclasses").fields(TaskContext)}
