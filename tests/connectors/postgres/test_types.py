"""The type matrix: PostgreSQL -> PostgreSQL on both paths, and PostgreSQL -> Parquet -> PostgreSQL.

Rows are compared as PostgreSQL prints them (row::text) on both sides, so every value must come
back exactly: NaN and infinities, NULL in every column, long and non-ASCII text, arrays, enums.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conveyor.errors import SchemaError, TransferError
from tests.helpers import job, pg_exec

pytestmark = pytest.mark.pg_versions  # on PostgreSQL 15 and 18

DDL = """
CREATE TABLE types (
  id int4 PRIMARY KEY, i2 int2, i8 int8, n numeric(18,4), nu numeric, f4 float4, f8 float8, b bool,
  t text, vc varchar(20), ch char(6), by bytea, d date, ts timestamp, tz timestamptz, tm time,
  iv interval, u uuid, j json, jb jsonb, ia int4[], ta text[], ip inet, m mood
)"""

COLUMNS = ["id", "i2", "i8", "n", "nu", "f4", "f8", "b", "t", "vc", "ch", "by", "d", "ts", "tz", "tm", "iv", "u", "j", "jb",
           "ia", "ta", "ip", "m"]

ROWS = [
    """(1, 1, 2, 12345.6789, 1.5, 1.25, 2.5, true, 'plain', 'vc', 'abc', '\\x00ff10', '2024-02-29',
       '2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.654321+02', '23:59:59.999999',
       '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2], "b": null}',
       '{"x": {"y": "é"}}', '{1,NULL,3}', '{"x","y,z",NULL,"q\\"uote"}', '192.168.1.0/24', 'happy')""",
    """(2, -32768, -9223372036854775808, -99999999999999.9999, 'NaN', 'NaN', '-Infinity', false,
       'héllo wörld ✓ 日本語', '', '', '\\x', '0001-01-01', '1970-01-01 00:00:00', '2262-04-11 23:47:16.854775+00',
       '00:00:00', '-1 days -00:00:01', '00000000-0000-0000-0000-000000000000', '[]', '[]', '{}', '{}', '::1', 'sad')""",
    """(3, 32767, 9223372036854775807, 0.0001, 'Infinity', 'Infinity', 'Infinity', NULL, repeat('long ', 50000), 'x',
       'z', NULL, '9999-12-31', NULL, NULL, NULL, '0 seconds', NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    """(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL)""",
    """(5, 0, 0, -0.5, '-123456789012345678901234567890.123456789', '-Infinity', 1e-300, true, E'tab\\tnew\\nline', 'ß',
       'ü', '\\xdeadbeef', '2000-01-01', '2000-01-01 00:00:00.000001', '1999-12-31 23:59:59.999999+00', '12:00:00',
       '-6 mons +1 days', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '"str"', '123', '{-1}', '{""}', '10.1.2.3', 'ok')""",
]


def _rows_as_text(server, table: str = "types") -> list[str]:
    return [r[0] for r in pg_exec(server, f"SELECT _row::text FROM {table} _row ORDER BY id")]


