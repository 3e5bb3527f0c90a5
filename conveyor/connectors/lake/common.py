"""What the Iceberg and Delta Lake connectors share: the marker a partition's commit carries, the driver's
beat (which tells ``conveyor clean`` a run is still writing), and how a library's error becomes one line."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from conveyor.errors import ConveyorError, TransferError, first_line
from conveyor.kit import fs as fs_util

#: the commit's properties (an Iceberg snapshot's summary, a Delta commit's metadata) naming its load and partition
LOAD = "conveyor.load-id"
PARTITION = "conveyor.partition"
#: a folder beside the table's data holding one file per running load, rewritten every BEAT seconds
BEATS = "conveyor-runs"
BEAT = 2.0
#: a beat older than this: its run is gone (its driver was killed)
STALE = 15.0


def app_id(load: str, key: str) -> str:
    """A partition's Delta application transaction id (stable across retries and resumes of the load)."""
    return f"conveyor-{load}-{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def scrub(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s and len(s) > 2:
            text = text.replace(s, "***")
    return text


def secret_values(props: dict[str, Any]) -> list[str]:
    """The values of settings that hold a secret (a password, a key, a token; a URI with a password in it)."""
    out = []
    for k, v in props.items():
        low = k.lower()
        if any(w in low for w in ("secret", "password", "token", "credential", "key")) and isinstance(v, str):
            out.append(v)
        if isinstance(v, str) and "://" in v and "@" in v:  # a catalog database URI with user:password@
            cred = v.split("://", 1)[1].split("@", 1)[0]
            out.extend(p for p in cred.split(":")[1:] if p)
    return out


def failed(what: str, exc: BaseException, secrets: Iterable[str] = (), partition: str | None = None, hint: str = "") -> ConveyorError:
    """A library's error as one Conveyor error, with no secret in it."""
    if isinstance(exc, ConveyorError):
        return exc
    return TransferError(f"{what}: {type(exc).__name__}: {scrub(first_line(exc), secrets)}", partition=partition, hint=hint or None)


class Beat:
    """The driver's beat at a table's location while its load runs (a file rewritten every BEAT seconds), so that
    ``conveyor clean --drop`` removes what a run left only once its driver is gone."""

    def __init__(self, location: str, run_id: str, storage: dict[str, Any] | None = None) -> None:
        self.fs, base = fs_util.filesystem(location, storage)
        self.path = f"{base.rstrip('/')}/{BEATS}/{run_id}.json"
        self.stop_event = threading.Event()
        self._write()
        threading.Thread(target=self._run, name="conveyor-lake-beat", daemon=True).start()

    def _write(self) -> None:
        with contextlib.suppress(Exception):
            with self.fs.open(self.path, "w") as f:
                f.write(json.dumps({"at": time.time()}))

    def _run(self) -> None:
        while not self.stop_event.wait(BEAT):
            self._write()

    def close(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(Exception):
            self.fs.rm(self.path)


def live_runs(location: str, storage: dict[str, Any] | None = None) -> list[str]:
    """The runs whose beat at ``location`` is fresh."""
    fs, base = fs_util.filesystem(location, storage)
    out = []
    try:
        paths = fs.ls(f"{base.rstrip('/')}/{BEATS}", detail=False)
    except (FileNotFoundError, OSError):
        return []
    for p in paths:
        with contextlib.suppress(Exception):
            with fs.open(p, "r") as f:
                if time.time() - json.loads(f.read())["at"] < STALE:
                    out.append(p.rsplit("/", 1)[-1].removesuffix(".json"))
    return out


class Counted:
    """The batches, converted, with the rows and bytes that went through counted; ``check_end`` is called with the
    rows once the last batch has been taken (a check there raises before the library commits)."""

    def __init__(self, batches: Iterable[Any], convert: Callable[[Any], Any], check_end: Callable[[int], None] | None) -> None:
        self.rows = self.bytes = 0
        #: what stopped the stream (the source's error, a check's): a library it was handed to may wrap it
        self.error: BaseException | None = None
        self._batches, self._convert, self._check_end = batches, convert, check_end

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._stream()
        except BaseException as exc:
            self.error = exc
            raise

    def _stream(self) -> Iterator[Any]:
        for batch in self._batches:
            if not batch.num_rows:
                continue
            out = self._convert(batch)
            self.rows += out.num_rows
            self.bytes += out.nbytes
            yield out
        if self._check_end is not None:
            self._check_end(self.rows)


__all__ = ["LOAD", "PARTITION", "Beat", "live_runs", "app_id", "failed", "secret_values", "scrub", "Counted"]
