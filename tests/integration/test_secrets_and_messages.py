"""Secrets in no file a run writes, masks that do not garble messages, and errors that say what
is wrong (issue: every value exact or refused by name, secrets in no file). Each failed on the
main this work started from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conveyor.connectors.postgres.common import PgConnConfig
from conveyor.errors import ConfigError, scrub_value
from tests.helpers import BIN, PG_PASSWORD, pg_exec


def test_a_resolved_env_secret_reaches_no_file_of_the_run(pg_source, pg_target, tmp_path: Path) -> None:
    """The password given as ${oc.env:...} in sink.options: resolved for the connection, and in
    none of report.json, manifest.json, partitions.jsonl, Hydra's .hydra/ files or its log."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS sec_src", "CREATE TABLE sec_src AS SELECT g AS a FROM generate_series(1, 100) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS sec_dst", "CREATE TABLE sec_dst (a int)")
    run_dir = tmp_path / "run"
    env = {**os.environ, "MY_SECRET_PW": PG_PASSWORD}
    proc = subprocess.run([str(BIN / "conveyor"), "run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=sec_src",
                           f"sink.port={pg_target.port}", "sink.table=sec_dst", "load_mode=append", "runtime=local",
                           "+sink.options={password: '${oc.env:MY_SECRET_PW}'}",
                           "+source.options={password: '${oc.env:MY_SECRET_PW}'}", f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"report.json", "manifest.json", "partitions.jsonl", "config.yaml"} <= names
    for path in files:
        assert PG_PASSWORD not in path.read_text(errors="replace"), path
    assert PG_PASSWORD not in proc.stdout + proc.stderr


def test_masking_a_short_password_keeps_words_whole() -> None:
    text = 'relation "exists" does not exist; syntax error; postgresql://u:x@h/db?password=x'
    assert scrub_value(text, "x") == 'relation "exists" does not exist; syntax error; postgresql://u:***@h/db?password=***'


def test_an_unset_password_env_is_an_error_naming_it(monkeypatch) -> None:
    monkeypatch.delenv("MY_UNSET_PW_VAR", raising=False)
    conf = PgConnConfig(password_env="MY_UNSET_PW_VAR")
    try:
        conf.password()
    except ConfigError as exc:
        assert "MY_UNSET_PW_VAR is not set" in exc.message and exc.key == "password_env"
    else:
        raise AssertionError("an unset password_env was taken as no password")


def test_an_unset_password_env_fails_the_run_in_one_line(pg_source, cli) -> None:
    res = cli("run", "pipeline=pg_to_pg", f"source.port={pg_source.port}", "source.table=sec_src", "sink.table=x",
              "source.password_env=MY_UNSET_PW_VAR", "runtime=local")
    assert res.code == 2, res.err
    assert res.error_lines == ["error: password_env: the environment variable MY_UNSET_PW_VAR is not set"]
    assert "Traceback" not in res.err


def test_two_runs_started_together_get_their_own_run_directories(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": list(range(10))}), tmp_path / "a.parquet")
    args = [str(BIN / "conveyor"), "run", "source=parquet", f"source.path={tmp_path}/a.parquet", "sink=parquet", "runtime=local",
            "strategy=none", "load_mode=append"]
    procs = [subprocess.Popen([*args, f"sink.path={tmp_path}/out{i}"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    reports = list((tmp_path / "outputs").rglob("report.json"))
    assert len(reports) == 2 and reports[0].parent != reports[1].parent


def test_hydra_composition_errors_are_one_line_and_a_hint(cli) -> None:
    res = cli("run", "source=nope")
    assert res.code == 2
    assert res.error_lines == ["error: In 'config': Could not find 'source/nope'"]
    assert "hint: Available options in 'source': adbc, clickhouse, csv, delta, duckdb, flight, iceberg, mysql, parquet, postgres" in res.err
    assert len(res.err.strip().splitlines()) == 2
    res = cli("run", "source.query=SELECT (1)")
    assert res.code == 2 and res.error_lines == ["error: Error parsing override 'source.query=SELECT (1)'"]
    assert "hint: overrides are key=value; quote a value" in res.err
    res = cli("run", "source.pathh=1")
    assert res.code == 2 and res.error_lines == ["error: Could not override 'source.pathh'."]
    assert "check the key's spelling" in res.err


def test_replace_of_a_table_with_a_63_byte_name_keeps_its_primary_key(pg_source, pg_target) -> None:
    from tests.helpers import job

    name = "t" * 63
    pg_exec(pg_source, "DROP TABLE IF EXISTS long_src", "CREATE TABLE long_src AS SELECT g AS id FROM generate_series(1, 10) g")
    pg_exec(pg_target, f'DROP TABLE IF EXISTS "{name}"', f'CREATE TABLE "{name}" (id int PRIMARY KEY)', f'INSERT INTO "{name}" VALUES (-1)')
    job({"type": "postgres", "port": pg_source.port, "table": "long_src"}, {"type": "postgres", "port": pg_target.port, "table": name},
        load_mode="replace")
    assert pg_exec(pg_target, f'SELECT count(*), min(id) FROM "{name}"') == [(10, 1)]
    indexes = pg_exec(pg_target, f"SELECT indexname FROM pg_indexes WHERE tablename = '{name}'")
    assert indexes == [("t" * 58 + "_pkey",)]


def test_switching_a_group_inside_a_pipeline_works(pg_source, pg_target, tpch_orders, cli, tmp_path: Path) -> None:
    """pipeline=pg_to_pg strategy=none and pipeline=demo sink=parquet failed on 'unknown key'
    (keys the pipeline set for the plugin it chose); a key no plugin of the group has still fails."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS sw_src", "CREATE TABLE sw_src AS SELECT g AS id FROM generate_series(1, 100) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS sw_dst", "CREATE TABLE sw_dst (id int)")
    res = cli("run", "pipeline=pg_to_pg", "strategy=none", f"source.port={pg_source.port}", "source.table=sw_src",
              f"sink.port={pg_target.port}", "sink.table=sw_dst", "runtime=local")
    assert res.code == 0, res.err
    assert "unknown key" not in res.err and "warning" not in res.err  # the pipeline's distribute_key was null
    assert pg_exec(pg_target, "SELECT count(*) FROM sw_dst")[0][0] == 100
    out = tmp_path / "demo-parquet"
    res = cli("run", "pipeline=demo", "sink=parquet", f"source.path={tpch_orders}", f"sink.path={out}")
    assert res.code == 0, res.err
    assert "warning: sink.database is not a setting of sink=parquet: ignored" in res.err
    assert len(list(out.glob("*.parquet"))) == 4
    res = cli("run", "pipeline=demo", "sink=parquet", f"source.path={tpch_orders}", f"sink.path={out}", "+sink.databse=x")
    assert res.code == 2 and "sink.databse: unknown key" in res.err


def test_plan_takes_hydra_flags_before_the_overrides(tpch_orders, cli, tmp_path: Path) -> None:
    """`conveyor plan --config-dir DIR overrides...` failed with 'unrecognized arguments'."""
    (tmp_path / "mine" / "pipeline").mkdir(parents=True)
    (tmp_path / "mine" / "pipeline" / "mine.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - override /sink: parquet\n  - override /runtime: local\nsource:\n  path: {tpch_orders}\n"
        f"sink:\n  path: {tmp_path / 'out'}\n")
    for args in (["--config-dir", str(tmp_path / "mine"), "pipeline=mine"], ["pipeline=mine", "--config-dir", str(tmp_path / "mine")]):
        res = cli("plan", *args)
        assert res.code == 0, res.err
        assert "files-00003" in res.out


@pytest.mark.parametrize("writer", ["pgpq", "adbc"])
def test_write_errors_name_the_target_and_the_column(pg_source, pg_target, writer: str) -> None:
    """A NOT NULL violation in a staged load named '_conveyor_stage_...' (main); a numeric
    overflow named no column. Both name what the user knows; the target keeps its rows."""
    from conveyor.errors import TransferError
    from tests.helpers import job

    pg_exec(pg_source, "DROP TABLE IF EXISTS wm_src", "CREATE TABLE wm_src AS SELECT g AS id, "
            "CASE WHEN g = 5 THEN NULL ELSE 'x' END AS s, (g * 100.5)::numeric(12,2) AS n FROM generate_series(1, 10) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS wm_nn, wm_small", "CREATE TABLE wm_nn (id int, s text NOT NULL, n numeric(12,2))",
            "INSERT INTO wm_nn VALUES (1, 'keep', 1)", "CREATE TABLE wm_small (id int, s text, n numeric(12,2) CHECK (n < 500))")
    src = {"type": "postgres", "port": pg_source.port, "table": "wm_src"}
    dst = {"type": "postgres", "port": pg_target.port, "copy_path": "arrow", "writer": writer}
    with pytest.raises(TransferError) as err:
        job(src, {**dst, "table": "wm_nn", "truncate_method": "staged"}, load_mode="truncate")
    assert 'null value in column "s" of relation "wm_nn" (staged)' in err.value.message
    assert "_conveyor_stage" not in err.value.message
    assert pg_exec(pg_target, "SELECT count(*) FROM wm_nn")[0][0] == 1
    with pytest.raises(TransferError) as err:  # one partition, truncated in place: the target itself is named
        job(src, {**dst, "table": "wm_nn"}, load_mode="truncate")
    assert 'null value in column "s" of relation "wm_nn" violates not-null constraint' in err.value.message
    assert pg_exec(pg_target, "SELECT count(*) FROM wm_nn")[0][0] == 1
    if writer == "pgpq":  # the encoder's COPY: PostgreSQL's context names the column
        pg_exec(pg_target, "DROP TABLE wm_small", "CREATE TABLE wm_small (id int, s text, n numeric(5,2))")
        with pytest.raises(TransferError, match=r"numeric field overflow \(column n, line \d+ of the partition's COPY\)"):
            job({"type": "postgres", "port": pg_source.port, "query": "SELECT id, s, n::numeric(12,2) AS n FROM wm_src WHERE s IS NOT NULL"},
                {**dst, "table": "wm_small"}, load_mode="append")


def test_a_missing_password_says_which_host_and_process_looked_for_it(pg_source, cli) -> None:
    """The process that connects may not be the user's shell (a Ray worker, a submitted job's
    driver): the hint names the host and process that found $PGPASSWORD unset, not "check the
    password in $PGPASSWORD" (on main it said so while the user's own shell had it set)."""
    import socket

    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    res = subprocess.run([str(BIN / "conveyor"), "plan", "source=postgres", f"source.port={pg_source.port}", "source.table=x",
                          "strategy=none", "sink=parquet", "sink.path=/nonexistent-unused"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    assert "no password supplied" in res.stderr
    assert f"hint: $PGPASSWORD is not set on {socket.gethostname()} (pid " in res.stderr, res.stderr
    assert "runtime.forward_env" in res.stderr and "password_file" in res.stderr
