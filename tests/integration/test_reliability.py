"""Verification, run reports, cancellation, faults on real servers, odd identifiers, secrets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import pytest

from conveyor.errors import VerificationError
from tests.helpers import BIN, PG_PASSWORD, checksum, job, pg_exec, wait_until


def _pg(server, table: str, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


@pytest.fixture(scope="module")
def big(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS rel_big",
            "CREATE TABLE rel_big AS SELECT g AS id, md5(g::text) AS h, now() AS ts FROM generate_series(1, 600000) g", "ANALYZE rel_big")
    return pg_source


# --- verification -----------------------------------------------------------------------------


def test_count_and_checksum_verification_pass_and_are_reported(big, pg_target, cli, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rel_copy")
    res = cli("--report", str(tmp_path / "r.json"), "run", "pipeline=pg_to_pg", f"source.port={big.port}", "source.table=rel_big",
              f"sink.port={pg_target.port}", "sink.table=rel_copy", "load_mode=create", "runtime=local", "verify=checksum")
    assert res.code == 0, res.err
    assert "verify=checksum: ok, source 600,000 rows, target 600,000 new rows" in res.out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "succeeded" and report["verification"]["ok"] is True
    assert report["verification"]["source_checksum"] == report["verification"]["target_checksum"]
    assert report["totals"]["rows"] == 600000 == sum(p["rows"] for p in report["partitions"])
    assert all(p["attempts"] == 1 and p["seconds"] >= 0 for p in report["partitions"])


def test_checksum_across_engines_compares_a_staged_load_and_refuses_an_append(cli, tmp_path: Path, tpch_orders: Path) -> None:
    """Parquet -> DuckDB has no checksum both compute: a staged load is compared row for row (conveyor verify's
    comparison); an append is refused by name before anything moves (the target's earlier rows are not told apart)."""
    res = cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={tmp_path}/x.duckdb", "verify=checksum", "load_mode=replace")
    assert res.code == 0, res.err
    assert "verify=checksum" in res.out and "ok" in res.out
    res = cli("run", "pipeline=demo", f"source.path={tpch_orders}", f"sink.database={tmp_path}/x.duckdb", "verify=checksum", "load_mode=append")
    assert res.code == 2 and "verify=checksum: this pair computes no checksum alike" in res.err


def test_a_mismatch_fails_the_run_names_partitions_and_keeps_the_old_target(pg_source, pg_target) -> None:
    """A source that is not repeatable (no snapshot, random rows): counts disagree with what was read.
    On the Arrow path: the pass-through's count is the one its COPY reports for the rows it sent (no
    second read of the source, so nothing to disagree with: test_copy_counts.py)."""
    pg_exec(pg_source, "DROP VIEW IF EXISTS flaky_v", "DROP TABLE IF EXISTS flaky_t",
            "CREATE TABLE flaky_t AS SELECT g AS id FROM generate_series(1, 20000) g",
            "CREATE VIEW flaky_v AS SELECT * FROM flaky_t WHERE random() < 0.5")
    pg_exec(pg_target, "DROP TABLE IF EXISTS flaky_dst", "CREATE TABLE flaky_dst (id int)", "INSERT INTO flaky_dst VALUES (-1)")
    with pytest.raises(VerificationError) as info:
        job(_pg(pg_source, "flaky_v", snapshot=False), _pg(pg_target, "flaky_dst", copy_path="arrow"), "ntile", load_mode="replace",
            strategy_params={"distribute_key": "id", "partitions": 2})
    assert "verification failed" in str(info.value) and "range-0000" in str(info.value)
    assert info.value.exit_code == 6
    assert pg_exec(pg_target, "SELECT * FROM flaky_dst") == [(-1,)]
    assert pg_exec(pg_target, "SELECT relname FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage%'") == []


# --- cancellation -----------------------------------------------------------------------------


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "conveyor"), *args, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("mode", ["append", "replace"])
def test_ctrl_c_rolls_back_and_exits_130(big, pg_target, tmp_path: Path, mode: str) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rel_cancel", "CREATE TABLE rel_cancel (id int, h text, ts timestamptz)",
            "INSERT INTO rel_cancel VALUES (-1, 'old', now())")
    proc = _start(["--report", str(tmp_path / "r.json"), "run", "pipeline=pg_to_pg", f"source.port={big.port}", "source.table=rel_big",
                   f"sink.port={pg_target.port}", "sink.table=rel_cancel", f"load_mode={mode}", "runtime=local", "degree=1",
                   "strategy.partitions=60", "sink.copy_path=arrow", "batch_size=2000"], tmp_path)
    wait_until(lambda: pg_exec(pg_target, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                          "AND query ILIKE 'COPY%'")[0][0], "a COPY into the target", 60)
    if mode == "append":  # a fixed sleep raced the first commit on a slow machine: wait for one committed partition
        wait_until(lambda: pg_exec(pg_target, "SELECT count(*) FROM rel_cancel WHERE id > 0")[0][0], "a committed partition", 60)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "error: cancelled:" in err and "Traceback" not in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "cancelled"
    committed = sum(p["rows"] for p in report["partitions"] if p["error"] is None)
    rows = pg_exec(pg_target, "SELECT count(*) FROM rel_cancel WHERE id > 0")[0][0]
    if mode == "append":
        assert 0 < committed < 600000 and rows == committed  # whole partitions only
    else:
        assert rows == 0 and pg_exec(pg_target, "SELECT h FROM rel_cancel") == [("old",)]
    assert pg_exec(pg_target, "SELECT relname FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage%'") == []


