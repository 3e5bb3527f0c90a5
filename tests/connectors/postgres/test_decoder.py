"""source.decoder: DuckDB's postgres extension decodes the binary COPY stream into the same Arrow batches
ADBC's reader gives, in the job's snapshot, about 3x cheaper in CPU (``make bench``, pg_to_parquet).

Each test reads one real server through both decoders and compares the batches value for value,
schema included: the edge values of every type DuckDB is allowed to decode (integer bounds, NaN,
infinities and -0 in floats, char padding, NUL bytes in bytea, BC dates, infinity and timestamps past
Arrow's range under each special_values policy), and the columns read as text. On the main this
started from, there was one decoder (ADBC's), and source.decoder did not exist.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from conveyor.connectors.postgres import duckdecode
from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
from conveyor.core import INFINITY_DAYS, INFINITY_TICKS, JobOptions, WholeSource
from conveyor.errors import ConfigError, SchemaError, TransferError
from tests.helpers import PG_PASSWORD, job, pg_exec

MATRIX = """CREATE TABLE dec_matrix (
  id int, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, b bool, t text, vc varchar(5), by bytea,
  d date, ts timestamp, tz timestamptz, n1 numeric(38,10), n2 numeric(15,2), n3 numeric(5,0), nu numeric, ip inet, mo money,
  ch char(5), c1 char, u uuid, j json, jb jsonb, tm time, t3 time(3), iv interval, e dec_mood)"""
ROWS = [
    "(1, -32768, -2147483648, -9223372036854775808, 'NaN', 'Infinity', true, '', 'abc', '\\x00ff00', "
    "'4713-01-01 BC', '4713-01-01 00:00:00 BC', '0001-01-01 00:00:00+00', 9999999999999999999999999999.9999999999, "
    "-9999999999999.99, 99999, 'NaN', '10.0.0.1/8', '12.34', ' a', '', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": 1,  \"b\":[1,2]}', "
    "'{\"é\": \"🦆\", \"a\": [1, 2.50]}', '00:00:00', '00:00:00.001', '-178000000 years', 'sad')",
    "(2, 32767, 2147483647, 9223372036854775807, '-Infinity', '-0', false, 'héllo 🦆 wörld', 'αβγδε', '\\x', "
    "'5874897-12-31', '294247-01-09 04:00:54.775806', '2024-02-29 23:59:59.999999+05:30', "
    "-0.0000000001, 0.01, -1, '123456789012345678901234567890.123456789', '::1', '-0.01', 'αβ', 'é', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '\"x\"', 'null', '24:00:00', "
    "'23:59:59.999', '1 year 2 mons 3 days 04:05:06.789012', 'happy')",
    "(3, 0, 0, 0, '1.4e-45', '4.9e-324', NULL, 'line\nbreak\ttab \"quote\" ''single''', '', '\\xdeadbeef', "
    "'2000-01-01', '1970-01-01 00:00:00', '1999-12-31 23:59:59.5-08', 0, 0, 0, '-0.000', NULL, NULL, 'a\t b', '\n', "
    "'00000000-0000-0000-0000-000000000000', '[1, 2.50, 1e3]', '[]', '23:59:59.999999', '12:00:00.5', "
    "'-1 days -00:00:00.000001', 'it''s')",
    "(4" + ", NULL" * 27 + ")",
]
SPECIAL = ("(5, 1, 1, 1, 1, 1, true, 'x', 'x', '\\x01', 'infinity', '-infinity', 'infinity', 1, 1, 1, 1, NULL, NULL, 'abcde', 'y', NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
           "(6, 1, 1, 1, 1, 1, true, 'x', 'x', '\\x01', '-infinity', '294276-12-31 23:59:59', '-infinity', 1, 1, 1, 1, NULL, NULL, 'x', 'y', NULL, NULL, NULL, NULL, NULL, NULL, NULL)")


pytestmark = [pytest.mark.usefixtures("pg_password"), pytest.mark.pg_versions]  # on PostgreSQL 15 and 18


@pytest.fixture(scope="module")
def matrix(pg_source):
    os.environ.setdefault("PGPASSWORD", PG_PASSWORD)
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_matrix, dec_special, dec_inf", "DROP TYPE IF EXISTS dec_mood CASCADE",
            "CREATE TYPE dec_mood AS ENUM ('sad', 'happy', 'it''s')", MATRIX, f"INSERT INTO dec_matrix VALUES {', '.join(ROWS)}",
            "DROP TABLE IF EXISTS dec_special", "CREATE TABLE dec_special (LIKE dec_matrix)",
            f"INSERT INTO dec_special VALUES {', '.join(ROWS + list(SPECIAL))}",
            "DROP TABLE IF EXISTS dec_inf", "CREATE TABLE dec_inf (LIKE dec_matrix)", f"INSERT INTO dec_inf VALUES {', '.join(ROWS + [SPECIAL[0]])}")
    return pg_source


def _read(server, table: str, decoder: str, keep_infinity: bool = False, **kw) -> pa.Table:
    src = PostgresSource(PostgresSourceConfig(port=server.port, table=table, decoder=decoder, **kw), JobOptions(batch_size=2))
    info = src.describe()
    assert src.decoder == decoder, info.reader
    if keep_infinity:
        src = src.keeping(("infinity",))
    with src.session() as shipped:
        batches = list(shipped.read(WholeSource(0, 1)))
    assert batches, "no batches read"
    assert all(b.schema == info.schema for b in batches)  # the schema describe promised, metadata included
    return pa.Table.from_batches(batches).sort_by("id")


def _values(table: pa.Table, name: str) -> list:
    """A column's values; floats, dates and timestamps as their bits (NaN equals NaN, -0.0 differs from 0.0,
    years Python's datetime cannot hold compare too)."""
    col = table[name].combine_chunks()
    return _plain(col)


