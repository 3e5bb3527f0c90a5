"""Tables in an inheritance tree (``CREATE TABLE emp (...) INHERITS (person)``), as PostgreSQL's own regression
schemas have them: a parent is read, truncated, counted and checksummed as its own rows (``ONLY``), never with
its children's, which are tables of their own; a whole-schema job stores each row once. Every count below is
read with ``ONLY`` on the servers themselves, not from Conveyor's report."""

from __future__ import annotations

import pytest

from tests.helpers import job, pg_exec

HIERARCHY = ["CREATE TABLE {s}.person (name text PRIMARY KEY, age int)",
             "CREATE TABLE {s}.emp (salary int) INHERITS ({s}.person)",
             "CREATE TABLE {s}.student (gpa float8) INHERITS ({s}.person)"]


def _tree(server, schema: str, rows: bool) -> None:
    pg_exec(server, f"DROP SCHEMA IF EXISTS {schema} CASCADE", f"CREATE SCHEMA {schema}", *(h.format(s=schema) for h in HIERARCHY))
    if rows:
        pg_exec(server, f"INSERT INTO {schema}.person SELECT 'p' || g, g FROM generate_series(1, 10) g",
                f"INSERT INTO {schema}.emp SELECT 'e' || g, 30 + g, 1000 * g FROM generate_series(1, 6) g",
                f"INSERT INTO {schema}.student SELECT 's' || g, 20 + g, g / 4.0 FROM generate_series(1, 4) g")


def _own(server, schema: str) -> dict[str, int]:
    return {t: pg_exec(server, f"SELECT count(*) FROM ONLY {schema}.{t}")[0][0] for t in ("person", "emp", "student")}


def _rows(server, schema: str, table: str) -> list[tuple]:
    return pg_exec(server, f"SELECT * FROM ONLY {schema}.{table} ORDER BY 1")


@pytest.fixture(scope="module")
def inh(pg_source):
    _tree(pg_source, "inh", rows=True)
    return pg_source


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_a_parent_and_its_child_truncated_into_a_tree_keep_their_own_rows(inh, pg_target, copy_path: str) -> None:
    _tree(pg_target, "inh_t", rows=False)
    pg_exec(pg_target, "INSERT INTO inh_t.emp VALUES ('old', 1, 1)")
    for table in ("emp", "person"):  # the child first, then its parent: the parent's truncate leaves the child's rows alone
        report = job({"type": "postgres", "port": inh.port, "schema": "inh", "table": table},
                     {"type": "postgres", "port": pg_target.port, "schema": "inh_t", "table": table, "copy_path": copy_path},
                     load_mode="truncate", verify="checksum")
        assert report.verification.ok and report.verification.source_rows == {"emp": 6, "person": 10}[table]
    assert _own(pg_target, "inh_t") == {"person": 10, "emp": 6, "student": 0}
    for table in ("person", "emp"):
        assert _rows(pg_target, "inh_t", table) == _rows(inh, "inh", table)


def test_a_whole_schema_with_an_inheritance_tree_stores_each_row_once(inh, pg_target, cli) -> None:
    pg_exec(pg_target, "DROP SCHEMA IF EXISTS inh_w CASCADE", "CREATE SCHEMA inh_w")
    res = cli("run", "pipeline=pg_to_pg", f"source.port={inh.port}", "source.tables=[inh.*]", f"sink.port={pg_target.port}",
              "sink.schema=inh_w", "sink.table='{table}'", "load_mode=create", "runtime=local", "verify=checksum")
    assert res.code == 0, res.err
    assert _own(pg_target, "inh_w") == _own(inh, "inh") == {"person": 10, "emp": 6, "student": 4}
    for table in ("person", "emp", "student"):
        assert _rows(pg_target, "inh_w", table) == _rows(inh, "inh", table)
    assert "inheritance children" in res.out + res.err  # the parent's own rows, and why, said
