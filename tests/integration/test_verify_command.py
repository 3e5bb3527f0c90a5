"""`conveyor verify`: a target compared with its source after the fact, any pair of engines, by key and a
checksum computed the same way on both sides (DuckDB's hash over canonical Arrow values). On the main this
started from there was no such command (a content checksum only inside a PostgreSQL -> PostgreSQL run).

Each pair is copied by a real job, verified equal (exit 0), then broken on one side (a changed value, a
deleted row, an extra row, a NULL for an empty string) and verified again: exit 6 and the keys named. Real
servers and files: the PostgreSQL test servers, MariaDB, DuckDB files, Parquet folders."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import conveyor
from conveyor.errors import SchemaError, VerificationError
from conveyor.pipelines.compare import compare
from tests.helpers import pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")

ROWS = ("SELECT g AS id, 'v' || g AS v, CASE WHEN g % 10 = 0 THEN '' END AS e, (g / 4.0)::numeric(12,2) AS n, (g * 0.5)::float8 AS f, "
        "date '2020-01-01' + g AS d, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' AS ts FROM generate_series(1, 4000) g")


def _verify(*overrides: str, **config):
    """conveyor verify's comparison (what the command prints), from Python."""
    from conveyor.api import compose
    from conveyor.config import build_job

    cfg = compose(None, "strategy=auto", *overrides, **config)
    return compare(build_job(cfg), max_keys=10, zero=str(cfg.get("verify_zero", "distinct")))


@pytest.fixture
def vsrc(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_src", f"CREATE TABLE v_src AS {ROWS}", "ALTER TABLE v_src ADD PRIMARY KEY (id)")
    return {"type": "postgres", "port": pg_source.port, "table": "v_src"}


def _broken_keys(result) -> dict:
    return {k[0]: what for k, what in result.keys}


def test_postgres_and_parquet(vsrc, pg_source, tmp_path: Path, cli) -> None:
    out = tmp_path / "out"
    conveyor.run(None, "source=postgres", "sink=parquet", source=vsrc, sink={"path": str(out)}, load_mode="create",
                 strategy={"type": "ctid", "partitions": 3})
    args = ["verify", "source=postgres", f"source.port={pg_source.port}", "source.table=v_src", "sink=parquet", f"sink.path={out}",
            "strategy=ctid", "degree=2"]
    res = cli(*args)
    assert res.code == 0, res.err
    assert "equal: 4,000 rows, 7 columns compared by key (id)" in res.out
    pg_exec(pg_source, "UPDATE v_src SET v = 'changed' WHERE id = 77", "DELETE FROM v_src WHERE id = 5",
            "INSERT INTO v_src (id, v) VALUES (9000, 'new')", "UPDATE v_src SET e = NULL WHERE id = 10")  # '' -> NULL
    res = cli(*args)
    assert res.code == 6 and "the target differs from the source" in res.err
    for line in ("key 5: not in the source", "key 10: values differ", "key 77: values differ", "key 9000: missing from the target"):
        assert line in res.out, res.out


def test_postgres_and_duckdb_with_the_zero_and_nan_choices(vsrc, pg_source, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    pg_exec(pg_source, "UPDATE v_src SET f = 'NaN' WHERE id = 1")
    conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=auto", source=vsrc, sink={"database": str(db), "table": "t"},
                 load_mode="create")
    over = ("source=postgres", "sink=duckdb", f"source.port={pg_source.port}", "source.table=v_src", f"sink.database={db}", "sink.table=t")
    assert _verify(*over).equal  # NaN equals NaN
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE t SET f = -0.0 WHERE id = 2")  # 1.0 in the source: a changed value
        con.execute("UPDATE t SET f = 1.0 WHERE id = 2")
        con.execute("UPDATE t SET f = 0.0 WHERE id = 3")
    pg_exec(pg_source, "UPDATE v_src SET f = '-0' WHERE id = 3")
    assert _broken_keys(_verify(*over)) == {3: "values differ"}  # -0.0 and 0.0 differ by default: the sign was lost
    assert _verify(*over, "verify_zero=equal").equal
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM t WHERE id = 4000")
    result = _verify(*over, "verify_zero=equal")
    assert not result.equal and result.target.rows == 3999 and _broken_keys(result) == {4000: "missing from the target"}


def test_postgres_mysql_and_mysql_parquet(vsrc, pg_source, mysql_server, tmp_path: Path) -> None:
    my = {"type": "mysql", "port": mysql_server.port, "user": mysql_server.user, "database": mysql_server.database}
    mysql_server.execute("DROP TABLE IF EXISTS v_my")
    conveyor.run(None, "source=postgres", "sink=mysql", "strategy=auto", source=vsrc, sink={**my, "table": "v_my"}, load_mode="create")
    assert mysql_server.execute("SELECT column_name FROM information_schema.key_column_usage WHERE table_schema = DATABASE() "
                                "AND table_name = 'v_my' AND constraint_name = 'PRIMARY'") == [("id",)]  # the source's key, carried
    pg_my = ("source=postgres", "sink=mysql", f"source.port={pg_source.port}", "source.table=v_src", f"sink.port={mysql_server.port}",
             f"sink.user={mysql_server.user}", f"sink.database={mysql_server.database}", "sink.table=v_my")
    assert _verify(*pg_my).equal
    out = tmp_path / "from_mysql"
    conveyor.run(None, "source=mysql", "sink=parquet", "strategy=auto", source={**my, "table": "v_my"}, sink={"path": str(out)},
                 load_mode="create")
    my_pq = ("source=mysql", "sink=parquet", f"source.port={mysql_server.port}", f"source.user={mysql_server.user}",
             f"source.database={mysql_server.database}", "source.table=v_my", f"sink.path={out}")
    assert _verify(*my_pq).equal
    mysql_server.execute("UPDATE v_my SET n = n + 0.01 WHERE id = 123")
    assert _broken_keys(_verify(*pg_my)) == {123: "values differ"} and _broken_keys(_verify(*my_pq)) == {123: "values differ"}


def test_columns_that_cannot_be_compared_or_are_on_one_side_are_named(vsrc, pg_source, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(1, 4001), pa.int64()), "v": pa.array(range(4000), pa.int64())}), out / "a.parquet")
    with pytest.raises(SchemaError, match="column v cannot be compared: string on the source, int64 on the target"):
        _verify("source=postgres", "sink=parquet", f"source.port={pg_source.port}", "source.table=v_src", f"sink.path={out}")
    pq.write_table(pa.table({"id": pa.array(range(1, 4001), pa.int64())}), out / "a.parquet")
    result = _verify("source=postgres", "sink=parquet", f"source.port={pg_source.port}", "source.table=v_src", f"sink.path={out}")
    assert not result.equal and result.unmatched[0] == "source only: v"
    from rich.console import Console

    from conveyor.api import compose
    from conveyor.pipelines.compare import verify_job

    with pytest.raises(VerificationError, match="columns on one side only: source only: v"):
        verify_job(compose(None, "strategy=auto", "source=postgres", "sink=parquet", f"source.port={pg_source.port}", "source.table=v_src",
                           f"sink.path={out}"), Console(file=open("/dev/null", "w")))