def _plain(col: pa.Array) -> list:
    if pa.types.is_list(col.type):  # an array: its items as above, where each list starts, which lists are NULL
        return [_plain(col.values), col.offsets.to_pylist(), col.is_null().to_pylist()]
    if pa.types.is_interval(col.type):
        return col.to_pylist()  # (months, days, nanoseconds)
    if pa.types.is_floating(col.type) or pa.types.is_temporal(col.type):
        col = col.view(pa.int32() if col.type in (pa.float32(), pa.date32()) else pa.int64())
    return col.to_pylist()


def test_duckdb_decodes_every_edge_value_as_adbc_does(matrix) -> None:
    duck, adbc = _read(matrix, "dec_matrix", "duckdb"), _read(matrix, "dec_matrix", "adbc")
    assert duck.num_rows == adbc.num_rows == len(ROWS)
    assert duck.schema == adbc.schema
    for name in adbc.column_names:  # column by column, so a difference names its column
        assert _values(duck, name) == _values(adbc, name), name
    # and they are PostgreSQL's values: the NUL byte, the padding, the emoji, the bounds
    row = {n: _values(duck, n) for n in duck.column_names}
    assert row["by"][0] == b"\x00\xff\x00" and "🦆" in row["t"][1]
    assert row["i8"][:2] == [-2**63, 2**63 - 1] and str(row["n1"][0]) == "9999999999999999999999999999.9999999999"
    assert row["nu"][0] == "NaN" and row["ip"][1] == "::1/128"  # inet::text keeps the mask (both decoders read the same SQL)
    # char(n) as PostgreSQL stores it: padded to n characters (DuckDB trims the spaces; Arrow pads them back)
    assert row["ch"] == [" a   ", "αβ   ", "a\t b ", None] and row["c1"] == [" ", "é", "\n", None]


@pytest.mark.parametrize("policy", ["error", "null", "clamp", "keep"])
def test_infinity_and_far_timestamps_follow_the_same_policy_on_both_decoders(matrix, policy: str) -> None:
    kw = {} if policy in ("error", "keep") else {"special_values": policy}
    outcomes = []
    for decoder in ("duckdb", "adbc"):
        try:
            outcomes.append(_read(matrix, "dec_special", decoder, keep_infinity=policy == "keep", **kw))
        except TransferError as exc:
            outcomes.append(str(exc))
    duck, adbc = outcomes
    if policy == "error":  # refused by name, the same first column on both
        assert isinstance(duck, str) and duck == adbc and "column d (date) holds" in duck
        return
    if policy == "keep":  # infinity passes (into PostgreSQL, DuckDB), 294276 AD fits nowhere in Arrow: refused alike
        assert isinstance(duck, str) and duck == adbc and "column ts (timestamp without time zone) holds a timestamp after" in duck
        duck, adbc = (_read(matrix, "dec_inf", decoder, keep_infinity=True) for decoder in ("duckdb", "adbc"))
        assert duck.schema == adbc.schema and all(_values(duck, n) == _values(adbc, n) for n in adbc.column_names)
        assert (_values(duck, "d")[4], _values(duck, "ts")[4]) == (INFINITY_DAYS, -INFINITY_TICKS)  # infinity, -infinity kept
        return
    assert not isinstance(duck, str) and not isinstance(adbc, str), (duck, adbc)
    assert duck.schema == adbc.schema
    for name in adbc.column_names:
        assert _values(duck, name) == _values(adbc, name), name
    if policy == "null":
        assert _values(duck, "d")[4:6] == [None, None]


ARRAYS = """CREATE TABLE dec_arrays_all (id int, i2 int2[], i4 int4[], i8 int8[], f4 float4[], f8 float8[], b bool[], t text[],
  vc varchar(5)[], ch char(3)[], by bytea, d date[], ts timestamp[], tz timestamptz[], u uuid[], j json[], jb jsonb[], tm time[],
  iv interval[], e dec_mood[], n numeric(10,2)[], bp bpchar, nb numeric(50,2), ns numeric(5,-2), nm name, dd dec_day, dc dec_chars, di dec_ints, c1 "char")"""
