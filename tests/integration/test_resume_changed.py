"""Resume is exact or refuses by name when the source moved since the run it resumes.

The first run stops after committing some partitions (degree 1, so in order: a CHECK constraint on
the target refuses one id of a later partition); the source is then written; the resume must load
the rest exactly or refuse, never load a row twice or miss one. On the main this started from, an
UPDATE that moved tuples out of a finished ctid range into an unfinished one loaded those rows
twice, and one that moved tuples from an unfinished range into free space of a finished one lost
them, both with exit 0 and "verify=count: ok".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import checksum, pg_exec, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def cli(tmp_path: Path):
    """`conveyor ARGS` run in tmp_path: each call names its own run directory (the first run's is resumed)."""
    return lambda *args: run_cli(*args, cwd=tmp_path)

ROWS = 40000


#: the database of the source table whose first pages are freed: a VACUUM frees the deleted rows' space only where no
#: older snapshot may still see them, and the snapshots of other tests' sessions count only in their own database
FREED_DB = "rc_freed"


def _first_run(cli, src, dst, tmp_path: Path, table: str, *extra: str, free_space: bool = False) -> tuple[list[str], Path]:
    """A source ``table`` of ROWS rows, and a run into an empty target that stops at id 22,500 (its
    third of 8 partitions), with the CHECK that stopped it dropped after. Returns the job's args and run dir.
    ``free_space``: the table's first pages are emptied of 2,500 rows first (in a database of its own)."""
    db = FREED_DB if free_space else "postgres"
    if free_space and not pg_exec(src, f"SELECT 1 FROM pg_database WHERE datname = '{db}'"):
        pg_exec(src, f"CREATE DATABASE {db}")
    pg_exec(src, f"DROP TABLE IF EXISTS {table}",
            f"CREATE TABLE {table} AS SELECT g AS id, 0 AS v, md5(g::text) AS h FROM generate_series(1, {ROWS}) g",
            f"ALTER TABLE {table} ADD PRIMARY KEY (id)", dbname=db)
    if free_space:  # room in the first pages, where an UPDATE elsewhere may put its new row versions
        pg_exec(src, f"DELETE FROM {table} WHERE id <= 2500", f"VACUUM {table}", dbname=db)
    pg_exec(dst, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} (id int, v int, h text, CONSTRAINT stop CHECK (id <> 22500))")
    args = ["run", "pipeline=pg_to_pg", f"source.port={src.port}", f"source.dbname={db}", f"source.table={table}", f"sink.port={dst.port}",
            f"sink.table={table}", "load_mode=append", "degree=1", "runtime=local", "sink.copy_path=arrow", *extra]
    first = cli(*args, f"hydra.run.dir={tmp_path}/first")
    assert first.code != 0 and 'check constraint "stop"' in first.err, first.err
    pg_exec(dst, f"ALTER TABLE {table} DROP CONSTRAINT stop")
    assert 0 < pg_exec(dst, f"SELECT count(*) FROM {table}")[0][0] < ROWS
    return args, tmp_path / "first"


def _resume(cli, args: list[str], run_dir: Path, tmp_path: Path):
    return cli(*args, f"resume={run_dir}", f"hydra.run.dir={tmp_path}/second")


CTID = ("strategy=ctid", "strategy.partitions=8")


def test_rows_moved_out_of_a_finished_ctid_range_refuse_the_resume(pg_source, pg_target, cli, tmp_path: Path) -> None:
    """Updated rows of a finished range get new versions at the table's end (an unfinished range):
    read again they would be loaded twice. The finished range has fewer rows than were loaded."""
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path, "rc_out", *CTID)
    before = pg_exec(pg_target, "SELECT count(*) FROM rc_out")[0][0]
    pg_exec(pg_source, "UPDATE rc_out SET v = v + 1 WHERE id BETWEEN 1 AND 1000")
    res = _resume(cli, args, run_dir, tmp_path)
    assert res.code == 2, res.err
    assert "changed since the run it resumes" in res.err and "ctid-00000" in res.err and "deleted, or moved out" in res.err
    assert "load_mode=truncate" in res.err and "Traceback" not in res.err
    assert pg_exec(pg_target, "SELECT count(*) FROM rc_out")[0][0] == before  # nothing loaded


def test_rows_moved_into_a_finished_ctid_range_refuse_the_resume(pg_source, pg_target, cli, tmp_path: Path) -> None:
    """Updated rows of an unfinished range get new versions in free space of a finished one: never
    read again, they would be missed. The finished range holds row versions its run did not see."""
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path, "rc_in", *CTID, free_space=True)
    pg_exec(pg_source, "UPDATE rc_in SET v = v + 1 WHERE id BETWEEN 35001 AND 36000", dbname=FREED_DB)
    # the test's premise: new row versions in the freed pages, which the first partition covers
    moved = pg_exec(pg_source, "SELECT count(*) FROM rc_in WHERE id BETWEEN 35001 AND 36000 AND (ctid::text::point)[0] < 20",
                    dbname=FREED_DB)[0][0]
    assert moved > 0, "the UPDATE put no row version into the freed first pages: the premise of this test did not hold"
    res = _resume(cli, args, run_dir, tmp_path)
    assert res.code == 2, res.err
    assert "rows inserted or updated into it since" in res.err


