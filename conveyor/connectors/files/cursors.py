"""Incremental cursors of a file sink, kept beside its files (``<sink.path>/_conveyor_cursors.json``).

A file sink appends one file per partition, named with the load id and renamed into place when
whole, so the folder itself says which partitions of a load are in it. The cursor file holds, per
cursor column, the value the last finished load moved it to, and the window of a load that has
started and not finished (its load id, mode and bounds). A load records its window when it starts;
when its last partition's file is in place, the window's upper end becomes the cursor and the
window is cleared. A run that stops half way leaves its window and some of its files: the next run
is refused (its files would be read again as new rows), and ``resume`` finishes that window. The
file is replaced whole (written under a temporary name, then renamed over the old one).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from conveyor.core import CursorState, CursorWindow, decode_cursor, encode_cursor

STATE = "_conveyor_cursors.json"


def _read(fs: Any, root: str) -> dict[str, Any]:
    path = posixpath.join(root, STATE)
    return json.loads(fs.cat_file(path)) if fs.exists(path) else {}


def _write(fs: Any, root: str, state: dict[str, Any], run_id: str) -> None:
    path = posixpath.join(root, STATE)
    tmp = f"{path}.{run_id}.tmp"
    fs.pipe_file(tmp, json.dumps(state, indent=1, sort_keys=True).encode())
    fs.mv(tmp, path)


def _bound(value: Any) -> list[str] | None:
    return None if value is None else list(encode_cursor(value))


def _value(pair: list[str] | None) -> Any:
    return None if pair is None else decode_cursor(pair[0], pair[1])


def state(fs: Any, root: str, column: str, files_of: Any) -> CursorState:
    """The cursor ``column`` last committed here, and a pending window with how many of its
    partitions' files are in place (``files_of(load_id)``)."""
    entry = _read(fs, root).get(column) or {}
    out = CursorState(value=_value(entry.get("value")))
    pending = entry.get("pending")
    if not pending:
        return out
    return CursorState(value=out.value, pending=CursorWindow(column, _value(pending["low"]), _value(pending["high"])),
                       pending_load=pending["load"], pending_mode=pending["mode"], pending_committed=files_of(pending["load"]))


def record_pending(fs: Any, root: str, window: CursorWindow, load_id: str, mode: str, run_id: str) -> None:
    """The window a load starts on, written before any of its files."""
    current = _read(fs, root)
    entry = current.setdefault(window.column, {"value": None})
    entry["pending"] = {"load": load_id, "mode": mode, "low": _bound(window.low), "high": _bound(window.high)}
    _write(fs, root, current, run_id)


def commit(fs: Any, root: str, window: CursorWindow, load_id: str, run_id: str) -> None:
    """Every file of the load is in place: the window's upper end becomes the cursor (kept where the
    window was empty), and the window is no longer pending."""
    current = _read(fs, root)
    entry = current.setdefault(window.column, {"value": None})
    if (entry.get("pending") or {}).get("load") not in (None, load_id):
        return  # another load's window: not ours to clear
    if not window.empty:
        entry["value"] = _bound(window.high)
    entry["pending"] = None
    _write(fs, root, current, run_id)
