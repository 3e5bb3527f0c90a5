"""Live progress on a terminal; nothing (the summary suffices) when output is not a terminal."""

from __future__ import annotations

import threading
from typing import Any

from conveyor.core import TaskResult


class RichProgress:
    """An overall bar (rows, MB, rows/s) and the count of partitions done."""

    def __init__(self, console: Any, total_rows: int | None, partitions: int) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._lock = threading.Lock()
        self._bytes = 0
        self._done = 0
        self._partitions = partitions
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,.0f} rows"),
            TextColumn("{task.fields[mb]:,.1f} MB"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[parts]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._running: set[str] = set()
        self._start = None
        self._task = self._bar.add_task("moving", total=total_rows, mb=0.0, rate="", parts=self._parts_text())

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def _parts_text(self) -> str:
        running = f", running {', '.join(sorted(self._running)[:4])}" if self._running else ""
        return f"{self._done}/{self._partitions} partitions{running}"

    def started(self, key: str) -> None:
        import time

        with self._lock:
            self._start = self._start or time.monotonic()
            self._running.add(key)
            self._bar.update(self._task, parts=self._parts_text())

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        import time

        with self._lock:
            self._bytes += nbytes
            elapsed = time.monotonic() - (self._start or time.monotonic())
            rate = f"{self._bytes / 1e6 / elapsed:,.1f} MB/s" if elapsed > 0 else ""
            self._bar.update(self._task, advance=rows, mb=self._bytes / 1e6, rate=rate)

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._done += 1
            self._running.discard(result.partition)
            self._bar.update(self._task, parts=self._parts_text())


class LogProgress:
    """Off a terminal (CI, logs): a progress line on stderr every ``interval`` seconds."""

    def __init__(self, total_rows: int | None, partitions: int, interval: float = 10.0, out: Any = None) -> None:
        import sys
        import time

        self._clock = time.monotonic
        self._out = out or sys.stderr
        #: its first line comes after ``interval`` seconds: running partitions' rows are not shown before
        self.live_rows_after = interval
        self._lock = threading.Lock()
        self._total, self._partitions, self._interval = total_rows, partitions, interval
        self._rows = self._bytes = self._done = 0
        self._start = self._last = self._clock()

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def started(self, key: str) -> None:
        pass

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        with self._lock:
            self._rows += rows
            self._bytes += nbytes
            now = self._clock()
            if now - self._last >= self._interval:
                self._last = now
                pct = f" ({100 * self._rows / self._total:.0f}%)" if self._total else ""
                rate = self._bytes / 1e6 / max(now - self._start, 1e-9)
                print(f"progress: {self._rows:,} rows{pct}, {self._bytes / 1e6:,.1f} MB, {rate:,.1f} MB/s, "
                      f"{self._done}/{self._partitions} partitions done", file=self._out, flush=True)

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._done += 1
