"""conveyor/compat.py: what Conveyor takes from other libraries beyond their public API, each checked
here against the installed library, so that an upgrade that changes it fails this test loudly."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_ray_says_which_execution_of_a_task_this_is(tmp_path) -> None:
    """Ray's core worker's attempt number: 0 on a task's first run, 1 when Ray runs it again after its worker died."""
    import os

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