ARRAY_ROWS = [
    "(1, '{1,NULL,-32768,32767}', '{-2147483648,2147483647}', '{-9223372036854775808,9223372036854775807}', '{NaN,-0,Infinity,-Infinity,1.4e-45}', "
    "'{4.9e-324,NULL,-0}', '{t,f,NULL}', '{\"a b\",NULL,\"é🦆\",\"\",\"{x}\",\"NULL\"}', '{αβγδε,\"\"}', '{\"a\",\"ab \",NULL,\" \t\"}', '\\x00', "
    "'{2020-01-01,\"4713-01-01 BC\",5874897-12-31,NULL}', '{\"2020-01-01 00:00:00\",\"294247-01-09 04:00:54.775806\"}', "
    "'{\"1999-12-31 23:59:59.5-08\",NULL}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', ARRAY['{\"a\":  1}'::json, NULL], "
    "ARRAY['{\"é\": [1, 2.50]}'::jsonb, 'null'], '{00:00:00,24:00:00,23:59:59.999999}', '{\"1 year 2 days\",\"-1 days -00:00:00.000001\",NULL}', "
    "'{sad,happy}', '{1.50,NULL,NaN}', 'ab  ', 123456789012345678901234567890123456789012345678.99, 12300, 'pg_class', '2024-02-29', 'ab', '{1,NULL}', '')",
    "(2, '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '\\x', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', ' ', "
    "-0.01, -99900, '', '4713-01-01 BC', ' ', '{}', 'x')",
    "(3" + ", NULL" * 28 + ")",
]


@pytest.fixture(scope="module")
def arrays(matrix):
    pg_exec(matrix, "DROP TABLE IF EXISTS dec_arrays_all", "DROP DOMAIN IF EXISTS dec_day, dec_chars, dec_ints", "CREATE DOMAIN dec_day AS date",
            "CREATE DOMAIN dec_chars AS char(4)", "CREATE DOMAIN dec_ints AS int4[]",
            ARRAYS, f"INSERT INTO dec_arrays_all VALUES {', '.join(ARRAY_ROWS)}")
    return matrix


def test_arrays_wide_numerics_and_loose_bpchar_take_their_own_routes_and_decode_as_adbc_does(arrays) -> None:
    """Per column, not per table: on the main this started from, one array, numeric(50,2) or bpchar column sent the
    whole table to ADBC's reader. Now arrays of each type go through DuckDB (char(n) items padded back, DuckDB's
    infinities mapped), numeric(50,2) as its text cast to decimal256 by Arrow, a bpchar of no length through its
    output function; every column equals ADBC's, and the plan says each column's route."""
    src = PostgresSource(PostgresSourceConfig(port=arrays.port, table="dec_arrays_all"), JobOptions())
    reader = src.describe().reader
    assert src.decoder == "duckdb", reader
    assert "DuckDB: id, i2, i4, i8, f4, f8, b, t, vc, by, d, ts, tz, u, j, jb, tm, iv, dd, di;" in reader
    assert "DuckDB, padded back to 3 characters by Arrow: ch;" in reader and "padded back to 4 characters by Arrow: dc" in reader and "its text, cast to decimal256(50, 2) by Arrow: nb" in reader
    assert "its text form (spaces kept): bp" in reader and "its text form: e, n, ns, nm, c1" in reader
    duck, adbc = _read(arrays, "dec_arrays_all", "duckdb"), _read(arrays, "dec_arrays_all", "adbc")
    assert duck.schema == adbc.schema and duck.num_rows == adbc.num_rows == len(ARRAY_ROWS)
    for name in adbc.column_names:
        assert _values(duck, name) == _values(adbc, name), name
    row = duck.select(["ch", "bp", "nb", "i2", "t", "b", "dc", "c1"]).to_pydict()  # and they are PostgreSQL's values
    assert row["ch"][0] == ["a  ", "ab ", None, " \t "] and row["bp"] == ["ab  ", " ", None] and row["dc"] == ["ab  ", "    ", None]
    assert row["c1"] == ["", "x", None]  # the one-byte "char": '' (stored as a NUL byte, which no text target takes), as PostgreSQL prints it
    assert str(row["nb"][0]) == "123456789012345678901234567890123456789012345678.99" and row["i2"][1] == []
    assert row["t"][0] == ["a b", None, "é🦆", "", "{x}", "NULL"] and row["b"][0] == [True, False, None]


