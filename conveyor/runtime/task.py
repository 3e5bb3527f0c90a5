"""One task: move one partition from the source into the sink, with retries.

Shared by every runtime, so retry and error rules are the same on local threads and on a
Ray cluster. A partition is written in one transaction by the sink, so retrying a failed
attempt cannot duplicate rows.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from conveyor.core import (
    Counting,
    Expected,
    Partition,
    Progress,
    SentBatches,
    SinkPlan,
    SupportsPartitionCounts,
    Task,
    TaskResult,
    WriteStats,
    cancel_requested,
)
from conveyor.errors import Cancelled, ConveyorError, TransferError, first_line, missing_extra
from conveyor.log import note


def _reported(batches: Iterator[Any], key: str, progress: Progress) -> Iterator[Any]:
    for batch in batches:
        if cancel_requested():
            raise Cancelled(f"partition {key}: cancelled")
        progress.advanced(key, batch.num_rows, batch.nbytes)
        yield batch


def _as_conveyor_error(exc: BaseException, key: str) -> ConveyorError:
    if isinstance(exc, ConveyorError):
        return exc
    extra = missing_extra(exc)  # a worker without the extra its connector needs
    if extra is not None:
        return extra
    # An error no connector translated: report it as fatal, with its type, for this partition.
    first = (str(exc).splitlines() or [""])[0]
    return TransferError(f"partition {key}: {type(exc).__name__}: {first}", partition=key, retriable=False)


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


def close_batches(batches: Any) -> None:
    """Close a source's read (a generator, or SentBatches around one): its clean-up runs now, in this
    thread, not whenever it is collected. Closing a read that has ended does nothing."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _held(item: Any) -> int:
    """The bytes a queued item holds: a batch's buffers (the ranges a slice references), else 0."""
    return int(getattr(item, "nbytes", 0) or 0)


def read_ahead(batches: Iterator[Any], depth: int, max_bytes: int = 0) -> Iterator[Any]:
    """Read ahead in a thread, at most ``depth`` batches and (``max_bytes`` > 0) at most
    ``max_bytes`` of them, so reading overlaps writing.

    Memory stays bounded: the queue holds at most ``depth`` batches and, whatever their size,
    ``max_bytes`` of them, or a single batch larger than that. Counted in batches alone, what the
    queue held followed how the source happened to slice its rows (a Parquet file's row groups end
    in a short batch) rather than what the writer needs ahead. When the consumer stops early, the
    reader stops too and the source's generator is closed (its connection with it).
    """
    if depth <= 0:
        yield from batches
        return
    held: collections.deque[tuple[Any, int]] = collections.deque()
    size = 0  # the bytes of the batches in ``held``
    ready = threading.Condition()
    stop = threading.Event()

    def put(item: Any, nbytes: int) -> bool:
        nonlocal size
        with ready:
            # the first batch is always taken: one larger than max_bytes still moves
            while held and (len(held) >= depth or (max_bytes > 0 and size + nbytes > max_bytes)) and not stop.is_set():
                ready.wait(0.1)
            if stop.is_set():
                return False
            held.append((item, nbytes))
            size += nbytes
            ready.notify_all()
        return True

    def produce() -> None:
        try:
            for batch in batches:
                if not put(batch, _held(batch)):
                    break
            else:
                put(_DONE, 0)
        except BaseException as exc:  # handed to the consumer
            put(_Failed(exc), 0)
        finally:
            close_batches(batches)  # the source's own clean-up (its connection) runs now

    reader = threading.Thread(target=produce, name="conveyor-prefetch", daemon=True)
    reader.start()
    try:
        while True:
            with ready:
                while not held:
                    ready.wait()
                item, nbytes = held.popleft()
                size -= nbytes
                ready.notify_all()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        with ready:
            ready.notify_all()
        reader.join(timeout=30)


def run_task(task: Task, progress: Progress, max_retries: int = 0, backoff: float = 0.5, prefetch: int = 0,
             prefetch_bytes: int = 0) -> TaskResult:
    """Run a task, retrying retriable errors up to ``max_retries`` times with backoff.

    ``prefetch`` > 0 reads that many batches ahead of the writer, in a thread, and (``prefetch_bytes``
    > 0) no more than that many bytes of them (:func:`read_ahead`).
    """
    key = task.partition.key
    max_retries = retries_allowed(task.sink, max_retries)
    progress.started(key)
    notes = [f"ran on {_where()}"]
    attempt = 0
    while True:
        attempt += 1
        start = time.perf_counter()
        try:
            if task.plan.native:  # the stream's bytes are reported as they move, its rows once counted
                stats = pass_through(task.source, task.sink, task.plan, task.partition, progress)
                progress.advanced(key, stats.rows, 0)
            else:
                # the read is closed by read_ahead (its reader thread, or its yield from) when the sink stops early
                reading = task.source.read(task.partition)
                expecting = expected_for(task, reading)
                plan = dataclasses.replace(task.plan, expecting=expecting)
                stats = task.sink.write(plan, task.partition, _reported(read_ahead(reading, prefetch, prefetch_bytes), key, progress))
                if stats.source_rows is None and not stats.already_committed:  # what the source said it sent
                    said = expecting.said if expecting is not None else None
                    sent = reading.sent if isinstance(reading, SentBatches) else None
                    stats = dataclasses.replace(stats, source_rows=said if said is not None else sent)
        except Exception as exc:  # every failure becomes a TaskResult
            err = _as_conveyor_error(exc, key)
            retriable = isinstance(err, TransferError) and err.retriable and not cancel_requested()
            if isinstance(exc, Cancelled) or cancel_requested():
                result = TaskResult(key, task.partition.index, seconds=time.perf_counter() - start, attempts=attempt,
                                    error=err, cancelled=True, notes=(*notes, f"attempt {attempt}: cancelled"))
                progress.finished(result)
                return result
            if retriable and attempt <= max_retries:
                wait = min(backoff * 2 ** (attempt - 1), 30.0)
                notes.append(f"attempt {attempt} failed (retriable): {first_line(err)}; retrying in {wait:g} s")
                note(f"partition {key}: {notes[-1]}")
                time.sleep(wait)
                continue
            notes.append(f"attempt {attempt} failed ({'retries used up' if retriable else 'fatal'}): {first_line(err)}")
            result = TaskResult(
                key, task.partition.index, seconds=time.perf_counter() - start, attempts=attempt,
                error=err, traceback=traceback.format_exc(), notes=tuple(notes),
            )
        else:
            result = TaskResult(key, task.partition.index, stats.rows, stats.bytes, stats.seconds, attempt,
                                already_committed=stats.already_committed, source_rows=stats.source_rows, notes=tuple(notes))
        progress.finished(result)
        return result


