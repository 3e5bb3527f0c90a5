"""The driver's steps over a job's tables, several at once (conveyor/pipelines/threads.py): results in the
tables' order, the first failure raised only once the steps running have ended, nothing begun after it."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor.pipelines import threads


def test_results_keep_the_order_and_steps_overlap() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def step(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02 * (5 - i % 5))  # later items end first
        with lock:
            running[0] -= 1
        return i * 10

    done: list[int] = []
    assert threads.each(list(range(10)), step, 4, done=done) == [i * 10 for i in range(10)]
    assert sorted(done) == list(range(10))
    assert most[0] == 4  # four at once, never more


def test_the_first_failure_waits_for_the_running_steps_and_skips_the_rest() -> None:
    begun: list[int] = []
    ended: list[int] = []
    lock = threading.Lock()

    def step(i: int) -> None:
        with lock:
            begun.append(i)
        if i == 0:
            raise RuntimeError("table 0 failed")
        time.sleep(0.2)
        with lock:
            ended.append(i)

    done: list[int] = []
    with pytest.raises(RuntimeError, match="table 0 failed"):
        threads.each(list(range(50)), step, 2, done=done)
    # every step begun beside the failure ended before each() raised (item 1, and item 2 where the failed step's
    # thread took it before the rest were cancelled); the others never began
    assert 1 in ended and sorted(ended) == sorted(done) == sorted(i for i in begun if i)
    assert len(begun) <= 3


def test_one_at_a_time_runs_in_order_in_this_thread() -> None:
    seen: list[str] = []
    assert threads.each(["a", "b"], lambda x: seen.append(threading.current_thread().name) or x, 1) == ["a", "b"]
    assert seen == [threading.current_thread().name] * 2


@pytest.mark.parametrize(("degree", "tables", "expected"), [(1, 1, 1), (1, 200, 2), (2, 200, 2), (6, 200, 6), (64, 200, 8), (4, 3, 3)])
def test_how_many_tables_at_once(degree: int, tables: int, expected: int) -> None:
    assert threads.workers(degree, tables) == expected
