"""Describing a PostgreSQL source and preparing a PostgreSQL target without an ADBC connection.

The schema read() yields is ADBC's driver's (numeric(p,s) as a decimal), and the Arrow path's cast
plan reads the target's columns as the driver gives them. For built-in types both are known from the
PostgreSQL types alone (conveyor/connectors/postgres/types.py: ``read_arrow_type``, ``adbc_field``),
without the driver's import and connection (~0.1 s of every such job's start here, and one connection
per table of a many-table job). Two tests hold that table to the installed driver, type by type, on
a real server (source side with a session time zone that is not UTC, target side metadata included);
two check in a fresh process that describing a table of built-in types and loading Parquet into one
load no ADBC driver. On the main this started from, both connected through ADBC: those two fail. A
fifth checks that describing does not import DuckDB to learn that its decoder is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
from conveyor.core import JobOptions
from tests.helpers import PG_PASSWORD, REPO, pg_exec

SCALARS = {"int2": "int2", "int4": "int4", "int8": "int8", "oid": "oid", "float4": "float4", "float8": "float8", "bool": "bool",
           "text": "text", "varchar": "varchar(9)", "bpchar": "char(4)", "name": "name", "char": '"char"', "bytea": "bytea",
           "date": "date", "time": "time", "timestamp": "timestamp(3)", "timestamptz": "timestamptz", "interval": "interval",
           "uuid": "uuid", "json": "json", "jsonb": "jsonb"}
# read as text, as decimals, through a domain's base type, or only known to ADBC's driver (numeric(5,-2): the fallback)
OTHERS = {"n_dec": "numeric(18,4)", "n_big": "numeric(60,10)", "n_free": "numeric", "n_neg": "numeric(5,-2)", "n_arr": "numeric[]",
          "en": "d_mood", "en_arr": "d_mood[]", "ip": "inet", "mo": "money", "rng": "int4range", "pt": "point", "bits": "bit(3)",
          "x": "xml", "comp": "d_pair", "dom": "d_pos", "dom_num": "d_cash", "dom_arr": "d_ints", "tz_arr": "timestamptz[]",
          "ts_arr": "timestamp[]", "iv_arr": "interval[]", "u_arr": "uuid[]", "jb_arr": "jsonb[]", "b_arr": "bytea[]"}


def same(a: pa.Field, b: pa.Field) -> bool:
    """Equal to the last byte of Arrow's IPC schema: type, name, nullability and metadata, nested fields' included."""
    return pa.schema([a]).serialize().to_pybytes() == pa.schema([b]).serialize().to_pybytes()


pytestmark = pytest.mark.usefixtures("pg_password")


@pytest.fixture(scope="module")
def typed(pg_source):
    cols = [f"s_{name} {sql}" for name, sql in SCALARS.items()] + [f"a_{name} {sql}[]" for name, sql in SCALARS.items()]
    cols += [f"{name} {sql}" for name, sql in OTHERS.items()]
    pg_exec(pg_source, "DROP TABLE IF EXISTS d_types, d_plain, d_duck", "DROP TYPE IF EXISTS d_mood, d_pair",
            "DROP DOMAIN IF EXISTS d_pos, d_cash, d_ints",
            "CREATE TYPE d_mood AS ENUM ('sad', 'ok')", "CREATE TYPE d_pair AS (a int, b text)",
            "CREATE DOMAIN d_pos AS int4 CHECK (VALUE > 0)", "CREATE DOMAIN d_cash AS numeric(12,2)", "CREATE DOMAIN d_ints AS int4[]",
            f"CREATE TABLE d_types ({', '.join(cols)})",
            "CREATE TABLE d_plain (id int8, n numeric(15,2), t text, d date, tz timestamptz, ip inet, free numeric, m d_mood)",
            "CREATE TABLE d_duck (id int8, n numeric(15,2), t text, d date, tz timestamptz, f float8, b bool)")  # DuckDB decodes each
    return pg_source


def test_the_arrow_types_known_without_the_driver_are_the_drivers(typed, monkeypatch) -> None:
    from conveyor.connectors.postgres.types import _adbc_scalars, read_arrow_type

    monkeypatch.setenv("PGTZ", "Asia/Kolkata")  # libpq's session time zone: ADBC still gives timestamptz as UTC
    # a run id of its own: ADBC's driver reads the server's types once per database object, kept per run id
    src = PostgresSource(PostgresSourceConfig(port=typed.port, table="d_types"), JobOptions(run_id="describe-types"))
    src.describe()
    driver = src._adbc_schema()
    assert src.schema.names == driver.names
    unknown = []
    for col, field in zip(src.columns, driver):
        ours = read_arrow_type(col)
        if ours is None:
            unknown.append(col.name)
        else:
            assert same(pa.field("x", ours), pa.field("x", field.type)), f"{col.name} ({col.type_sql}): {ours}, the driver: {field.type}"
        assert same(src.schema.field(col.name), field)  # the schema describe gives is the driver's, whichever way it was made
    assert set(_adbc_scalars()) <= set(SCALARS)  # every type of the table is compared here
    # left to the driver: types whose Arrow form changed between its versions (uuid, json, oid), arrays of native
    # types (their item fields' metadata changed), numeric(5,-2) (its opaque numeric)
    assert unknown == ["s_uuid", "s_json", "s_jsonb", *[f"a_{name}" for name in SCALARS], "n_neg", "dom_arr", "tz_arr",
                       "ts_arr", "iv_arr", "u_arr", "jb_arr", "b_arr"]


_DESCRIBE = """
import json, sys
from conveyor.connectors.postgres.source import PostgresSource, PostgresSourceConfig
from conveyor.core import JobOptions
src = PostgresSource(PostgresSourceConfig(port=int(sys.argv[1]), table=sys.argv[2]), JobOptions())
info = src.describe()
schema = str(info.schema)  # made where read (a pass-through never reads it): the ADBC driver is loaded then, if it is
print(json.dumps({"adbc": "adbc_driver_manager" in sys.modules, "duckdb": "duckdb" in sys.modules, "decoder": src.decoder,
                  "schema": schema}))