@pytest.mark.parametrize("policy", ["error", "null", "clamp"])
def test_infinity_in_an_array_follows_the_policy_on_both_decoders(arrays, policy: str) -> None:
    """On the main this started from, ADBC's reader gave an infinity inside a date[] as a date 5.9 million
    years BC, with exit 0 (its wrapped encoding: only plain columns were checked)."""
    pg_exec(arrays, "DROP TABLE IF EXISTS dec_arrays_inf", "CREATE TABLE dec_arrays_inf (id int, d date[], ts timestamptz[])",
            "INSERT INTO dec_arrays_inf VALUES (1, '{2020-01-01,infinity,NULL}', '{-infinity}'), (2, NULL, '{}')")
    kw = {} if policy == "error" else {"special_values": policy}
    outcomes = []
    for decoder in ("duckdb", "adbc"):
        try:
            outcomes.append(_read(arrays, "dec_arrays_inf", decoder, **kw))
        except TransferError as exc:
            outcomes.append(str(exc))
    duck, adbc = outcomes
    if policy == "error":
        assert isinstance(duck, str) and duck == adbc and "column d (date[]) holds infinity" in duck
        return
    assert all(_values(duck, n) == _values(adbc, n) for n in adbc.column_names)
    days = _values(duck, "d")[0][:2]
    assert days == ([18262, None] if policy == "null" else [18262, 2145042905])  # NULL, or 5874897-12-31


def test_a_bytea_array_is_read_by_adbc_and_said_so(pg_source) -> None:
    """DuckDB's extension reads a bytea[] as its text form: that table stays with ADBC's reader, and the plan names the column."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_bytea_arr", "CREATE TABLE dec_bytea_arr (id int, ba bytea[])",
            "INSERT INTO dec_bytea_arr VALUES (1, '{\"\\\\x00ff\",NULL}')")
    src = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_bytea_arr"), JobOptions())
    assert "column ba, bytea[]" in src.describe().reader and src.decoder == "adbc"
    assert _read(pg_source, "dec_bytea_arr", "adbc")["ba"].to_pylist() == [[b"\x00\xff", None]]


def test_a_duckdb_read_sees_the_jobs_snapshot_not_later_rows(pg_source) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_snap", "CREATE TABLE dec_snap AS SELECT g AS id FROM generate_series(1, 1000) g")
    src = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_snap", decoder="duckdb"), JobOptions())
    src.describe()
    with src.session() as shipped:
        pg_exec(pg_source, "INSERT INTO dec_snap SELECT g FROM generate_series(1001, 1500) g", "DELETE FROM dec_snap WHERE id <= 10")
        got = sorted(v for b in shipped.read(WholeSource(0, 1)) for v in b.column("id").to_pylist())
    assert got == list(range(1, 1001))
    # the process keeps its DuckDB (and its pooled server connections): a second job reads its own, later snapshot
    with src.session() as later:
        pg_exec(pg_source, "DELETE FROM dec_snap WHERE id > 1400")
        again = sorted(v for b in later.read(WholeSource(0, 1)) for v in b.column("id").to_pylist())
        with src.session() as latest:
            last = sorted(v for b in latest.read(WholeSource(0, 1)) for v in b.column("id").to_pylist())
        again_too = sorted(v for b in later.read(WholeSource(0, 1)) for v in b.column("id").to_pylist())
    assert again == again_too == list(range(11, 1501)) and last == list(range(11, 1401))


def test_auto_takes_adbc_for_a_type_duckdb_does_not_decode_exactly_and_duckdb_refuses_it_by_name(pg_source) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_unfit", "CREATE TABLE dec_unfit (id int, ba bytea[])",
            "DROP TABLE IF EXISTS dec_char", "CREATE TABLE dec_char (id int, ch char(5))")
    auto = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_unfit"), JobOptions())
    info = auto.describe()
    assert auto.decoder == "adbc" and "column ba, bytea[]" in info.reader
    with pytest.raises(SchemaError, match=r"column ba \(bytea\[\]\)"):
        PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_unfit", decoder="duckdb"), JobOptions()).describe()
    # DuckDB trims the trailing spaces PostgreSQL keeps: in char(n) they are padding to n characters, which Arrow restores
    padded = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_char"), JobOptions())
    assert padded.describe().reader.endswith("columns by route: DuckDB: id; DuckDB, padded back to 5 characters by Arrow: ch")
    assert padded.decoder == "duckdb"
    fine = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_matrix"), JobOptions())
    assert "DuckDB" in fine.describe().reader and fine.decoder == "duckdb"


def test_decoder_duckdb_without_the_extension_is_one_clear_error(pg_source, monkeypatch) -> None:
    monkeypatch.setattr(duckdecode, "unavailable", lambda: "the Python package duckdb-extension-postgres is not installed")
    with pytest.raises(ConfigError, match="does not load: the Python package duckdb-extension-postgres is not installed"):
        PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_matrix", decoder="duckdb"), JobOptions()).describe()
    auto = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_matrix"), JobOptions())
    assert "does not load" in auto.describe().reader and auto.decoder == "adbc"


def test_a_failing_duckdb_read_names_the_partition_and_never_the_password(pg_source, tmp_path) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_fail", "CREATE TABLE dec_fail AS SELECT g AS id, 1.0 / (g - 7) AS q FROM generate_series(1, 5) g")
    with pytest.raises(TransferError) as err:
        job({"type": "postgres", "port": pg_source.port, "query": "SELECT id, 1 / (id - 3) AS boom FROM dec_fail", "decoder": "duckdb"},
            {"type": "parquet", "path": str(tmp_path / "out")}, load_mode="replace")
    assert "division by zero" in str(err.value) and PG_PASSWORD not in str(err.value)


@pytest.mark.parametrize("decoder", ["duckdb", "adbc"])
def test_nan_in_a_numeric_column_is_refused_by_its_name_on_both_decoders(matrix, decoder: str) -> None:
    """DuckDB alone reads numeric NaN as 0.00: the server flags it, and the job refuses the column by name."""
    pg_exec(matrix, "DROP TABLE IF EXISTS dec_nan", "CREATE TABLE dec_nan (LIKE dec_matrix)",
            f"INSERT INTO dec_nan VALUES {', '.join(ROWS)}", "UPDATE dec_nan SET n2 = 'NaN' WHERE id = 3")
    with pytest.raises(TransferError, match=r"postgres column n2 \(numeric\(15,2\)\): a value does not fit decimal128\(15, 2\)"):
        _read(matrix, "dec_nan", decoder)


def _duck_sql(server, table: str, monkeypatch, **kw) -> tuple[pa.Table, str]:
    """The table read through DuckDB's decoder, and the SQL DuckDB was asked to run for it."""
    seen = []
    real = duckdecode.batches

    def batches(con, sql, batch_size):
        seen.append(sql)
        return real(con, sql, batch_size)

    monkeypatch.setattr(duckdecode, "batches", batches)
    out = _read(server, table, "duckdb", **kw)
    assert len(seen) == 1
    return out, seen[0]