def test_verify_checksum_in_a_run_compares_what_a_staged_load_wrote_for_any_pair(vsrc, pg_source, tmp_path: Path) -> None:
    """verify=checksum in conveyor run (on the main this started from, refused for every pair but PostgreSQL on both
    sides): a staged load into DuckDB or Parquet is compared row for row with the source, in the job's snapshot,
    before it is made visible; an append across engines is refused by name before anything moves."""
    from conveyor.errors import ConfigError

    db = tmp_path / "t.duckdb"
    report = conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=ctid", "verify=checksum", source=vsrc,
                          sink={"database": str(db), "table": "t"}, load_mode="create", degree=2)
    assert report.verification.ok and report.verification.source_checksum == report.verification.target_checksum
    assert report.verification.source_checksum.startswith("4000:")
    assert any("conveyor verify's comparison, by key (id)" in n for n in report.verification.notes)
    out = tmp_path / "pq"
    report = conveyor.run(None, "source=postgres", "sink=parquet", "strategy=ctid", "verify=checksum", source=vsrc,
                          sink={"path": str(out)}, load_mode="create", degree=2)
    assert report.verification.ok and report.rows == 4000
    with pytest.raises(ConfigError, match="verify=checksum: this pair computes no checksum alike"):
        conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=ctid", "verify=checksum", source=vsrc,
                     sink={"database": str(db), "table": "t"}, load_mode="append")


