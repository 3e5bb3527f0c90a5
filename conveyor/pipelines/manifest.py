"""The run manifest, and resuming a run from it.

Every CLI run keeps ``manifest.json`` in its run directory: the job's identity (what decides
which rows a partition holds and where they land: source, target, load mode, column mapping), each partition
(its predicate, a serialized copy, rows, status), the snapshot it read and the load id its
commits carry. Finished partitions are appended to ``partitions.jsonl`` as they finish, and
manifest.json is rewritten with the final state when the run ends.

``resume=<run dir>`` re-runs only the partitions that did not finish, and refuses when the
job's identity changed. Which partitions finished is asked of the target where the sink keeps
commit markers (they commit with the rows, so a driver killed between a commit and its manifest
line cannot make a partition load twice); the manifest answers only for sinks that keep none.
Only ``load_mode=append`` commits partitions one by one; a staged load (truncate, create,
replace) is all or nothing, so a failed one leaves nothing to resume.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import decimal
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.core import Progress, ProgressRelay, TaskResult
from conveyor.errors import ConfigError

# The partitions themselves (their predicates) come from the manifest, so the strategy and the
# degree may change on resume; the source, the target and how rows map onto it may not.
IDENTITY_KEYS = ("source", "load_mode", "map_method")
JOURNAL = "partitions.jsonl"
SINK_IDENTITY = ("type", "host", "port", "dbname", "schema", "table", "path", "database", "uri", "location")


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The parts of a config that decide which rows each partition holds, and where they go
    (secrets masked: they never reach the file, and a changed password is the same job)."""
    from conveyor.secrets import mask

    out = {k: config.get(k) for k in IDENTITY_KEYS}
    out.update({k: config[k] for k in ("columns", "rename") if config.get(k)})  # what rows carry, where a job says (older runs did not)
    sink = config.get("sink") or {}
    out["sink"] = {k: sink.get(k) for k in SINK_IDENTITY if k in sink}
    return mask(out)


def _fingerprint(ident: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


class Manifest(ProgressRelay):
    """Records partition outcomes as they finish (wraps the run's progress).

    ``manifest.json`` is written once when the run starts (the job's identity, every partition)
    and once when it ends; in between, each finished partition is one line appended to
    ``partitions.jsonl``, so a run of many partitions costs O(1) per partition, not a rewrite.
    Everything written goes through the report's masking: no resolved secret reaches the file.
    """

    def __init__(self, path: Path, config: dict[str, Any], inner: Progress) -> None:
        super().__init__(inner)
        self.path = path
        self.journal = path.with_name(JOURNAL)
        self._lock = threading.Lock()
        ident = identity(config)
        self.data: dict[str, Any] = {"identity": ident, "fingerprint": _fingerprint(ident), "partitions": {}}

    def start(self, run_id: str, load_id: str, partitions: list[Any], snapshot: str | None, done_before: dict[str, int],
              marks: dict[str, Any] | None = None) -> None:
        """``marks``: what the source saw, per table ("" for a job of one), so that a resume can tell whether
        the partitions this run finishes still hold the same rows (``SupportsChangeCheck``)."""
        self.data.update(run_id=run_id, load_id=load_id, snapshot=snapshot, source_marks=marks or {})
        for p in partitions:
            self.data["partitions"][p.key] = {
                "predicate": p.describe(), "partition": encode_partition(p),
                "status": "done" if p.key in done_before else "pending", "rows": done_before.get(p.key, 0),
                "previous_run": p.key in done_before,
            }
        self.journal.unlink(missing_ok=True)
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def close(self) -> None:
        """The final state in manifest.json (the journal's lines folded in)."""
        with self._lock:
            self._write()

    def finished(self, result: TaskResult) -> None:
        super().finished(result)
        entry = {"partition": result.partition, "status": "done" if result.ok else "failed", "rows": result.rows,
                 "error": str(result.error) if result.error else None}
        with self._lock:
            if result.partition in self.data["partitions"]:
                self.data["partitions"][result.partition].update({k: v for k, v in entry.items() if k != "partition"})
                with self.journal.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(entry, default=str) + "\n")


@dataclass(frozen=True)
class Previous:
    """What a resumed run takes from the run it resumes."""

    partitions: list[Any]
    done: dict[str, int]
    load_id: str
    #: what the source saw in that run, per table ("" for a job of one): Manifest.start's ``marks``
    marks: dict[str, Any] = dataclasses.field(default_factory=dict)


def load_for_resume(run_dir: str, config: dict[str, Any]) -> Previous:
    """The previous run's partitions, those its manifest saw finish, and its load id; refuses a changed job."""
    path = Path(run_dir) / "manifest.json"
    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"resume: no manifest.json in {run_dir}", key="resume",
                          hint="give the run directory of the run to resume (it holds manifest.json and report.json)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"resume: cannot read {path}: {exc}", key="resume") from None
    new_ident = identity(config)
    if old.get("fingerprint") != _fingerprint(new_ident):
        changes = _diff(old.get("identity", {}), new_ident)
        raise ConfigError(f"resume: the job changed since that run: {'; '.join(changes[:5])}", key="resume",
                          hint="which rows a partition holds depends on these; run the job afresh instead")
    if config.get("load_mode") != "append":
        raise ConfigError(f"resume: load_mode={config.get('load_mode')} is all or nothing: a failed run left nothing to resume",
                          key="resume", hint="run it again; only load_mode=append commits partitions one by one")
    entries = old["partitions"]
    journal = path.with_name(JOURNAL)
    if journal.exists():  # a run killed before its final write: the journal has what finished
        for line in journal.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("partition") in entries:
                    entries[entry["partition"]].update(status=entry["status"], rows=entry["rows"])
    parts = [decode_partition(e["partition"]) for e in entries.values()]
    done = {k: e["rows"] for k, e in entries.items() if e["status"] == "done"}
    return Previous(parts, done, old.get("load_id") or old.get("run_id") or "", old.get("source_marks") or {})


# --- partitions as plain JSON (no pickle: a manifest is data, never code) -----------------------


def _enc(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, (list, tuple)):
        return [_enc(v) for v in value]
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, dict):
        (tag, raw), = value.items()
        return {"$datetime": dt.datetime.fromisoformat, "$date": dt.date.fromisoformat, "$decimal": decimal.Decimal,
                "$bytes": base64.b64decode}[tag](raw)
    if isinstance(value, list):
        return tuple(_dec(v) for v in value)
    return value


def _partition_classes() -> dict[str, type]:
    from conveyor import core

    classes = [c for c in vars(core).values() if isinstance(c, type) and issubclass(c, core.Partition) and c is not core.Partition]
    return {c.kind: c for c in classes}


def encode_partition(part: Any) -> dict[str, Any]:
    return {"kind": part.kind, **{name: _enc(value) for name, value in vars(part).items()}}


def decode_partition(data: dict[str, Any]) -> Any:
    cls = _partition_classes().get(data.get("kind", ""))
    if cls is None:
        raise ConfigError(f"resume: the manifest holds an unknown partition kind {data.get('kind')!r}", key="resume")
    return cls(**{f.name: _dec(data[f.name]) for f in dataclasses.fields(cls) if f.name in data})