def test_the_nan_check_makes_postgres_compute_no_column(matrix, monkeypatch) -> None:
    """DuckDB reads numeric NaN as 0, so the server checks each numeric value; on main it did so in a
    computed column (an int8 of flags), which makes PostgreSQL project every row before COPY sends
    it: +1.1-2.2 s of the source's CPU on lineitem (SF1), against 5.7-6.4 s for a plain COPY. The check is a
    filter now: the scan hands COPY the table's columns (EXPLAIN VERBOSE: its output is the columns,
    nothing computed but the ones read as text), and the values are still read exactly."""
    import psycopg

    duck, sql = _duck_sql(matrix, "dec_matrix", monkeypatch)
    assert _values(duck, "n2") == _values(_read(matrix, "dec_matrix", "adbc"), "n2")
    with psycopg.connect(host="127.0.0.1", port=matrix.port, user="postgres", dbname="postgres", password=PG_PASSWORD) as con:
        plan = con.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {sql}").fetchone()[0][0]["Plan"]
        columns = [r[0] for r in con.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'dec_matrix'::regclass "
                                             "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")]
    computed = [o for o in plan["Output"] if o.rsplit(".", 1)[-1] not in columns and not o.endswith("::text")]
    assert not computed, f"the server computes {computed} for every row: {sql}"
    assert "NaN" in sql and plan["Node Type"] == "Seq Scan"
    # and no text is cast to int for a row that holds no NaN (on main the whole CASE was text, cast for every row:
    # 0.09 of the check's ~0.6 CPU-s on lineitem): the filter's ELSE is the integer 0
    assert "ELSE 0 END" in plan["Filter"], plan["Filter"]


def test_the_nan_check_is_planned_as_keeping_every_row(matrix, monkeypatch) -> None:
    """The check keeps every row but one it refuses, and the planner must think so too: on main it was
    ``(CASE ...)::int IS NULL``, which PostgreSQL estimates to keep 0.5% of the rows, so a whole table's
    read (strategy=none, or one ctid partition; verify=none, where the read may use parallel workers)
    was planned as a Gather over a Parallel Seq Scan with JIT, where the plain query is a Seq Scan
    (lineitem SF1: 30,005 rows estimated of 6,001,215)."""
    import psycopg

    pg_exec(matrix, "DROP TABLE IF EXISTS dec_estimate",
            "CREATE TABLE dec_estimate (id int, n numeric(15,2), m numeric(15,2), t text)",
            "INSERT INTO dec_estimate SELECT g, g / 100.0, g % 7, 'x' FROM generate_series(1, 20000) g",
            "ANALYZE dec_estimate")
    _, sql = _duck_sql(matrix, "dec_estimate", monkeypatch)
    assert "NaN" in sql
    with psycopg.connect(host="127.0.0.1", port=matrix.port, user="postgres", dbname="postgres", password=PG_PASSWORD) as con:
        for setting in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0.001", "min_parallel_table_scan_size = 0"):
            con.execute(f"SET {setting}")  # parallel plans as cheap as a table this small needs to be offered one
        plan = con.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()[0][0]["Plan"]
        plain = con.execute("EXPLAIN (FORMAT JSON) SELECT * FROM dec_estimate").fetchone()[0][0]["Plan"]
    assert plan["Plan Rows"] >= 0.9 * 20000, f"the planner expects {plan['Plan Rows']} of 20,000 rows: {sql}"
    assert plan["Node Type"] == plain["Node Type"], (plan["Node Type"], plain["Node Type"], sql)


