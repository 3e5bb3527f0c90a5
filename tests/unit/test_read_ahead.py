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