@pytest.fixture(scope="module")
def types_source(pg_source, pg_target):
    for server in (pg_source, pg_target):
        pg_exec(server, "DROP TABLE IF EXISTS types", "DROP TYPE IF EXISTS mood", "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg_exec(pg_source, DDL, "INSERT INTO types VALUES " + ", ".join(ROWS))
    return pg_source


def _src(server, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": "types", **kw}


def _dst(server, table: str = "types", **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


@pytest.mark.parametrize("copy_path", ["passthrough", "arrow"])
def test_pg_to_pg_reproduces_every_value(types_source, pg_target, copy_path: str) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS types", DDL)
    report = job(_src(types_source), _dst(pg_target, copy_path=copy_path), "ctid", load_mode="append", degree=2)
    assert report.rows == len(ROWS)
    assert report.sink_plan.native == ("pgcopy-binary" if copy_path == "passthrough" else None)
    assert _rows_as_text(pg_target) == _rows_as_text(types_source)


def test_create_mode_keeps_the_source_types(types_source, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS types_created")
    job(_src(types_source), _dst(pg_target, "types_created", copy_path="arrow"), load_mode="create")
    types = dict(pg_exec(pg_target, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                    "WHERE attrelid = 'types_created'::regclass AND attnum > 0"))
    assert types["n"] == "numeric(18,4)" and types["nu"] == "numeric" and types["tz"] == "timestamp with time zone"
    assert types["vc"] == "character varying(20)" and types["ia"] == "integer[]" and types["ip"] == "inet"
    assert types["m"] == "text"  # an enum the target may not have: its labels as text
    src = _rows_as_text(types_source)
    assert _rows_as_text(pg_target, "types_created") == src


def test_parquet_cannot_hold_intervals(types_source, tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="column iv of type month_day_nano_interval cannot be stored in Parquet"):
        job(_src(types_source), {"type": "parquet", "path": str(tmp_path / "o")}, load_mode="create")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_pg_to_parquet_to_pg(types_source, pg_target, tmp_path: Path) -> None:
    """Everything but interval (Parquet has no month-day-nano type) survives Parquet; interval goes as text."""
    out = tmp_path / "types"
    cols = ", ".join(c if c != "iv" else "iv::text AS iv" for c in COLUMNS)
    query = {"type": "postgres", "port": types_source.port, "query": f"SELECT {cols} FROM types"}
    job(query, {"type": "parquet", "path": str(out)}, "none", load_mode="create")
    table = pq.read_table(out)
    assert table.num_rows == len(ROWS)
    assert str(table.schema.field("n").type) == "decimal128(18, 4)"
    assert str(table.schema.field("tz").type) == "timestamp[us, tz=UTC]"
    pg_exec(pg_target, "DROP TABLE IF EXISTS types", DDL)
    # the interval went as text, which the cast policy does not parse unless asked to
    with pytest.raises(SchemaError, match=r"column iv \(string -> interval\): the text would be parsed"):
        job({"type": "parquet", "path": str(out)}, _dst(pg_target), "files", load_mode="append")
    job({"type": "parquet", "path": str(out)}, _dst(pg_target, allow_cast=["iv"]), "files", load_mode="append")
    assert _rows_as_text(pg_target) == _rows_as_text(types_source)


def test_nan_in_a_constrained_numeric_is_a_clear_error(pg_source, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS nanny", "CREATE TABLE nanny (v numeric(10,2))", "INSERT INTO nanny VALUES (1.5), ('NaN')")
    with pytest.raises(TransferError) as info:
        job({"type": "postgres", "port": pg_source.port, "table": "nanny"}, {"type": "parquet", "path": str(tmp_path / "o")},
            load_mode="create")
    assert "column v (numeric(10,2))" in str(info.value) and "NaN" in (info.value.hint or "")
    assert not list((tmp_path / "o").glob("*.parquet"))


# The columns pgpq encodes (the rest of the matrix goes through ADBC's writer).
PGPQ_COLUMNS = ["id", "i2", "i8", "n", "f4", "f8", "b", "t", "vc", "ch", "by", "d", "ts", "tz", "tm", "u", "j"]


@pytest.mark.parametrize("writer", ["pgpq", "adbc"])
def test_both_arrow_encoders_reproduce_every_value(types_source, pg_target, tmp_path: Path, writer: str) -> None:
    """PostgreSQL -> PostgreSQL and Parquet -> PostgreSQL through pgpq and through ADBC, compared as text."""
    cols = ", ".join(PGPQ_COLUMNS)
    query = {"type": "postgres", "port": types_source.port, "query": f"SELECT {cols} FROM types"}
    expected = [r[0] for r in pg_exec(types_source, f"SELECT (SELECT _r FROM (SELECT {cols}) _r)::text FROM types ORDER BY id")]
    pg_exec(pg_target, "DROP TABLE IF EXISTS types_sub", "DROP TABLE IF EXISTS types", DDL,
            f"CREATE TABLE types_sub AS SELECT {cols} FROM types WITH NO DATA")
    report = job(query, _dst(pg_target, "types_sub", copy_path="arrow", writer=writer), "none", load_mode="append")
    assert report.sink_plan.own.writer == writer
    assert _rows_as_text(pg_target, "types_sub") == expected
    out = tmp_path / "sub"
    job(query, {"type": "parquet", "path": str(out)}, "none", load_mode="create")
    pg_exec(pg_target, "TRUNCATE types_sub")
    report = job({"type": "parquet", "path": str(out)}, _dst(pg_target, "types_sub", writer=writer), "files", load_mode="append")
    assert report.sink_plan.own.writer == writer
    assert _rows_as_text(pg_target, "types_sub") == expected


def test_auto_writer_falls_back_to_adbc_and_says_why(types_source, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS types", DDL)
    report = job(_src(types_source), _dst(pg_target, copy_path="arrow"), "none", load_mode="append")
    assert report.sink_plan.own.writer == "adbc"
    # unconstrained numeric is read as exact text, which pgpq sends to PostgreSQL to parse; an interval
    # (month_day_nano) pgpq cannot encode
    assert "adbc encoder (column iv: pgpq does not encode month_day_nano_interval as interval)" in report.sink_plan.path_reason
    assert _rows_as_text(pg_target) == _rows_as_text(types_source)


def test_forced_pgpq_writer_refuses_a_type_it_cannot_encode(types_source, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS types", DDL)
    with pytest.raises(SchemaError, match="writer=pgpq is not possible: column iv: pgpq does not encode month_day_nano_interval as interval"):
        job(_src(types_source), _dst(pg_target, copy_path="arrow", writer="pgpq"), "none", load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM types") == [(0,)]