def test_a_nan_in_rows_the_job_does_not_read_is_no_error(matrix, monkeypatch) -> None:
    """The check sees only the rows the job reads: a query that filters the NaN row out, or an
    incremental window that does not reach it, reads the rest (whatever order the planner gives the
    conditions: a query's are fenced off, the window guards the check); inside the window it is refused."""
    from conveyor.core import CursorWindow

    pg_exec(matrix, "DROP TABLE IF EXISTS dec_nan_old", "CREATE TABLE dec_nan_old (LIKE dec_matrix)",
            f"INSERT INTO dec_nan_old VALUES {', '.join(ROWS)}", "UPDATE dec_nan_old SET n2 = 'NaN' WHERE id = 1")
    for decoder in ("duckdb", "adbc"):
        src = PostgresSource(PostgresSourceConfig(port=matrix.port, query="SELECT * FROM dec_nan_old WHERE n2 <> 'NaN' OR n2 IS NULL",
                                                  decoder=decoder), JobOptions(batch_size=2))
        src.describe()
        with src.session() as shipped:
            assert sorted(r for b in shipped.read(WholeSource(0, 1)) for r in b.column("id").to_pylist()) == [2, 3, 4], decoder
    src = PostgresSource(PostgresSourceConfig(port=matrix.port, table="dec_nan_old", decoder="duckdb"), JobOptions(batch_size=2))
    src.describe()
    seen = []
    real = duckdecode.batches
    monkeypatch.setattr(duckdecode, "batches", lambda con, sql, size: seen.append(sql) or real(con, sql, size))
    with src.session() as shipped:
        newer = shipped.windowed(CursorWindow("id", low=1, high=4))
        assert sorted(r for b in newer.read(WholeSource(0, 1)) for r in b.column("id").to_pylist()) == [2, 3, 4]
        with pytest.raises(TransferError, match=r"postgres column n2 \(numeric\(15,2\)\).*: NaN"):
            list(shipped.windowed(CursorWindow("id", low=None, high=4)).read(WholeSource(0, 1)))
    # and the window costs no projection either: the table's scan, its output the columns (a fence, as the
    # query above needs, would make the server project every row again)
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=matrix.port, user="postgres", dbname="postgres", password=PG_PASSWORD) as con:
        plan = con.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {seen[0]}").fetchone()[0][0]["Plan"]
    assert plan["Node Type"] == "Seq Scan", (plan["Node Type"], seen[0])
    assert not [o for o in plan["Output"] if "NaN" in o or "_conveyor" in o], plan["Output"]


def test_a_table_of_many_numeric_columns_is_decoded_by_duckdb_and_its_nan_refused_by_name(matrix) -> None:
    """The NaN flags were bits of one bigint, so a table of more than 63 numeric columns fell back to
    ADBC's reader (3x the client CPU) on main; the filter has no such bound."""
    cols = ", ".join(f"n{i} numeric(10,2)" for i in range(70))
    pg_exec(matrix, "DROP TABLE IF EXISTS dec_wide", f"CREATE TABLE dec_wide (id int, {cols})",
            f"INSERT INTO dec_wide SELECT g, {', '.join(f'g + {i}.25' for i in range(70))} FROM generate_series(1, 5) g")
    wide = _read(matrix, "dec_wide", "duckdb")
    assert wide.num_rows == 5 and str(wide["n69"][0].as_py()) == "70.25"
    src = PostgresSource(PostgresSourceConfig(port=matrix.port, table="dec_wide"), JobOptions(batch_size=2))
    src.describe()
    assert src.decoder == "duckdb"  # auto: DuckDB where it decodes every column exactly
    pg_exec(matrix, "UPDATE dec_wide SET n69 = 'NaN' WHERE id = 4")
    with pytest.raises(TransferError, match=r"postgres column n69 \(numeric\(10,2\)\): a value does not fit decimal128\(10, 2\): NaN"):
        _read(matrix, "dec_wide", "duckdb")


def test_partitions_that_start_together_share_one_duckdb(matrix, monkeypatch) -> None:
    """A process's DuckDB for a server (the extension's LOAD, the ATTACH: ~0.2 CPU-s) is made once: the
    partitions a job starts at once wait for the first one's. On main each made its own, and all but one
    were closed again (seen in every pg -> Parquet job's first two partitions)."""
    import threading
    import time

    import duckdb

    assert duckdecode.unavailable() is None  # the extension installed before counting
    made: list[int] = []
    real = duckdb.connect

    def counted(*args, **kw):
        made.append(1)
        time.sleep(0.3)  # the other partition asks meanwhile
        return real(*args, **kw)

    monkeypatch.setattr(duckdb, "connect", counted)
    # a connect_timeout no other test uses: a DuckDB of its own (the process keeps one per server and settings)
    src = PostgresSource(PostgresSourceConfig(port=matrix.port, table="dec_matrix", decoder="duckdb", connect_timeout=23),
                         JobOptions(batch_size=2))
    src.describe()
    start, rows, errors = threading.Barrier(2), [], []
    with src.session() as shipped:

        def read() -> None:
            try:
                start.wait(timeout=30)
                rows.append(sum(b.num_rows for b in shipped.read(WholeSource(0, 1))))
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not errors and rows == [4, 4]
    assert len(made) == 1


