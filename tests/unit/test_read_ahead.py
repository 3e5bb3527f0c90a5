"""The read-ahead between a task's reader and writer: bounded, errors passed on, source closed early."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor.runtime.task import read_ahead


def test_reads_ahead_at_most_depth_batches() -> None:
    produced: list[int] = []

    def source():
        for i in range(50):
            produced.append(i)
            yield i

    it = read_ahead(source(), 3)
    assert next(it) == 0
    time.sleep(0.3)  # the reader thread fills the queue, then must wait
    assert len(produced) <= 1 + 3 + 1  # consumed + queued + the one waiting to be put
    assert list(it) == list(range(1, 50))


def test_errors_reach_the_consumer() -> None:
    def source():
        yield 1
        raise ValueError("source broke")

    it = read_ahead(source(), 2)
    assert next(it) == 1
    with pytest.raises(ValueError, match="source broke"):
        next(it)


def test_stopping_early_closes_the_source() -> None:
    closed = threading.Event()

    def source():
        try:
            yield from range(1000)
        finally:
            closed.set()

    it = read_ahead(source(), 2)
    assert next(it) == 0
    it.close()
    assert closed.wait(5)


def test_depth_zero_reads_in_line() -> None:
    assert list(read_ahead(iter(range(5)), 0)) == [0, 1, 2, 3, 4]


def test_stopping_early_closes_a_source_that_counts_what_it_sent() -> None:
    """A source's read may return SentBatches (the PostgreSQL source through DuckDB's decoder), not
    a generator: its generator is closed all the same, in the reader thread, when the writer stops."""
    from conveyor.core import SentBatches

    closed = threading.Event()

    def read(sent: SentBatches):
        try:
            yield from range(1000)
            sent.sent = 1000
        finally:
            closed.set()

    reading = SentBatches(read)
    it = read_ahead(reading, 2)
    assert next(it) == 0
    it.close()
    assert closed.wait(5) and reading.sent is None  # stopped before its end: no count


class _Batch:
    """Stands in for a record batch: read_ahead sizes what it holds by ``nbytes``, as pyarrow's batches give it."""

    def __init__(self, i: int, nbytes: int) -> None:
        self.i, self.nbytes = i, nbytes


def _held_ahead(sizes: list[int], depth: int, max_bytes: int) -> list[int]:
    """The bytes produced but not yet consumed, seen after each batch the consumer takes."""
    produced: list[int] = []

    def source():
        for i, n in enumerate(sizes):
            produced.append(n)
            yield _Batch(i, n)

    it = read_ahead(source(), depth, max_bytes)
    seen, ahead = [], []
    for batch in it:
        seen.append(batch.i)
        deadline = time.monotonic() + 2
        while len(produced) < len(sizes) and time.monotonic() < deadline:  # let the reader fill what it may
            before = len(produced)
            time.sleep(0.05)
            if len(produced) == before:
                break
        ahead.append(sum(produced[len(seen):]))
    assert seen == list(range(len(sizes)))  # every batch, once, in order
    return ahead


def test_reads_ahead_at_most_max_bytes_of_batches() -> None:
    """On main the read-ahead was bounded by a count of batches alone: 4 batches of a Parquet file's
    lineitem row groups held 57 MB or 41 MB ahead by how the groups happened to end (14 MB batches
    and a short one per group), so a job's peak memory followed the files' layout (make bench's memory
    group: +18-20% from SF1 to SF3 with tpchgen's larger row groups)."""
    mb = 1024 * 1024
    ahead = _held_ahead([14 * mb, 6 * mb] * 6, depth=4, max_bytes=32 * mb)
    # queued (at most 32 MB) + the one batch the reader holds while it waits for room
    assert max(ahead) <= 32 * mb + 14 * mb, [a / mb for a in ahead]
    assert max(ahead) >= 20 * mb  # it does read ahead


def test_one_batch_larger_than_max_bytes_still_goes_ahead() -> None:
    mb = 1024 * 1024
    assert _held_ahead([100 * mb] * 3, depth=4, max_bytes=32 * mb)[0] > 0  # the next one was read meanwhile


def test_max_bytes_zero_bounds_by_count_alone() -> None:
    mb = 1024 * 1024
    assert max(_held_ahead([14 * mb] * 8, depth=3, max_bytes=0)) >= 3 * 14 * mb