"""


def _describe_alone(server, table: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _DESCRIBE, str(server.port), table], capture_output=True, text=True, cwd=REPO,
                         timeout=60, env={**os.environ, "PGPASSWORD": PG_PASSWORD})
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_describing_a_table_of_built_in_types_loads_no_adbc_driver(typed) -> None:
    plain = _describe_alone(typed, "d_plain")
    assert plain["adbc"] is False, "describe connected through ADBC for types whose Arrow type is known"
    assert "n: decimal128(15, 2)" in plain["schema"] and "ip: string" in plain["schema"] and "free: string" in plain["schema"]
    assert "tz: timestamp[us, tz=UTC]" in plain["schema"]
    # a column only the driver can type: it is asked, as before
    assert _describe_alone(typed, "d_types")["adbc"] is True


def test_describing_picks_duckdbs_decoder_without_importing_duckdb(typed) -> None:
    """Whether DuckDB's postgres extension can decode is known from its installed copy: describe
    (every PostgreSQL job, a pass-through too, which never reads through DuckDB) does not import
    DuckDB for it (0.03 s of every job's start here). On the main this started from it did."""
    from conveyor.kit import duckext

    duckext.extension_dir("postgres")  # installed once per machine and DuckDB version, as a first job would
    described = _describe_alone(typed, "d_duck")
    assert described["decoder"] == "duckdb" and described["duckdb"] is False


def test_the_target_fields_known_without_the_driver_are_the_drivers(typed) -> None:
    """The sink's side: a target column as it is (no text cast), field by field, metadata included."""
    import adbc_driver_postgresql.dbapi as dbapi
    import psycopg

    from conveyor.connectors.postgres.types import adbc_field, read_columns

    with psycopg.connect(typed.dsn()) as con:
        columns = read_columns(con, "SELECT * FROM d_types LIMIT 0")
    with dbapi.connect(typed.dsn()) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM d_types LIMIT 0")
        driver = cur.fetch_arrow_table().schema
    unknown = []
    for col, field in zip(columns, driver):
        ours = adbc_field(col)
        if ours is None:
            unknown.append(col.name)
        else:
            assert same(ours, field), f"{col.name} ({col.type_sql}): {ours} here, the driver gives {field}"
    # left to the driver: uuid, json and oid (their Arrow form changed between its versions), arrays, the types it reads as
    # opaque bytes, a struct or money's int64
    assert unknown == ["s_oid", "s_uuid", "s_json", "s_jsonb", *[f"a_{name}" for name in SCALARS], "n_arr", "en_arr", "ip", "mo",
                       "rng", "pt", "bits", "x", "comp", "dom_arr", "tz_arr", "ts_arr", "iv_arr", "u_arr", "jb_arr", "b_arr"]


_LOAD = """
import json, sys
from tests.helpers import job
report = job({"type": "parquet", "path": sys.argv[2]}, {"type": "postgres", "port": int(sys.argv[1]), "table": "d_load"},
             load_mode="append")
assert report.error is None, report.error
print(json.dumps({"adbc": "adbc_driver_manager" in sys.modules, "path": report.sink_plan.path_reason}))
"""


def test_loading_arrow_batches_into_built_in_types_loads_no_adbc_driver(typed, tmp_path) -> None:
    import pyarrow.parquet as pq

    pg_exec(typed, "DROP TABLE IF EXISTS d_load",
            "CREATE TABLE d_load (id int8, n numeric(15,2), t text, d date, tz timestamptz, b bool)")
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "n": pa.array([None, None], pa.decimal128(15, 2)),
                      "t": ["a", None], "d": pa.array([0, 19000], pa.date32()),
                      "tz": pa.array([0, None], pa.timestamp("us", tz="UTC")), "b": [True, None]})
    pq.write_table(table, tmp_path / "one.parquet")
    res = subprocess.run([sys.executable, "-c", _LOAD, str(typed.port), str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                         timeout=60, env={**os.environ, "PGPASSWORD": PG_PASSWORD})
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "pgpq encoder" in out["path"]
    assert out["adbc"] is False, "prepare connected through ADBC for a target of built-in types"
    assert pg_exec(typed, "SELECT count(*), count(t), sum(id) FROM d_load")[0] == (2, 1, 3)