def test_the_one_pass_range_check_sends_every_special_date_and_timestamp_to_the_full_checks() -> None:
    """duckdecode.in_range (one min_max per column and batch) decides whether a batch skips the
    sentinel and Arrow-range checks: it must say no for DuckDB's infinity sentinels and for values
    below Arrow's range, yes for ordinary and all-NULL columns."""
    from conveyor.connectors.postgres.reading import _OUT_OF_RANGE

    low_d, low_ts = _OUT_OF_RANGE["date"][0], _OUT_OF_RANGE["timestamp"][0]
    dates = lambda *v: pa.array(v, pa.int32()).view(pa.date32())  # noqa: E731
    stamps = lambda *v: pa.array(v, pa.int64()).view(pa.timestamp("us"))  # noqa: E731
    assert duckdecode.in_range("date", dates(0, 19000, None, low_d), low_d)
    assert duckdecode.in_range("date", dates(None, None), low_d)
    assert not duckdecode.in_range("date", dates(0, 2**31 - 1), low_d)  # DuckDB's infinity
    assert not duckdecode.in_range("date", dates(-(2**31 - 1), 0), low_d)  # and -infinity
    assert not duckdecode.in_range("date", dates(0, low_d - 1), low_d)  # before 4714-11-24 BC
    assert duckdecode.in_range("timestamp", stamps(0, 2**62, low_ts), low_ts)
    assert not duckdecode.in_range("timestamp", stamps(0, 2**63 - 1), low_ts)
    assert not duckdecode.in_range("timestamptz", stamps(-(2**63 - 1)), low_ts)
    assert not duckdecode.in_range("timestamp", stamps(low_ts - 1, None), low_ts)


@pytest.mark.parametrize("sink", ["parquet", "postgres"])
def test_a_job_read_through_duckdb_makes_its_duckdb_while_it_plans(matrix, pg_target, tmp_path, monkeypatch, sink) -> None:
    """The process's DuckDB (the extension loaded, the server attached: ~0.15 s here) is made in a thread
    of its own as soon as the source is described, where the job will read Arrow batches in this
    process: the partitions find it made instead of each run's first one making it. A job whose sink
    takes the source's native stream (the pass-through) makes none. On the main this started from, the
    first partition made it."""
    import threading

    import duckdb

    assert duckdecode.unavailable() is None  # the extension installed before counting
    makers: list[str] = []
    real = duckdb.connect

    def counted(*args, **kw):
        makers.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(duckdb, "connect", counted)
    # a connect_timeout no other test uses: a DuckDB of its own (the process keeps one per server and settings)
    source = {"type": "postgres", "port": matrix.port, "table": "dec_matrix", "decoder": "duckdb", "connect_timeout": 29}
    if sink == "parquet":  # without the interval, which Parquet has no type for
        pg_exec(matrix, "DROP TABLE IF EXISTS dec_no_interval", "CREATE TABLE dec_no_interval AS SELECT * FROM dec_matrix",
                "ALTER TABLE dec_no_interval DROP COLUMN iv")
        report = job({**source, "table": "dec_no_interval"}, {"type": "parquet", "path": str(tmp_path / "out")}, "ctid",
                     {"partitions": 2}, degree=2)
        assert report.rows == len(ROWS) and report.sink_plan.native is None
        assert makers == ["conveyor-duckdb-warm-up"]
    else:
        pg_exec(pg_target, "DROP TABLE IF EXISTS dec_matrix", "DROP TYPE IF EXISTS dec_mood",
                "CREATE TYPE dec_mood AS ENUM ('sad', 'happy', 'it''s')", MATRIX)
        report = job(source, {"type": "postgres", "port": pg_target.port, "table": "dec_matrix"}, "ctid", {"partitions": 2},
                     degree=2, load_mode="truncate")
        assert report.rows == len(ROWS) and report.sink_plan.native == "pgcopy-binary"
        assert makers == []


