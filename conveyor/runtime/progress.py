"""Live progress on a terminal; nothing (the summary suffices) when output is not a terminal."""

from __future__ import annotations

import threading
from typing import Any

from conveyor.runtime.task import TaskResult


class RichProgress:
    """An overall bar (rows, MB, rows/s) and the count of partitions done."""

    def __init__(self, console: Any, total_rows: int | None, partitions: int) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

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
            TextColumn("{task.fields[parts]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("moving", total=total_rows, mb=0.0, parts=f"0/{partitions} partitions")

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def started(self, key: str) -> None:
        pass

    def advanced(self, key: str, rows: int, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            self._bar.update(self._task, advance=rows, mb=self._bytes / 1e6)

    def finished(self, result: TaskResult) -> None:
        with self._lock:
            self._done += 1
            self._bar.update(self._task, parts=f"{self._done}/{self._partitions} partitions")
