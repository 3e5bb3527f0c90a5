"""The live bar says its rate in rows/s and labels its two times (it showed MB/s only, and two bare times), and says it is
starting until the first rows arrive (it sat at 0% "moving" while Ray's workers started)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from conveyor.runtime.progress import RichProgress


def test_the_bar_shows_rows_per_second_and_labels_its_times() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=220, record=True)
    bar = RichProgress(console, total_rows=1000, partitions=2, total_bytes=100_000)
    with bar:
        bar.started("p0")
        bar._bar.refresh()
        assert "starting" in console.export_text(clear=False)  # before the first rows: not a bar stuck at 0% "moving"
        time.sleep(0.05)
        bar.advanced("p0", 400, 40_000)
        bar._bar.refresh()
        text = console.export_text()
    line = next(line for line in text.splitlines() if "moving" in line)
    assert "400 rows" in line and " rows/s, " in line and "MB/s" in line, line
    assert "elapsed 0:00:00" in line and "left " in line and "0/2 partitions" in line, line