def test_verify_checksum_in_a_run_catches_values_that_changed_and_keeps_the_target_out(pg_source, tmp_path: Path) -> None:
    """A source whose rows come back with other values on a second read (a view over random(): the same count every
    time): verify=count passes, verify=checksum across engines fails the run (exit 6), and the DuckDB
    table the create would have made does not exist."""
    pg_exec(pg_source, "DROP VIEW IF EXISTS v_flaky", "DROP TABLE IF EXISTS v_base", "CREATE TABLE v_base AS SELECT g AS id FROM generate_series(1, 3000) g",
            "CREATE VIEW v_flaky AS SELECT id, random() AS r FROM v_base")
    src = {"type": "postgres", "port": pg_source.port, "table": "v_flaky", "snapshot": False}
    db = tmp_path / "t.duckdb"
    assert conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=none", source=src, sink={"database": str(db), "table": "ok"},
                        load_mode="create").verification.ok
    with pytest.raises(VerificationError, match="checksum: source 3000:") as caught:
        conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=none", "verify=checksum", source=src,
                     sink={"database": str(db), "table": "t"}, load_mode="create")
    assert ", target 3000:" in str(caught.value) and caught.value.exit_code == 6  # the same rows, other values (a view: no key to name)
    with duckdb.connect(str(db), read_only=True) as con:
        assert [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall() if not r[0].startswith("_conveyor")] == ["ok"]


TORTURE = """CREATE TABLE v_types (id int PRIMARY KEY, i2 int2, i8 int8, f4 float4, f8 float8, b bool, t text, vc varchar(5), ch char(3),
  by bytea, d date, ts timestamp, tz timestamptz, n numeric(12,2), nb numeric(50,2), nu numeric, u uuid, j json, jb jsonb, tm time,
  e v_mood, ip inet, ia int4[], ta text[])"""
TORTURE_ROWS = """INSERT INTO v_types SELECT g, (g % 30000)::int2, g * 1000000000::int8, g / 3.0, g / 7.0, g % 2 = 0, 'é🦆' || g,
  left('v' || g, 5), left(g::text, 3), decode(md5(g::text), 'hex'), date '2000-01-01' + g, timestamp '2000-01-01' + g * interval '1 minute',
  timestamptz '2000-01-01 00:00+00' + g * interval '1 second', g / 4.0, g * 1.01, g / 3.0, md5(g::text)::uuid, json_build_object('g', g),
  jsonb_build_object('g', g), time '00:00' + g * interval '1 second', (ARRAY['sad','happy'])[1 + g % 2]::v_mood,
  ('10.0.' || (g % 250) || '.1')::inet, ARRAY[g, -g], ARRAY['a' || g, NULL] FROM generate_series(1, 2000) g"""