def test_an_array_an_arrow_list_cannot_hold_as_it_is_is_refused_by_name(pg_source) -> None:
    """PostgreSQL does not hold an int4[] column to one dimension, nor its indexes to start at 1; ADBC's reader
    flattened {{1,2},{3,4}} into [1, 2, 3, 4] and read [0:1]={7,8} as [7, 8], bounds lost (on the main this
    started from, exit 0). Such a value is refused naming its column; plain arrays, empty ones and NULL read as they are."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_arrays", "CREATE TABLE dec_arrays (id int, a int4[], t text[])",
            "INSERT INTO dec_arrays VALUES (1, '{1,NULL,-2}', '{\"x y\",NULL}'), (2, '{}', '{}'), (3, NULL, NULL)")

    def read() -> pa.Table:
        src = PostgresSource(PostgresSourceConfig(port=pg_source.port, table="dec_arrays"), JobOptions(batch_size=2))
        src.describe()
        with src.session() as shipped:
            return pa.Table.from_batches(list(shipped.read(WholeSource(0, 1)))).sort_by("id")

    assert read().to_pydict() == {"id": [1, 2, 3], "a": [[1, None, -2], [], None], "t": [["x y", None], [], None]}
    for bad, dims in (("'{{1,2},{3,4}}'", 2), ("'[0:1]={7,8}'", 1)):
        pg_exec(pg_source, "DELETE FROM dec_arrays WHERE id = 4", f"INSERT INTO dec_arrays VALUES (4, {bad}, NULL)")
        with pytest.raises(TransferError, match=rf"postgres column a \(integer\[\]\) holds an array of {dims} dimension") as caught:
            read()
        assert "a::text" in caught.value.hint


def test_conveyor_plan_says_each_columns_route(arrays, cli, tmp_path) -> None:
    """`conveyor plan` prints the route of every column (on the main this started from, the plan did not say how a
    column is decoded, and the job's log said only which decoder read the whole table)."""
    res = cli("plan", "pipeline=postgres_to_parquet", f"source.port={arrays.port}", "source.table=dec_arrays_all",
              f"sink.path={tmp_path / 'out'}")
    assert res.code == 0, res.err
    text = " ".join(res.out.split())  # the plan's caption wraps at the terminal's width
    assert "source: Arrow batches decoded by DuckDB's postgres extension (source.decoder=auto); columns by route:" in text
    assert "DuckDB, padded back to 3 characters by Arrow: ch;" in text and "its text, cast to decimal256(50, 2) by Arrow: nb" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("decoder", ["duckdb", "adbc"])
def test_a_domain_over_an_array_is_held_to_one_dimension_as_its_base_type(pg_source, decoder: str) -> None:
    """A column of a domain over int4[] is read as its base type, dimension check included, on both decoders."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_dom_arr", "DROP DOMAIN IF EXISTS dec_dom_ints", "CREATE DOMAIN dec_dom_ints AS int4[]",
            "CREATE TABLE dec_dom_arr (id int, a dec_dom_ints)", "INSERT INTO dec_dom_arr VALUES (1, '{1,2}'), (2, '{{1,2},{3,4}}')")
    with pytest.raises(TransferError, match=r"postgres column a \(integer\[\]\) holds an array of 2 dimension"):
        _read(pg_source, "dec_dom_arr", decoder)
    pg_exec(pg_source, "DELETE FROM dec_dom_arr WHERE id = 2")
    assert _read(pg_source, "dec_dom_arr", decoder)["a"].to_pylist() == [[1, 2]]


@pytest.mark.parametrize("decoder", ["duckdb", "adbc"])
def test_an_oid_above_two_to_the_31_is_read_as_it_is(pg_source, decoder: str) -> None:
    """oid is unsigned 32 bits: ADBC's reader gave 4294967295 as the int32 -1 (on the main this started from, exit 0,
    and every table with an oid column went to that reader). Read as int8 on both decoders, arrays too."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS dec_oid", "CREATE TABLE dec_oid (id int, o oid, oa oid[])",
            "INSERT INTO dec_oid VALUES (1, 4294967295, '{4294967295,0,NULL}'), (2, 0, '{}'), (3, NULL, NULL)")
    got = _read(pg_source, "dec_oid", decoder)
    assert got.schema.field("o").type == pa.int64()
    assert got["o"].to_pylist() == [4294967295, 0, None] and got["oa"].to_pylist() == [[4294967295, 0, None], [], None]


@pytest.mark.pg_versions("15")  # the subject is the process's exit, not the server's version
def test_a_process_that_ends_while_duckdb_warms_up_exits_with_its_own_code(pg_source, tmp_path) -> None:
    """A job refused while it plans (strategy=ctid of a query) returns while DuckDB's warm-up thread is still loading the
    extension; a caller's process that then exits (``sys.exit(main(...))``, a script around ``conveyor.run``) exited 134
    ("terminate called without an active exception": a daemon thread left inside DuckDB's C++ as the interpreter
    finalised). It exits with the job's code, every time."""
    import subprocess
    import sys

    script = tmp_path / "refused.py"
    script.write_text(
        "import sys\nfrom conveyor.cli import main\n"
        f"sys.exit(main(['run', 'source=postgres', 'source.port={pg_source.port}', 'source.query=select 1 AS a', 'strategy=ctid', "
        f"'sink=parquet', 'sink.path={tmp_path / 'out'}', 'runtime=local', 'hydra.run.dir={tmp_path / 'run'}']))\n")
    env = {**os.environ, "PGPASSWORD": PG_PASSWORD}
    for _ in range(3):  # it aborted every time on this machine before; a race, so tried more than once
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert "strategy=ctid needs a table" in done.stderr
        assert done.returncode == 2, done.stderr[-2000:]
        assert "terminate called" not in done.stderr
