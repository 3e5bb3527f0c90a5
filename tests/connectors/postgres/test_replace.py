"""load_mode=replace keeps what makes the table the user's; replace and truncate refuse, before
anything moves, a swap that dependents would make fail at the end.

On the main this started from, replace turned a table of another access method (a columnar one;
here one made on the heap handler, as Citus is not installable here) into a heap table and
dropped its owner, GRANTs and comment; a dependent view or a referencing foreign key failed the
job at finalize, after the whole load.
"""

from __future__ import annotations

import pytest

from conveyor.errors import SchemaError
from tests.helpers import PG_PASSWORD, job, pg_exec


@pytest.fixture(scope="module")
def rp_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS rp_src", "CREATE TABLE rp_src AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 1000) g")
    return pg_source


def _dst(server, table: str) -> dict:
    return {"type": "postgres", "port": server.port, "table": table}


def test_replace_keeps_access_method_owner_grants_and_comment(rp_src, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rp_dst", "DROP ACCESS METHOD IF EXISTS rp_columnar",
            "CREATE ACCESS METHOD rp_columnar TYPE TABLE HANDLER heap_tableam_handler",
            "DROP ROLE IF EXISTS rp_owner", "DROP ROLE IF EXISTS rp_reader", f"CREATE ROLE rp_owner LOGIN PASSWORD '{PG_PASSWORD}'",
            "CREATE ROLE rp_reader", "CREATE TABLE rp_dst (id int PRIMARY KEY, h text) USING rp_columnar",
            "ALTER TABLE rp_dst OWNER TO rp_owner", "GRANT SELECT ON rp_dst TO rp_reader", "GRANT SELECT, INSERT ON rp_dst TO PUBLIC",
            "COMMENT ON TABLE rp_dst IS 'orders, loaded nightly'", "COMMENT ON COLUMN rp_dst.h IS 'a hash'",
            "INSERT INTO rp_dst VALUES (-1, 'old')")

    def identity() -> tuple:
        return pg_exec(pg_target, "SELECT a.amname, c.relowner::regrole::text, c.relacl::text, obj_description(c.oid, 'pg_class'), "
                                  "col_description(c.oid, 2) FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.oid = 'rp_dst'::regclass")[0]

    before = identity()
    report = job({"type": "postgres", "port": rp_src.port, "table": "rp_src"}, _dst(pg_target, "rp_dst"), load_mode="replace")
    assert report.rows == 1000
    assert identity() == before
    assert before[0] == "rp_columnar" and "rp_reader=r/" in before[2]
    assert pg_exec(pg_target, "SELECT count(*), min(id) FROM rp_dst")[0] == (1000, 1)


def test_a_dependent_view_or_foreign_key_is_refused_before_the_load(rp_src, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rp_child, rp_parent CASCADE",
            "CREATE TABLE rp_parent (id int PRIMARY KEY, h text)", "INSERT INTO rp_parent VALUES (1, 'kept')",
            "CREATE VIEW rp_view AS SELECT id FROM rp_parent")
    src = {"type": "postgres", "port": rp_src.port, "table": "rp_src"}
    with pytest.raises(SchemaError, match=r"load_mode=replace cannot swap it in: views rp_view depend on it") as err:
        job(src, _dst(pg_target, "rp_parent"), load_mode="replace")
    assert "load_mode=truncate" in err.value.hint
    pg_exec(pg_target, "CREATE TABLE rp_child (id int REFERENCES rp_parent (id))")
    for mode in ("replace", "truncate"):
        with pytest.raises(SchemaError, match=r"foreign keys point at it: rp_child_id_fkey \(rp_child\)"):
            job(src, _dst(pg_target, "rp_parent"), load_mode=mode)
    assert pg_exec(pg_target, "SELECT * FROM rp_parent") == [(1, "kept")]
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage\\_%'")[0][0] == 0


@pytest.mark.parametrize("mode", ["create", "replace"])
def test_unlogged_load_ends_logged_with_its_indexes_and_every_row(rp_src, pg_target, mode: str) -> None:
    """sink.unlogged_load: the new table is loaded UNLOGGED and SET LOGGED before the swap: the target
    (and its primary key's index) is a permanent, logged relation, exact, with the replaced table's grants."""
    pg_exec(rp_src, "DROP TABLE IF EXISTS rp_keyed", "CREATE TABLE rp_keyed (id int PRIMARY KEY, h text)",
            "INSERT INTO rp_keyed SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS rp_logged")
    if mode == "replace":
        pg_exec(pg_target, "CREATE TABLE rp_logged (id int PRIMARY KEY, h text)", "INSERT INTO rp_logged VALUES (-1, 'old')",
                "DROP ROLE IF EXISTS rp_viewer", "CREATE ROLE rp_viewer", "GRANT SELECT ON rp_logged TO rp_viewer")
    sink = {**_dst(pg_target, "rp_logged"), "unlogged_load": True}
    report = job({"type": "postgres", "port": rp_src.port, "table": "rp_keyed"}, sink, "ctid", {"partitions": 3}, load_mode=mode, degree=2)
    assert report.rows == 5000
    assert pg_exec(pg_target, "SELECT c.relpersistence, i.relpersistence, i.relname FROM pg_class c JOIN pg_index x ON x.indrelid = c.oid "
                              "JOIN pg_class i ON i.oid = x.indexrelid WHERE c.oid = 'rp_logged'::regclass") == [("p", "p", "rp_logged_pkey")]
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM rp_logged")[0] == (5000, 5000, 1, 5000)
    if mode == "replace":
        assert "rp_viewer=r/" in pg_exec(pg_target, "SELECT relacl::text FROM pg_class WHERE oid = 'rp_logged'::regclass")[0][0]