def test_the_types_of_every_engine_are_equal_after_a_copy(pg_source, mysql_server, tmp_path: Path) -> None:
    """A table of every kind of PostgreSQL type (NULLs in a row of its own) copied into Parquet, DuckDB and MySQL, then
    verified equal value for value: on the main this started from, a bool column could not be loaded into DuckDB at
    all (its target read back as arrow.bool8, refused as a change of meaning), and a uuid read back from DuckDB (text)
    could not be compared. What a target cannot hold is refused by name (numeric(50,2) in DuckDB; arrays in MySQL:
    left out with the job's `columns`)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_types", "DROP TYPE IF EXISTS v_mood", "CREATE TYPE v_mood AS ENUM ('sad', 'happy')",
            TORTURE, TORTURE_ROWS, "INSERT INTO v_types (id) VALUES (0)")
    src = {"type": "postgres", "port": pg_source.port, "table": "v_types"}
    all_but_wide = ["id", "i2", "i8", "f4", "f8", "b", "t", "vc", "ch", "by", "d", "ts", "tz", "n", "nu", "u", "j", "jb", "tm", "e", "ip",
                    "ia", "ta"]
    my = {"type": "mysql", "port": mysql_server.port, "user": mysql_server.user, "database": mysql_server.database, "table": "v_types"}
    mysql_server.execute("DROP TABLE IF EXISTS v_types")
    targets = [("parquet", {"path": str(tmp_path / "p")}, {}),
               ("duckdb", {"database": str(tmp_path / "d.duckdb"), "table": "v_types"}, {"columns": all_but_wide}),
               ("mysql", my, {"columns": [c for c in all_but_wide if c not in ("ia", "ta")]})]
    for name, sink, job_keys in targets:
        conveyor.run(None, "source=postgres", f"sink={name}", "strategy=ctid", source=src, sink=sink, load_mode="create", **job_keys)
        result = _verify("source=postgres", f"sink={name}", source=src, sink=sink, **job_keys)
        assert result.equal and result.source.rows == result.target.rows == 2001, (name, result.keys, result.unmatched)
    with pytest.raises(SchemaError, match=r"column nb \(decimal256\(50, 2\)\) has more digits than DuckDB's DECIMAL holds"):
        conveyor.run(None, "source=postgres", "sink=duckdb", "strategy=ctid", source=src,
                     sink={"database": str(tmp_path / "w.duckdb"), "table": "w"}, load_mode="create")


def test_a_time_read_back_as_text_and_bytes_kept_in_a_string_column_are_compared(pg_source, mysql_server, clickhouse_server) -> None:
    """PostgreSQL time -> MySQL TIME (read back as text: it spans +/-838 hours) and bytea -> ClickHouse String were copied
    exactly and then refused by verify ("time64[us] on the source, string on the target"; "binary on the source, string on
    the target"). Both are compared now, and a changed value is still found by its key."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_tb", "CREATE TABLE v_tb (id int PRIMARY KEY, tm time, tm0 time(0), by bytea)",
            "INSERT INTO v_tb SELECT g, time '00:00' + g * interval '1.5 second', time '00:00' + g * interval '1 minute', "
            "decode(md5(g::text) || CASE WHEN g % 3 = 0 THEN '00ff' ELSE '' END, 'hex') FROM generate_series(1, 500) g",
            "INSERT INTO v_tb VALUES (0, NULL, NULL, NULL), (501, '23:59:59.999999', '23:59:59', '')")
    src = {"type": "postgres", "port": pg_source.port, "table": "v_tb"}
    my = {"type": "mysql", "port": mysql_server.port, "user": mysql_server.user, "database": mysql_server.database, "table": "v_tb"}
    ch = {"port": clickhouse_server.http_port, "table": "v_tb"}
    mysql_server.execute("DROP TABLE IF EXISTS v_tb")
    for name, sink, columns in (("mysql", my, ["id", "tm", "tm0"]), ("clickhouse", ch, ["id", "by"])):
        conveyor.run(None, "source=postgres", f"sink={name}", "strategy=ctid", source=src, sink=sink, load_mode="create", columns=columns)
        result = _verify("source=postgres", f"sink={name}", source=src, sink=sink, columns=columns)
        assert result.equal and result.source.rows == result.target.rows == 502, (name, result.keys, result.unmatched)
    pg_exec(pg_source, "UPDATE v_tb SET tm = tm + interval '1 microsecond', tm0 = tm0 + interval '1 second' WHERE id = 7",
            "UPDATE v_tb SET by = by || '\\x00'::bytea WHERE id = 9")
    for name, sink, columns, changed in (("mysql", my, ["id", "tm", "tm0"], 7), ("clickhouse", ch, ["id", "by"], 9)):
        result = _verify("source=postgres", f"sink={name}", source=src, sink=sink, columns=columns)
        assert not result.equal and _broken_keys(result) == {changed: "values differ"}, (name, result.keys)


