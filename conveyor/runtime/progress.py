"""Live progress: a bar on a terminal, a line every ``interval`` seconds off one (CI, logs).

Both count what the tasks report: rows and bytes as Arrow batches move, and on the pass-through
(PostgreSQL's COPY stream relayed untouched) bytes as the stream moves and its rows once its COPY
has counted them. Until then a streaming partition's rows are estimated from its bytes (the rows per
byte of the partitions that finished, else of the plan's estimate), so the total, the percentage and
the ETA move with the stream instead of jumping at each partition's end.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from conveyor.core import TaskResult
from conveyor.log import event, json_lines


class _Tally:
    """Rows, bytes and partitions so far; rows of partitions still streaming without a count, estimated."""

    def __init__(self, total_rows: int | None, total_bytes: int | None, partitions: int) -> None:
        self.total, self.partitions = total_rows, partitions
        self.rows = self.bytes = self.done = 0
        self.running: set[str] = set()
        #: bytes of partitions whose rows are not counted yet (a pass-through before its COPY's count)
        self.uncounted: dict[str, int] = {}
        self.counted_rows = self.counted_bytes = 0  # of finished streaming partitions: their rows per byte
        self.estimate = (total_rows / total_bytes) if total_rows and total_bytes else 0.0
        self.start: float | None = None

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        self.start = self.start or time.monotonic()
        self.rows += rows
        self.bytes += nbytes
        if rows == 0 and nbytes:
            self.uncounted[key] = self.uncounted.get(key, 0) + nbytes
        elif rows and key in self.uncounted:  # its count arrived: the estimate stands down
            self.counted_rows += rows
            self.counted_bytes += self.uncounted.pop(key)

    def finished(self, key: str) -> None:
        self.done += 1
        self.running.discard(key)
        self.uncounted.pop(key, None)

    @property
    def shown_rows(self) -> float:
        """Rows counted, and those of the bytes still uncounted at the rows per byte seen so far."""
        per_byte = self.counted_rows / self.counted_bytes if self.counted_bytes else self.estimate
        return self.rows + per_byte * sum(self.uncounted.values())

    def rate(self) -> str:
        """Rows/s and MB/s since the first partition started."""
        elapsed = time.monotonic() - (self.start or time.monotonic())
        return f"{self.shown_rows / elapsed:,.0f} rows/s, {self.bytes / 1e6 / elapsed:,.1f} MB/s" if elapsed > 0 else ""


class RichProgress:
    """An overall bar (rows, MB, rows/s and MB/s, the time elapsed and the time left) and the partitions done and running."""

    #: it shows running partitions' rows at once
    live_rows_after = 0.0

    def __init__(self, console: Any, total_rows: int | None, partitions: int, total_bytes: int | None = None) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._lock = threading.Lock()
        self._tally = _Tally(total_rows, total_bytes, partitions)
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,.0f} rows"),
            TextColumn("{task.fields[mb]:,.1f} MB"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[parts]}"),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        # "starting" until the first rows or bytes arrive (Ray's workers take seconds to start: the bar is not stuck)
        self._task = self._bar.add_task("starting", total=total_rows, mb=0.0, rate="", parts=self._parts_text())

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def _parts_text(self) -> str:
        t = self._tally
        running = f", running {', '.join(sorted(t.running)[:4])}" if t.running else ""
        return f"{t.done}/{t.partitions} partitions{running}"

    def _show(self) -> None:
        t = self._tally
        self._bar.update(self._task, completed=t.shown_rows, mb=t.bytes / 1e6, rate=t.rate(), parts=self._parts_text(),
                         description="moving" if t.rows or t.bytes or t.done else "starting")

    def started(self, key: str) -> None:
        with self._lock:
            self._tally.start = self._tally.start or time.monotonic()
            self._tally.running.add(key)
            self._show()

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        with self._lock:
            self._tally.advanced(key, rows, nbytes)
            self._show()

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._tally.finished(result.partition)
            self._show()


class LogProgress:
    """Off a terminal (CI, logs): a progress line on stderr every ``interval`` seconds while the run moves
    rows, whether or not a task reported anything since (a pass-through partition reports bytes as its
    stream moves, and rows only at its end)."""

    def __init__(self, total_rows: int | None, partitions: int, interval: float = 10.0, out: Any = None,
                 total_bytes: int | None = None) -> None:
        import sys

        self._out = out or sys.stderr
        #: its first line comes after ``interval`` seconds: running partitions' rows are not shown before
        self.live_rows_after = interval
        self._lock = threading.Lock()
        self._tally = _Tally(total_rows, total_bytes, partitions)
        self._interval = interval
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> LogProgress:
        self._ticker = threading.Thread(target=self._tick, name="conveyor-progress-log", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            self.line()

    def line(self) -> None:
        """One progress line (every ``interval`` seconds from the ticker, once the first task has started)."""
        with self._lock:
            t = self._tally
            if t.start is None:
                return
            rows = t.shown_rows
            pct = f" ({100 * rows / t.total:.0f}%)" if t.total else ""
            about = "about " if t.uncounted else ""
            text = f"progress: {about}{rows:,.0f} rows{pct}, {t.bytes / 1e6:,.1f} MB, {t.rate()}, {t.done}/{t.partitions} partitions done"
            if json_lines() and self._out is sys.stderr:
                event("progress", text, rows=int(rows), rows_total=t.total, bytes=t.bytes, partitions_done=t.done, partitions=t.partitions,
                      rows_counted=not t.uncounted)
            else:
                print(text, file=self._out, flush=True)

    def started(self, key: str) -> None:
        with self._lock:
            self._tally.start = self._tally.start or time.monotonic()
            self._tally.running.add(key)

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        with self._lock:
            self._tally.advanced(key, rows, nbytes)

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._tally.finished(result.partition)