def _where() -> str:
    """This process, as the driver's log names it: host and pid."""
    import os
    import socket

    return f"{socket.gethostname()} pid {os.getpid()}"


def expected_for(task: Task, reading: Any = None, stream: Any = None) -> Expected | None:
    """What the source says the task's partition holds, as the plan's ``counting`` has it counted, for the
    sink's check before its commit (None: the sink does not check it there)."""
    plan, part = task.plan, task.partition
    if plan.counting == Counting.BEFORE and plan.expected_rows is not None and part.key in plan.expected_rows:
        return Expected.before(plan.expected_rows[part.key])
    if plan.counting == Counting.STREAM and stream is not None:
        return Expected.from_stream(stream)
    if plan.counting == Counting.READ and reading is not None:
        source = task.source

        def recount() -> int | None:
            counted = source.count_rows([part]) if isinstance(source, SupportsPartitionCounts) else None
            return None if counted is None else counted[0]

        return Expected.from_read(reading, recount)
    return None


def pass_through(source: Any, sink: Any, plan: SinkPlan, part: Partition, progress: Progress | None = None) -> WriteStats:
    """The native path both ends agreed on in prepare: the source's stream straight into the sink (its
    bytes reported to ``progress`` as the sink reads them)."""
    with source.export_native(part, plan.source_columns) as stream:
        plan = dataclasses.replace(plan, expecting=expected_for(Task(source, sink, plan, part), stream=stream))
        return sink.write_native(plan, part, stream if progress is None else _Reported(stream, part.key, progress))


class _Reported:
    """A native stream whose reads are reported as bytes moved (its rows are the sink's count, at its end)."""

    def __init__(self, stream: Any, key: str, progress: Progress) -> None:
        self._stream, self._key, self._progress = stream, key, progress

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if data:
            self._progress.advanced(self._key, 0, len(data))
        return data

    def __getattr__(self, name: str) -> Any:  # rows, format, ...: the stream's own
        return getattr(self._stream, name)


def not_run(task: Task, why: str) -> TaskResult:
    """The result of a partition stopped or never started (Ctrl-C, or another partition failed)."""
    key = task.partition.key
    return TaskResult(key, task.partition.index, error=TransferError(f"partition {key}: {why}", partition=key), cancelled=True)


def stopped(result: TaskResult, why: str) -> TaskResult:
    """The account of a task the run stopped while it ran (its worker killed) that still came back.

    Ray kills a worker's child processes (psql among them) before the worker itself, so the task
    can report the failure that killing caused ("psql exited -9") before its process ends. That
    failure is the stop's doing: the partition is cancelled (nothing of it committed), not failed,
    and the run's error stays the partition that stopped it. A committed result stands, and so does one
    that already gives the run's reason; a task that saw the stop itself and then had its children
    killed is given it too.
    """
    if result.ok or (result.cancelled and why in str(result.error)):
        return result
    key, ended = result.partition, _said(result)
    err = TransferError(f"partition {key}: {why} (its worker was killed; the task ended with: {ended})", partition=key)
    return dataclasses.replace(result, error=err, cancelled=True, traceback=None,
                               notes=(*result.notes, f"{why}: its worker was killed"))


def asked(result: TaskResult, why: str) -> TaskResult:
    """The account of a task the run asked to stop (Ray's runtime: :func:`conveyor.runtime.rayworker.watch_for_stop`)
    that stopped: cancelled for the run's reason, what the task said kept. A committed or failed result stands."""
    if result.ok or not result.cancelled or why in str(result.error):
        return result
    key = result.partition
    return dataclasses.replace(result, error=TransferError(f"partition {key}: {why} (asked to stop: {_said(result)})", partition=key))


def _said(result: TaskResult) -> str:
    """The first line of a failed result's error, without its "partition <key>: " prefix."""
    assert result.error is not None  # not ok
    return first_line(result.error).removeprefix(f"partition {result.partition}: ")


def first_failure(results: list[TaskResult]) -> TaskResult | None:
    """The partition that made the run fail: a real failure before one cancelled because of it."""
    failed = [r for r in results if not r.ok]
    real = [r for r in failed if not r.cancelled]
    return (real or failed or [None])[0]


def retries_allowed(sink: Any, max_retries: int) -> int:
    """``max_retries`` where a failed attempt leaves nothing behind, else 0 (a retry could duplicate)."""
    from conveyor.core import sink_capabilities

    return max_retries if sink_capabilities(sink).transactional else 0
