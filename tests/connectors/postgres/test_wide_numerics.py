"""Numerics wider than any Arrow decimal (numeric(210,10), numeric(1000,800), an unconstrained numeric holding 80 digits,
as PostgreSQL's regression schemas have them): read as their text, exact, on every path; PostgreSQL to PostgreSQL
keeps the column's type and every digit (checked by the servers' own text of each value)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import job, pg_exec

pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18

BIG = "12345678901234567890123456789012345678901234567890123456789012345678901234567890.5"


@pytest.fixture(scope="module")
def wide(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS wide_num", "CREATE TABLE wide_num (id int, a numeric(210,10), b numeric, c numeric(1000, 800))",
            f"INSERT INTO wide_num VALUES (1, 1e150, 1e200, 1.5), (2, NULL, {BIG}, NULL), (3, -0.0000000001, 'NaN', 1e-790)")
    return pg_source


def _text(server, table: str) -> list[tuple]:
    return pg_exec(server, f"SELECT id, a::text, b::text, c::text, format_type(atttypid, atttypmod) FROM {table} "
                           f"CROSS JOIN (SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = '{table}'::regclass "
                           "AND attname = 'c') t ORDER BY id")


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_wide_numerics_copy_exactly_postgres_to_postgres(wide, pg_target, copy_path: str) -> None:
    report = job({"type": "postgres", "port": wide.port, "table": "wide_num"},
                 {"type": "postgres", "port": pg_target.port, "table": "wide_num", "copy_path": copy_path}, load_mode="replace",
                 verify="checksum")
    assert report.verification.ok
    assert _text(pg_target, "wide_num") == _text(wide, "wide_num")


def test_wide_numerics_reach_parquet_as_their_exact_text(wide, tmp_path: Path) -> None:
    job({"type": "postgres", "port": wide.port, "table": "wide_num"}, {"type": "parquet", "path": str(tmp_path / "pq")}, load_mode="replace")
    got = pq.read_table(tmp_path / "pq").sort_by("id")
    assert [str(t) for t in got.schema.types] == ["int32", "string", "string", "string"]
    want = pg_exec(wide, "SELECT a::text, b::text, c::text FROM wide_num ORDER BY id")
    assert list(zip(*(got.column(c).to_pylist() for c in ("a", "b", "c")))) == [tuple(r) for r in want]