def test_a_table_rewritten_since_refuses_a_ctid_resume(pg_source, pg_target, cli, tmp_path: Path) -> None:
    """VACUUM FULL keeps every row version (its xmin) but moves it to other pages: the table's files differ."""
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path, "rc_full", *CTID, free_space=True)
    pg_exec(pg_source, "VACUUM FULL rc_full", dbname=FREED_DB)
    res = _resume(cli, args, run_dir, tmp_path)
    assert res.code == 2 and "rewritten since" in res.err, res.err


def test_changes_only_in_unfinished_partitions_resume_to_the_source_as_it_is_now(pg_source, pg_target, cli, tmp_path: Path) -> None:
    """Writes that touch only what the stopped run had not loaded (updates of its last rows, rows
    added at the end) leave the finished partitions as they were: the resume loads the rest as it is
    now, and the target equals the source."""
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path, "rc_rest", *CTID)
    marks = json.loads((run_dir / "manifest.json").read_text())["source_marks"][""]
    assert {"xmin", "xmax", "running", "files"} <= set(marks)
    pg_exec(pg_source, "UPDATE rc_rest SET v = v + 1 WHERE id > 38000",
            f"INSERT INTO rc_rest SELECT g, 7, 'new' FROM generate_series({ROWS + 1}, {ROWS + 500}) g")
    res = _resume(cli, args, run_dir, tmp_path)
    assert res.code == 0, res.err
    assert "are unchanged since the first run" in res.err
    assert checksum(pg_target, "rc_rest") == checksum(pg_source, "rc_rest")


def test_a_key_strategy_refuses_an_update_in_a_finished_range_and_resumes_after_one_elsewhere(pg_source, pg_target, cli,
                                                                                          tmp_path: Path) -> None:
    """Key ranges hold a row wherever its version lies: an update of a finished range's row (the target
    holds the old value) refuses; an update of an unfinished one resumes exactly."""
    keyed = ("strategy=rangeid", "strategy.distribute_key=id", "strategy.partitions=8")
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path, "rc_key", *keyed)
    pg_exec(pg_source, "UPDATE rc_key SET v = 5 WHERE id = 10")
    res = _resume(cli, args, run_dir, tmp_path)
    assert res.code == 2 and "1 rows inserted or updated into it since" in res.err, res.err
    pg_exec(pg_source, "UPDATE rc_key SET v = 0 WHERE id = 10")  # a new version again, with the old value: still not the one read
    assert _resume(cli, args, run_dir, tmp_path).code == 2
    args, run_dir = _first_run(cli, pg_source, pg_target, tmp_path / "b", "rc_key", *keyed)
    pg_exec(pg_source, "UPDATE rc_key SET v = 5 WHERE id > 39000")
    res = _resume(cli, args, run_dir, tmp_path / "b")
    assert res.code == 0, res.err
    assert checksum(pg_target, "rc_key") == checksum(pg_source, "rc_key")


def test_a_parquet_file_rewritten_since_refuses_the_resume(pg_target, cli, tmp_path: Path) -> None:
    """File partitions: a finished partition's file rewritten between the runs is named; untouched files resume."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        ids = pa.array(range(i * 1000, (i + 1) * 1000), pa.int32())
        pq.write_table(pa.table({"id": ids, "v": pa.array([0] * 1000, pa.int32()), "h": pa.array(["x"] * 1000)}), folder / f"f{i}.parquet")
    pg_exec(pg_target, "DROP TABLE IF EXISTS rc_files", "CREATE TABLE rc_files (id int, v int, h text, CONSTRAINT stop CHECK (id <> 2500))")
    args = ["run", "source=parquet", f"source.path={folder}", "sink=postgres", f"sink.port={pg_target.port}", "sink.table=rc_files",
            "strategy=files", "load_mode=append", "degree=1", "runtime=local"]
    assert cli(*args, f"hydra.run.dir={tmp_path}/first").code != 0
    pg_exec(pg_target, "ALTER TABLE rc_files DROP CONSTRAINT stop")
    done = pg_exec(pg_target, "SELECT count(*) FROM rc_files")[0][0]
    assert done == 2000
    pq.write_table(pa.table({"id": pa.array([0], pa.int32()), "v": pa.array([9], pa.int32()), "h": pa.array(["y"])}), folder / "f0.parquet")
    res = _resume(cli, args, tmp_path / "first", tmp_path)
    assert res.code == 2 and "f0.parquet was rewritten since" in res.err, res.err