# --- faults on real servers ------------------------------------------------------------------


def test_target_server_restarted_mid_run(big, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rel_restart", "CREATE TABLE rel_restart (id int, h text, ts timestamptz)")
    restarted: list[bool] = []

    def restart_when_copying() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                busy = pg_exec(pg_target, "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'COPY%rel_restart%'")[0][0]
            except Exception:
                busy = 0
            if busy:
                pg_target.restart()
                restarted.append(True)
                return
            time.sleep(0.02)

    t = threading.Thread(target=restart_when_copying)
    t.start()
    report = job(_pg(big, "rel_big"), _pg(pg_target, "rel_restart", copy_path="arrow"), "ctid", load_mode="append", degree=2,
                 max_retries=5, batch_size=5000)
    t.join()
    assert restarted
    assert max(r.attempts for r in report.results) >= 2
    assert checksum(pg_target, "rel_restart") == checksum(big, "rel_big")


@pytest.mark.parametrize("copy_path", ["arrow", "passthrough"])
def test_source_connection_killed_mid_partition(big, pg_target, copy_path: str) -> None:
    """The source's backend is killed while it sends a partition: the partition is retried and the target
    is exact, on the Arrow path and on the pass-through (psql's stream cut short: its error is retriable)."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS rel_kill", "CREATE TABLE rel_kill (id int, h text, ts timestamptz)")
    killed: list[int] = []

    def kill_source_once() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            rows = pg_exec(big, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                "AND query ILIKE 'COPY%rel_big%' AND query NOT ILIKE '%count(*)%' AND pid <> pg_backend_pid()")
            killed.extend(1 for r in rows if r[0])
            time.sleep(0.01)

    t = threading.Thread(target=kill_source_once)
    t.start()
    report = job(_pg(big, "rel_big"), _pg(pg_target, "rel_kill", copy_path=copy_path), "ctid", load_mode="append", degree=2,
                 max_retries=3, batch_size=5000)
    t.join()
    assert killed
    assert checksum(pg_target, "rel_kill") == checksum(big, "rel_big")
    assert report.verification is not None and report.verification.ok


# --- identifiers that need quoting -----------------------------------------------------------

ODD_DDL = ('CREATE TABLE "Odd Schema"."Tä ""ble"" select" ("Sp ace" int, "qu""ote" text, "MiXeD" numeric(8,2), '
           '"naïve" text, "select" date)')


@pytest.mark.parametrize("copy_path", ["passthrough", "arrow"])
def test_odd_identifiers_round_trip(pg_source, pg_target, tmp_path: Path, copy_path: str) -> None:
    for server in (pg_source, pg_target):
        pg_exec(server, 'DROP SCHEMA IF EXISTS "Odd Schema" CASCADE', 'CREATE SCHEMA "Odd Schema"', ODD_DDL)
    pg_exec(pg_source, 'INSERT INTO "Odd Schema"."Tä ""ble"" select" SELECT g, \'q\'\'"\' || g, g / 3.0, \'é\', date \'2020-01-01\' + g '
                       "FROM generate_series(1, 3000) g")
    table = 'Tä "ble" select'
    src = {"type": "postgres", "port": pg_source.port, "schema": "Odd Schema", "table": table}
    dst = {"type": "postgres", "port": pg_target.port, "schema": "Odd Schema", "table": table, "copy_path": copy_path}
    job(src, dst, "rangeid", load_mode="truncate", degree=2, strategy_params={"distribute_key": "Sp ace"})
    q = '"Odd Schema"."Tä ""ble"" select"'
    assert checksum(pg_target, q) == checksum(pg_source, q)
    db = tmp_path / "odd.duckdb"
    job(src, {"type": "duckdb", "database": str(db), "schema": "Odd Schema", "table": table}, "ntile", load_mode="create",
        strategy_params={"distribute_key": "qu\"ote", "partitions": 3})
    assert duckdb.connect(str(db)).execute(f'SELECT count(*), count(DISTINCT "qu""ote") FROM {q}').fetchone() == (3000, 3000)
    job({"type": "duckdb", "database": str(db), "schema": "Odd Schema", "table": table}, {**dst, "copy_path": "auto"}, "none",
        load_mode="replace")
    assert checksum(pg_target, q) == checksum(pg_source, q)


# --- secrets never leak -----------------------------------------------------------------------


def test_the_password_appears_in_no_output_report_or_log(pg_source, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS leak_src", "CREATE TABLE leak_src AS SELECT 1 AS a")
    outputs = []
    for extra in (["sink.table=leak_dst", "load_mode=replace"], ["sink.table=leak_dst", "sink.dbname=nosuchdb", "--verbose"],
                  ["sink.table=leak_dst", "source.table=missing", "--verbose"]):
        run_dir = tmp_path / f"run{len(outputs)}"
        proc = subprocess.run([str(BIN / "conveyor"), "run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=leak_src",
                               f"sink.port={pg_target.port}", "runtime=local", f"hydra.run.dir={run_dir}", *extra],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PGPASSWORD": PG_PASSWORD})
        outputs.append(proc.stdout + proc.stderr)
        files = [p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()]
        assert any("report" in str(p) for p in run_dir.rglob("*.json"))
        for text in [outputs[-1], *files]:
            assert PG_PASSWORD not in text
    plan = subprocess.run([str(BIN / "conveyor"), "plan", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=leak_src",
                           f"sink.port={pg_target.port}", "sink.table=leak_dst", "+sink.options={password: " + PG_PASSWORD + "}"],
                          capture_output=True, text=True, timeout=120)
    assert PG_PASSWORD not in plan.stdout + plan.stderr


# --- resume -----------------------------------------------------------------------------------


def test_resume_reruns_only_unfinished_partitions_and_refuses_a_changed_job(big, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rel_resume", "CREATE TABLE rel_resume (id int, h text, ts timestamptz)")
    base = ["run", "pipeline=pg_to_pg", f"source.port={big.port}", "source.table=rel_big", f"sink.port={pg_target.port}",
            "sink.table=rel_resume", "load_mode=append", "runtime=local", "degree=1", "strategy.partitions=30",
            "sink.copy_path=arrow", "batch_size=2000"]
    first = tmp_path / "first"
    proc = subprocess.Popen([str(BIN / "conveyor"), *base, f"hydra.run.dir={first}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and pg_exec(pg_target, "SELECT count(*) FROM rel_resume")[0][0] == 0:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    manifest = json.loads((first / "manifest.json").read_text())
    done = [k for k, e in manifest["partitions"].items() if e["status"] == "done"]
    assert 0 < len(done) < 30 and manifest["snapshot"]
    # a changed source is refused
    res = subprocess.run([str(BIN / "conveyor"), *[a if a != "source.table=rel_big" else "source.table=other" for a in base],
                          f"resume={first}", f"hydra.run.dir={tmp_path}/bad"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "resume: the job changed since that run: source.table: 'rel_big' -> 'other'" in res.stderr
    # the same job resumes: only the rest runs, and the target ends equal to the source
    res = subprocess.run([str(BIN / "conveyor"), *base, f"resume={first}", f"hydra.run.dir={tmp_path}/second"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"resume: {len(done)} of 30 partitions finished" in res.stderr
    second = json.loads((tmp_path / "second" / "report.json").read_text())
    assert len([p for p in second["partitions"] if not p["committed_before"]]) == 30 - len(done)
    assert sorted(p["partition"] for p in second["partitions"] if p["committed_before"]) == sorted(done)
    assert checksum(pg_target, "rel_resume") == checksum(big, "rel_big")


def test_resume_refuses_a_staged_load(pg_source, pg_target, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"fingerprint": "x", "identity": {}, "partitions": {}}))
    from conveyor.errors import ConfigError
    from conveyor.pipelines.manifest import _fingerprint, identity, load_for_resume

    config = {"source": {"type": "postgres"}, "load_mode": "replace", "sink": {"table": "t"}}
    (run / "manifest.json").write_text(json.dumps({"fingerprint": _fingerprint(identity(config)), "identity": identity(config), "partitions": {}}))
    with pytest.raises(ConfigError, match="load_mode=replace is all or nothing"):
        load_for_resume(str(run), config)
