"""Types whose ADBC Arrow type is not theirs: oid (read by ADBC as int32, which holds no oid above 2^31) and money (int64
cents, which no money text casts to). Into such a target column the values' text is parsed by PostgreSQL: every value
arrives (they were refused: "does not fit int32", "Failed to parse string '$123.46' as int64")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import job, pg_exec

pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18


@pytest.fixture(scope="module")
def odd(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS odd_types", "CREATE TABLE odd_types (id int PRIMARY KEY, o oid, m money)",
            "INSERT INTO odd_types VALUES (1, 3000000000, '$123.46'), (2, 4294967295, '-$1,000.00'), (3, 0, NULL)")
    return pg_source


def _text(server, table: str) -> list[tuple]:
    return pg_exec(server, f"SELECT id, o::text, m::text FROM {table} ORDER BY id")


def test_oid_and_money_through_the_arrow_path(odd, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS odd_a")
    job({"type": "postgres", "port": odd.port, "table": "odd_types"},
        {"type": "postgres", "port": pg_target.port, "table": "odd_a", "copy_path": "arrow"}, load_mode="create")
    assert _text(pg_target, "odd_a") == _text(odd, "odd_types")


def test_oid_and_money_back_from_parquet(odd, pg_target, tmp_path: Path) -> None:
    job({"type": "postgres", "port": odd.port, "table": "odd_types"}, {"type": "parquet", "path": str(tmp_path / "pq")}, load_mode="create")
    pg_exec(pg_target, "DROP TABLE IF EXISTS odd_b", "CREATE TABLE odd_b (id int, o oid, m money)")
    job({"type": "parquet", "path": str(tmp_path / "pq")}, {"type": "postgres", "port": pg_target.port, "table": "odd_b"}, load_mode="append")
    assert _text(pg_target, "odd_b") == _text(odd, "odd_types")


@pytest.mark.parametrize("writer", ["pgpq", "adbc"])
def test_a_type_without_a_binary_form_through_the_arrow_path(pg_source, pg_target, writer: str) -> None:
    """aclitem has no binary input or output: through the Arrow path the job stopped naming no column ("checking types of
    ...: no binary output function available for type aclitem"). Its text is cast by PostgreSQL now, arrays too."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS acl_src", "CREATE TABLE acl_src (id int PRIMARY KEY, a aclitem, a2 aclitem[])",
            "INSERT INTO acl_src VALUES (1, 'postgres=r/postgres', '{postgres=r/postgres,=w/postgres}'), (2, NULL, NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS acl_t")
    for mode in ("create", "truncate"):
        job({"type": "postgres", "port": pg_source.port, "table": "acl_src"},
            {"type": "postgres", "port": pg_target.port, "table": "acl_t", "copy_path": "arrow", "writer": writer}, load_mode=mode)
        shape = "SELECT id, a::text, a2::text, pg_typeof(a)::text, pg_typeof(a2)::text FROM {} ORDER BY id"
        assert pg_exec(pg_target, shape.format("acl_t")) == pg_exec(pg_source, shape.format("acl_src"))
