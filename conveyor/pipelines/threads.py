"""A job's driver steps over many tables, several at once: each table's plan, prepare, verification and
finalize is a few statements on a server (round trips, not the driver's CPU), so a job over 200 tables
overlaps them in threads instead of paying each table's latency one after another."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: at most this many of a job's tables in the driver's steps at once
MOST = 8


def workers(degree: int, tables: int) -> int:
    """How many tables' steps at once: as many as the job runs tasks (at least 2, at most :data:`MOST`);
    one for a job of one table."""
    return min(max(degree, 2), MOST, tables) if tables > 1 else 1


def each(items: Sequence[T], step: Callable[[T], R], at_once: int, done: list[T] | None = None) -> list[R]:
    """``step`` of every item, ``at_once`` at a time (in threads; one: in order, in this thread); their
    results in the items' order. The first failure is raised once every step begun has ended (none is left
    running behind the caller's clean-up); the items not begun then are not begun. ``done``: each item
    whose step ended well is added to it, as it ends."""
    if at_once <= 1 or len(items) <= 1:
        out = []
        for item in items:
            out.append(step(item))
            if done is not None:
                done.append(item)
        return out

    def one(item: T) -> R:
        result = step(item)
        if done is not None:
            done.append(item)  # list.append holds the GIL: safe from several threads
        return result

    with ThreadPoolExecutor(max_workers=min(at_once, len(items)), thread_name_prefix="conveyor-table") as pool:
        futures = [pool.submit(one, item) for item in items]
        try:
            for future in as_completed(futures):
                future.result()  # the first failure, as soon as it happens
        except BaseException:
            for future in futures:
                future.cancel()
            raise  # leaving the pool waits for the steps already running
        return [future.result() for future in futures]