def test_infinity_kept_by_a_copy_is_compared(pg_source, pg_target, tmp_path: Path) -> None:
    """+/-infinity timestamps and dates, which PostgreSQL and DuckDB keep and a copy between them kept, made verify stop
    with the copy's own hint ("set source.special_values=null ... sink.copy_path=passthrough"), which does not apply to
    verify: both sides are read with infinity passed on now, equal, and a changed sign is found by its key."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_inf", "CREATE TABLE v_inf (id int PRIMARY KEY, ts timestamp, tz timestamptz, d date)",
            "INSERT INTO v_inf VALUES (1, 'infinity', '-infinity', 'infinity'), (2, '2020-01-01 10:00', '2020-01-01 10:00+02', '2020-01-01'), "
            "(3, '-infinity', 'infinity', '-infinity'), (4, NULL, NULL, NULL)")
    src = {"type": "postgres", "port": pg_source.port, "table": "v_inf"}
    targets = (("postgres", {"port": pg_target.port, "table": "v_inf"}), ("duckdb", {"database": str(tmp_path / "d.duckdb"), "table": "v_inf"}))
    for name, sink in targets:
        conveyor.run(None, "source=postgres", f"sink={name}", "strategy=ctid", source=src, sink=sink, load_mode="create")
        result = _verify("source=postgres", f"sink={name}", source=src, sink=sink)
        assert result.equal and result.target.rows == 4, (name, result.keys)
    pg_exec(pg_source, "UPDATE v_inf SET d = '-infinity' WHERE id = 1", "UPDATE v_inf SET tz = '-infinity' WHERE id = 3")
    for name, sink in targets:
        result = _verify("source=postgres", f"sink={name}", source=src, sink=sink)
        assert _broken_keys(result) == {1: "values differ", 3: "values differ"}, (name, result.keys)


def test_numeric_nan_and_arrays_of_several_dimensions_are_compared_between_postgresql_servers(pg_source, pg_target) -> None:
    """A PostgreSQL copy keeps numeric NaN and infinity, and arrays of several dimensions (the pass-through carries them);
    Arrow holds neither, and verify said "cannot be compared" of its own exact copies. Between two PostgreSQL servers
    numerics and arrays are now read as both print them (a numeric without trailing zeros: 1.50 in numeric(12,2) is
    1.5000 in numeric(20,4)), and JSON as jsonb prints it (a json copied into jsonb, keys reordered, is equal); a
    changed value is still found by its key."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_nan", "CREATE TABLE v_nan (id int PRIMARY KEY, n numeric(12, 2), u numeric, "
            "m int[], t text[], nn numeric(8, 3)[])",
            "INSERT INTO v_nan SELECT g, CASE WHEN g % 5 = 0 THEN 'NaN' ELSE g / 4.0 END, CASE WHEN g % 7 = 0 THEN 'Infinity' "
            "WHEN g % 7 = 1 THEN 'NaN' ELSE g * 1.000001 END, ARRAY[[g, g + 1], [g + 2, NULL]], ARRAY[['a', 'b'], ['c', g::text]], "
            "ARRAY[g / 3.0, NULL] FROM generate_series(1, 3000) g")
    src = {"type": "postgres", "port": pg_source.port, "table": "v_nan"}
    pg_exec(pg_target, "DROP TABLE IF EXISTS v_nan", "CREATE TABLE v_nan (id int PRIMARY KEY, n numeric(20, 4), u numeric, "
            "m int[], t text[], nn numeric(8, 3)[])")
    sink = {"type": "postgres", "port": pg_target.port, "table": "v_nan"}
    report = conveyor.run(None, "source=postgres", "sink=postgres", "strategy=ctid", source=src, sink=sink, load_mode="truncate")
    assert report.rows == 3000
    result = _verify("source=postgres", "sink=postgres", source=src, sink=sink)
    assert result.equal and result.target.rows == 3000, result.keys
    pg_exec(pg_target, "UPDATE v_nan SET n = 0 WHERE id = 5", "UPDATE v_nan SET m[2][2] = 7 WHERE id = 8",
            "UPDATE v_nan SET u = '-Infinity' WHERE id = 14")
    result = _verify("source=postgres", "sink=postgres", source=src, sink=sink)
    assert _broken_keys(result) == {5: "values differ", 8: "values differ", 14: "values differ"}, result.keys
    # json into jsonb: its keys reordered, its spaces gone, one value of a duplicated key kept: equal as jsonb prints them
    pg_exec(pg_source, "DROP TABLE IF EXISTS v_json", "CREATE TABLE v_json (id int PRIMARY KEY, j json)",
            "INSERT INTO v_json SELECT g, ('{\"zeta\":' || g || ',  \"a\": [1, {\"y\": 2, \"b\": null}], \"a\": 0}')::json "
            "FROM generate_series(1, 2000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS v_json", "CREATE TABLE v_json (id int PRIMARY KEY, j jsonb)")
    src, sink = {**src, "table": "v_json"}, {**sink, "table": "v_json"}
    conveyor.run(None, "source=postgres", "sink=postgres", "strategy=ctid", source=src, sink=sink, load_mode="truncate")
    assert pg_exec(pg_target, "SELECT j::text FROM v_json WHERE id = 1") == [('{"a": 0, "zeta": 1}',)]
    assert _verify("source=postgres", "sink=postgres", source=src, sink=sink).equal
    pg_exec(pg_target, "UPDATE v_json SET j = jsonb_set(j, '{a}', '3') WHERE id = 21")
    assert _broken_keys(_verify("source=postgres", "sink=postgres", source=src, sink=sink)) == {21: "values differ"}
