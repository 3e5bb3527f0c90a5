"""What Conveyor takes from other libraries beyond their public API, in one place.

Each use is a function here with a test (tests/unit/test_compat.py) that fails loudly when the
pinned library changes what it relies on, instead of a run that breaks silently.
"""

from __future__ import annotations


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


__all__ = ["ray_task_attempt"]
