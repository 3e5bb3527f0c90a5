"""A varchar(n) / char(n) target and a value longer than n characters: refused by name, never cut.

PostgreSQL refuses a value too long for varchar(n) or char(n), except one whose excess characters
are all spaces: it stores that one cut to n without a word ('abc  ' into varchar(3) is 'abc'). On the
main this started from, a varchar(10) -> varchar(3) column passed through untouched ("same column
types; typmods differ (each value checked by PostgreSQL)") and so did every string into such a
column on the Arrow path: 'abc  ' arrived as 'abc' and the run verified. Each column whose source
type does not bound it to n is now checked on the client, one vectorized length per batch."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import SchemaError, TransferError
from tests.helpers import job, pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")


def _tables(src, dst, values: str, target_type: str = "varchar(3)") -> tuple[dict, dict]:
    pg_exec(src, "DROP TABLE IF EXISTS tl_src", "CREATE TABLE tl_src (id int, v varchar(10))", f"INSERT INTO tl_src VALUES {values}")
    pg_exec(dst, "DROP TABLE IF EXISTS tl_dst", f"CREATE TABLE tl_dst (id int, v {target_type})")
    return {"type": "postgres", "port": src.port, "table": "tl_src"}, {"type": "postgres", "port": dst.port, "table": "tl_dst"}


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
@pytest.mark.parametrize("target_type, shown", [("varchar(3)", "character varying(3)"), ("char(3)", "character(3)")])
def test_trailing_spaces_past_the_length_are_refused_not_cut(pg_source, pg_target, copy_path: str, target_type: str, shown: str) -> None:
    src, dst = _tables(pg_source, pg_target, "(1, 'abc  '), (2, 'xy')", target_type)
    with pytest.raises(TransferError, match=re.escape(f"column v -> v: a value of 5 characters is too long for {shown}")):
        job(src, {**dst, "copy_path": copy_path}, load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM tl_dst") == [(0,)]  # the one partition rolled back


def test_values_that_fit_take_the_arrow_path_and_arrive_exactly(pg_source, pg_target) -> None:
    """varchar(10) -> varchar(3) no longer passes through (the stream's values are not looked at):
    the Arrow path checks them, and values that fit, a trailing space included, arrive as they were."""
    src, dst = _tables(pg_source, pg_target, "(1, 'abc'), (2, 'ab '), (3, NULL), (4, 'é!')")
    report = job(src, dst, load_mode="append")
    assert report.sink_plan.native is None
    assert "column v: character varying(10) -> character varying(3): each value's length is checked" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT id, v FROM tl_dst ORDER BY id") == [(1, "abc"), (2, "ab "), (3, None), (4, "é!")]


def test_a_wider_target_still_passes_through(pg_source, pg_target) -> None:
    src, dst = _tables(pg_source, pg_target, "(1, 'abcdefghij')", "varchar(20)")
    report = job(src, dst, load_mode="append")
    assert report.sink_plan.native == "pgcopy-binary", report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT v FROM tl_dst") == [("abcdefghij",)]


def test_passthrough_forced_onto_a_narrower_column_is_refused_before_anything_moves(pg_source, pg_target) -> None:
    src, dst = _tables(pg_source, pg_target, "(1, 'abc')")
    with pytest.raises(SchemaError, match=r"copy_path=passthrough is not possible: column v: character varying\(10\) -> character varying\(3\)"):
        job(src, {**dst, "copy_path": "passthrough"}, load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM tl_dst") == [(0,)]


def test_a_parquet_string_into_varchar_n_is_checked_too(pg_target, tmp_path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": ["ok", "toolong   "]}), tmp_path / "in" / "a.parquet")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tl_pq", "CREATE TABLE tl_pq (id bigint, v varchar(7))")
    with pytest.raises(TransferError, match=r"column v -> v: a value of 10 characters is too long for character varying\(7\)"):
        job({"type": "parquet", "path": str(tmp_path / "in")}, {"type": "postgres", "port": pg_target.port, "table": "tl_pq"},
            "files", load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM tl_pq") == [(0,)]
