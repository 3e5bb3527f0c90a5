"""A sink written outside Conveyor joins sync only by implementing the declared contract
(``conveyor.core.changes.ChangeApplier``): ``SnapshotFolder``, a folder of Parquet files that a
third party might write, built here on the public Parquet sink for its loads, with its own apply
(Arrow joins over the target and the stage, the new folder and its position swapped in by one
rename). It passes ``ChangeApplySuite``, and a real sync job from PostgreSQL keeps it equal to its
source, registered as any plugin is (an entry point): no code of Conveyor knows its name."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from conveyor.connectors.files.sinks import ParquetSink
from conveyor.core.changes import Applied, Change, SyncRecord, SyncState
from conveyor.errors import ConveyorError, VerificationError
from conveyor.testing.suites import ChangeApplySuite
from tests.helpers import pg_exec

STATE = "_sync_state.json"


class SnapshotFolder(ParquetSink):
    """A table as a folder of Parquet files; a sync's state beside them in ``_sync_state.json``."""

    stage_load_mode = "replace"

    @property
    def sync_target(self) -> str:
        return self.config.path

    def _states(self, folder: str | None = None) -> dict[str, Any]:
        path = Path(folder or self.config.path) / STATE
        return json.loads(path.read_text()) if path.exists() else {}

    def sync_state(self, slot: str) -> SyncState | None:
        got = self._states().get(slot)
        return SyncState(got["position"], got["signature"], got["source"]) if got else None

    def record_sync(self, record: SyncRecord) -> None:
        states = {**self._states(), record.slot: {"position": record.position, "signature": record.signature, "source": record.source}}
        part = Path(self.config.path) / (STATE + ".part")
        part.write_text(json.dumps(states))
        os.replace(part, Path(self.config.path) / STATE)

    def forget_sync(self, slot: str) -> list[str]:
        states = self._states()
        if slot not in states:
            return []
        del states[slot]
        (Path(self.config.path) / STATE).write_text(json.dumps(states))
        return [f"sync state of {self.config.path} ({slot})"]

    def sync_stage(self, slot: str) -> str:
        stage = f"{self.config.path}.stage-{slot}"
        shutil.rmtree(stage, ignore_errors=True)
        return stage

    def stage_sink(self, stage: str, options: Any) -> Any:
        import dataclasses

        return type(self)(dataclasses.replace(self.config, path=stage), options)

    def drop_stage(self, stage: str) -> None:
        shutil.rmtree(stage, ignore_errors=True)

    def apply_changes(self, changes: Sequence[Change]) -> list[Applied]:
        import fcntl

        out = []
        for c in changes:
            # one apply of a folder at a time (a file lock beside it): the state is read again under it
            with open(f"{c.sink.config.path}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                out.append(c.sink._apply_one(c))
        return out

    def _apply_one(self, change: Change) -> Applied:
        assert change.record is not None
        held = self.sync_state(change.record.slot)
        if change.expect is not None and (held is None or held.position != change.expect):
            raise ConveyorError(f"sync of {self.config.path}: another run of this job applied changes meanwhile")
        if change.stage is None:
            self.record_sync(change.record)
            return Applied(0, 0, 0)
        keys = list(change.keys)
        target = ds.dataset(self.config.path, format="parquet").to_table()
        staged = ds.dataset(change.stage, format="parquet").to_table()
        present = staged.filter(ds.field("_conveyor_present")).drop_columns(["_conveyor_present"])
        kept = target if change.full else target.join(staged.select(keys), keys, join_type="left anti")
        out = pa.concat_tables([kept, present.select(target.schema.names).cast(target.schema)])
        # read back what is about to become the table: each present key once, no gone key
        if out.num_rows != kept.num_rows + present.num_rows or out.group_by(keys).aggregate([]).num_rows != out.num_rows:
            raise VerificationError(f"verification failed for {self.config.path}: a key twice after the apply")
        fresh = f"{self.config.path}.new-{uuid.uuid4().hex[:8]}"
        os.makedirs(fresh)
        ds.write_dataset(out, fresh, format="parquet", basename_template="part-{i}.parquet")
        states = {**self._states(), change.record.slot: {"position": change.record.position, "signature": change.record.signature,
                                                         "source": change.record.source}}
        Path(fresh, STATE).write_text(json.dumps(states))
        old = f"{self.config.path}.old-{uuid.uuid4().hex[:8]}"
        os.rename(self.config.path, old)  # the rows and their position move in together
        os.rename(fresh, self.config.path)
        shutil.rmtree(old)
        gone = staged.filter(~ds.field("_conveyor_present")).select(keys)
        deleted = target.num_rows if change.full else target.join(gone, keys, join_type="left semi").num_rows
        return Applied(keys=staged.num_rows, written=present.num_rows, deleted=deleted)


@pytest.fixture(autouse=True)
def _registered(monkeypatch) -> None:
    from importlib.metadata import EntryPoint

    from conveyor import registry

    real = registry._entries
    entry = EntryPoint("snapshotfolder", f"{__name__}:SnapshotFolder", registry.GROUPS["sink"])
    monkeypatch.setattr(registry, "_entries", lambda kind: {**real(kind), **({"snapshotfolder": [entry]} if kind == "sink" else {})})


class TestSnapshotFolderChangeApply(ChangeApplySuite):
    sink = "snapshotfolder"

    def sink_config(self, target: str) -> dict[str, Any]:
        return {"path": str(self.tmp / "targets" / target)}

    def read_target(self, target: str) -> pa.Table | None:
        path = self.tmp / "targets" / target
        return ds.dataset(str(path), format="parquet").to_table().select(["id", "name", "x"]) if path.exists() else None


def test_a_sync_from_postgres_into_the_third_party_sink_is_exact(pg_source, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from conveyor.pipelines.run import RunPlace, run

    pg_exec(pg_source, "DROP TABLE IF EXISTS tp_sync", "CREATE TABLE tp_sync (id int8 PRIMARY KEY, name text, x float8)",
            "INSERT INTO tp_sync SELECT g, 'n' || g, g / 2.0 FROM generate_series(1, 3000) g")
    target = tmp_path / "tp"
    cfg = {"source": {"type": "postgres", "port": pg_source.port, "table": "tp_sync"}, "sink": {"type": "snapshotfolder", "path": str(target)},
           "strategy": {"type": "ctid"}, "runtime": {"type": "local"}, "degree": 2, "load_mode": "replace",
           "incremental": {"method": "replication", "slot": "conveyor_third_party"}}

    def same() -> None:
        got = ds.dataset(str(target), format="parquet").to_table().sort_by("id")
        want = pg_exec(pg_source, "SELECT id, name, x FROM tp_sync ORDER BY id")
        assert list(zip(*(got.column(c).to_pylist() for c in ("id", "name", "x")))) == [tuple(r) for r in want]

    try:
        run(OmegaConf.create(cfg), RunPlace(run_dir=tmp_path / "first"))
        same()
        pg_exec(pg_source, "UPDATE tp_sync SET name = 'u' WHERE id % 7 = 0", "DELETE FROM tp_sync WHERE id % 11 = 0",
                "UPDATE tp_sync SET id = 100000 WHERE id = 1", "INSERT INTO tp_sync SELECT g, 'new', 0 FROM generate_series(5000, 5100) g")
        report = run(OmegaConf.create(cfg), RunPlace(run_dir=tmp_path / "second"))
        assert report.sync.runs[0].changes > 0 and report.rows == report.sync.runs[0].keys  # one report type: the staged rows
        same()
    finally:
        pg_exec(pg_source, "SELECT pg_drop_replication_slot('conveyor_third_party') FROM pg_replication_slots "
                           "WHERE slot_name = 'conveyor_third_party'", "DROP PUBLICATION IF EXISTS conveyor_third_party")
