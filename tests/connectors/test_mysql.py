"""MySQL / MariaDB source and sink against a real MariaDB server (tests/conftest.py: mysql_server).

On the main this started from there was no mysql connector: every test here fails there
(``unknown source type 'mysql'``).
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConfigError, ConnectError, ConveyorError, PlanningError, SchemaError, TransferError
from tests.helpers import job, pg_exec

TYPES = """CREATE TABLE {name} (id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, bo BOOL, si SMALLINT, mi MEDIUMINT,
  bi BIGINT, bu BIGINT UNSIGNED, d DECIMAL(10,2), d38 DECIMAL(38,10), d65 DECIMAL(65,30), f FLOAT, db DOUBLE, b1 BIT(1), b8 BIT(8),
  c CHAR(5), vc VARCHAR(20), vb VARCHAR(20) COLLATE utf8mb4_bin, tx TEXT, bl BLOB, dt DATE, dtm DATETIME(6), ts TIMESTAMP(6) NULL,
  tm TIME(6), yr YEAR, js JSON, en ENUM('a','b'), st SET('x','y'))"""
ROWS = ("(1, -128, 255, 5, -32768, -8388608, -9223372036854775808, 18446744073709551615, -12345678.91, "
        "1234567890123456789012345678.0123456789, 12345678901234567890123456789012345.123456789012345678901234567891, "
        "1.5, 1e308, 1, 255, 'ab', 'héllo 🦆', 'Bin', 'line\\nbreak \"q\" ''s'' \\\\ back', X'00ff00', '1000-01-01', "
        "'9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999', '-838:59:59', 1901, '{\"a\": [1, 2.5]}', 'b', 'x,y')",
        "(2, 127, 0, -1, 32767, 8388607, 9223372036854775807, 0, 0.01, -0.0000000001, 0, -3.4e38, -0.0, 0, 0, '', '', '', '', '', "
        "'2024-02-29', '1970-01-01 00:00:00', '1970-01-01 00:00:01', '838:59:59.999999', 2155, 'null', 'a', '')",
        "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")


def _text(m, table: str, like: str = "types") -> list[tuple]:
    """Every value as MySQL prints it, ordered by id: what must survive a round trip. Bytes in hex; BIT
    (and what it came back as: bool, bytes) as its number; ``like``'s column types decide."""
    kinds = dict(m.execute(f"SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = DATABASE() "
                           f"AND table_name = '{like}'"))
    cols = [r[0] for r in m.execute(f"SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                                    f"AND table_name = '{table}' ORDER BY ordinal_position")]
    exprs = [f"CONV(HEX(`{c}`), 16, 10)" if kinds[c] in ("bit", "tinyint") else f"HEX(`{c}`)" if kinds[c] in ("blob", "varbinary") else
             f"CAST(`{c}` AS CHAR)" for c in cols]
    return m.execute(f"SELECT {', '.join(exprs)} FROM `{table}` ORDER BY id")


def _stage_tables(m) -> list[str]:
    """Staging (or swapped-out) tables in the database; the marker, run and sync-state tables themselves stay."""
    kept = ("_conveyor_commits", "_conveyor_runs", "_conveyor_sync")
    return [r[0] for r in m.execute("SHOW TABLES LIKE '\\_conveyor%'") if r[0] not in kept]


def _runs_registered(m) -> bool:
    return bool(m.execute("SHOW TABLES LIKE '\\_conveyor\\_runs'"))


def _leftovers(m) -> list:
    """Staging (or swapped-out) tables left in the database, and runs still registered (a run's row goes when it ends)."""
    runs = m.execute("SELECT run_id FROM _conveyor_runs") if _runs_registered(m) else []
    return _stage_tables(m) + [f"run {r[0]}" for r in runs]


@pytest.fixture(scope="module", autouse=True)
def _no_other_modules_runs(mysql_server):
    """The worker's MariaDB as this module's tests count on it: without the runs and staging tables an earlier module on
    the same server left on purpose (a killed driver's run stays registered until it is resumed: test_mysql_exactly_once)."""
    if _runs_registered(mysql_server):
        mysql_server.execute("DELETE FROM _conveyor_runs")
    stale = _stage_tables(mysql_server)
    if stale:
        mysql_server.execute(*(f"DROP TABLE IF EXISTS `{t}`" for t in stale))


def _my(m, **kw) -> dict:
    return {"type": "mysql", "port": m.port, "user": m.user, "database": m.database, **kw}


@pytest.fixture(scope="module")
def types_table(mysql_server):
    mysql_server.execute("DROP TABLE IF EXISTS types", TYPES.format(name="types"), f"INSERT INTO types VALUES {', '.join(ROWS)}")
    return mysql_server


@pytest.mark.parametrize("via,bulk", [("parquet", "load_data"), ("parquet", "insert"), ("postgres", "load_data")])
def test_every_type_survives_a_round_trip_through_arrow(types_table, pg_target, tmp_path: Path, via: str, bulk: str) -> None:
    """MySQL -> Parquet (or PostgreSQL) -> MySQL with load_mode=create, through LOAD DATA or INSERTs: every
    value prints the same (the text with a newline, quotes and a backslash; bytes with NUL; the unsigned maximum)."""
    m = types_table
    m.execute("DROP TABLE IF EXISTS types_back")
    if via == "parquet":
        middle_sink, middle_src = {"type": "parquet", "path": str(tmp_path / "p")}, {"type": "parquet", "path": str(tmp_path / "p")}
        job(_my(m, table="types"), middle_sink, load_mode="create")
    else:
        pg_exec(pg_target, "DROP TABLE IF EXISTS my_types")
        job(_my(m, table="types"), {"type": "postgres", "port": pg_target.port, "table": "my_types"}, load_mode="create")
        middle_src = {"type": "postgres", "port": pg_target.port, "table": "my_types"}
        # PostgreSQL holds them as its own types: the unsigned 64-bit value as numeric(20,0), TIME's range as text
        assert pg_exec(pg_target, "SELECT bu::text, tm, vc, d65 FROM my_types WHERE id = 1")[0] == (
            "18446744073709551615", "-838:59:59.000000", "héllo 🦆", "12345678901234567890123456789012345.123456789012345678901234567891")
    report = job(middle_src, _my(m, table="types_back", bulk=bulk), load_mode="create")
    assert report.sink_plan.own.bulk == bulk
    names = [r[0] for r in m.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                                     "AND table_name = 'types' ORDER BY ordinal_position")]
    back, orig = _text(m, "types_back"), _text(m, "types")
    assert len(back) == len(orig) == len(ROWS)
    for i, name in enumerate(names):  # column by column, so a difference names its column
        assert [r[i] for r in back] == [r[i] for r in orig], name


def test_zero_dates_are_refused_by_name_or_read_as_null_when_asked(mysql_server, tmp_path: Path) -> None:
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS zeroes", "CREATE TABLE zeroes (id INT, d DATE, t DATETIME)", "SET SESSION sql_mode = ''",
              "INSERT INTO zeroes VALUES (1, '2024-01-01', '2024-01-01 10:00:00'), (2, '2024-01-01', '0000-00-00 00:00:00')")
    m.execute("SET GLOBAL sql_mode = ''", "INSERT INTO zeroes VALUES (3, '2024-00-15', '2024-01-01 00:00:00')",
              "SET GLOBAL sql_mode = DEFAULT")
    with pytest.raises(TransferError, match=r"mysql column [dt] \((date|datetime)\) holds a zero date"):
        job(_my(m, table="zeroes"), {"type": "parquet", "path": str(tmp_path / "z")}, load_mode="create")
    assert not list((tmp_path / "z").glob("*.parquet"))
    job(_my(m, table="zeroes", zero_dates="null"), {"type": "parquet", "path": str(tmp_path / "n")}, load_mode="create")
    import pyarrow.parquet as pq

    got = pq.read_table(tmp_path / "n").sort_by("id").to_pylist()
    assert [(r["d"] is None, r["t"] is None) for r in got] == [(False, False), (False, True), (True, False)]


@pytest.fixture(scope="module")
def keyed(mysql_server):
    m = mysql_server
    m.execute("SET SESSION max_recursive_iterations = 100000", "DROP TABLE IF EXISTS keyed", "CREATE TABLE keyed (id BIGINT, grp VARCHAR(5), v DOUBLE)",
              "INSERT INTO keyed WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 5000) "
              "SELECT n * 7 - 300, ELT(1 + n % 4, 'a', 'b', 'c', NULL), n / 3 FROM s",
              "INSERT INTO keyed VALUES (NULL, 'z', 1), (NULL, NULL, NULL)")
    return m


@pytest.mark.parametrize("strategy,params", [
    ("none", {}), ("rangeid", {"distribute_key": "id"}), ("ntile", {"distribute_key": "id"}), ("random", {"distribute_key": "id"}),
    ("datadriven", {"distribute_key": "grp"}), ("auto", {"distribute_key": "id"}),
])
def test_every_strategy_reads_every_row_once(keyed, tmp_path: Path, strategy: str, params: dict) -> None:
    import pyarrow.parquet as pq

    report = job(_my(keyed, table="keyed"), {"type": "parquet", "path": str(tmp_path / "o")}, strategy, params,
                 load_mode="create", degree=3)
    got = pq.read_table(tmp_path / "o")
    expect = keyed.execute("SELECT count(*), count(id), sum(id), count(grp), sum(v) FROM keyed")[0]
    assert (got.num_rows, got["id"].null_count) == (expect[0], expect[0] - expect[1])
    assert sum(x for x in got["id"].to_pylist() if x is not None) == expect[2]
    assert got.num_rows - got["grp"].null_count == expect[3]
    assert abs(sum(x for x in got["v"].to_pylist() if x is not None) - expect[4]) < 1e-6
    if strategy != "none":
        assert len(report.plan.partitions) > 1


def test_auto_ranges_on_the_primary_key(mysql_server, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    m = mysql_server
    m.execute("DROP TABLE IF EXISTS pk", "CREATE TABLE pk (k INT PRIMARY KEY, v INT)", "SET SESSION max_recursive_iterations = 100000",
              "INSERT INTO pk WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 3000) SELECT n * 3, n FROM s")
    report = job(_my(m, table="pk"), {"type": "parquet", "path": str(tmp_path / "o")}, "auto", load_mode="create", degree=2)
    assert "chose rangeid on k (the primary key)" in report.plan.note and len(report.plan.partitions) > 1
    assert sorted(pq.read_table(tmp_path / "o")["k"].to_pylist()) == [n * 3 for n in range(1, 3001)]


def test_ctid_is_refused_by_name(keyed, tmp_path: Path) -> None:
    with pytest.raises(PlanningError, match="strategy=ctid needs a PostgreSQL table; mysql table conveyor.keyed is not one"):
        job(_my(keyed, table="keyed"), {"type": "parquet", "path": str(tmp_path / "o")}, "ctid", load_mode="create")


@pytest.fixture()
def target(mysql_server):
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS tgt", "CREATE TABLE tgt (id BIGINT PRIMARY KEY, grp VARCHAR(5), v DOUBLE NOT NULL)",
              "INSERT INTO tgt VALUES (-1, 'old', 0), (-2, 'old', 0)")
    return m


def _keyed_parquet(keyed, tmp_path: Path) -> Path:
    job(_my(keyed, query="SELECT id, grp, v FROM keyed WHERE id IS NOT NULL AND v IS NOT NULL"),
        {"type": "parquet", "path": str(tmp_path / "src")}, "ntile", {"distribute_key": "id", "partitions": 4}, load_mode="create")
    return tmp_path / "src"


@pytest.mark.parametrize("mode", ["append", "truncate", "replace"])
def test_load_modes_into_mysql(keyed, target, tmp_path: Path, mode: str) -> None:
    src = _keyed_parquet(keyed, tmp_path)
    report = job({"type": "parquet", "path": str(src)}, _my(target, table="tgt"), "files", load_mode=mode, degree=2, verify="count")
    want = keyed.execute("SELECT count(*), sum(id) FROM keyed WHERE id IS NOT NULL AND v IS NOT NULL")[0]
    got = target.execute("SELECT count(*), sum(id), sum(grp = 'old') FROM tgt")[0]
    old = 2 if mode == "append" else 0
    assert (got[0], got[1], got[2] or 0) == (want[0] + old, want[1] - 3 * (old // 2), old)
    if mode == "truncate":  # the same table object: its primary key is kept
        assert target.execute("SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() "
                              "AND table_name = 'tgt' AND index_name = 'PRIMARY'")[0][0] == 1
    assert not _leftovers(target)
    # append keeps a marker per partition (the target knows what it holds); a staged load's go with its swap
    marks = target.execute(f"SELECT count(*), coalesce(sum(committed_rows), 0) FROM _conveyor_commits WHERE target = "
                           f"'{target.database}.tgt' AND load_id = '{report.plan.spec.options.load}'")[0]
    assert tuple(marks) == ((4, want[0]) if mode == "append" else (0, 0))


@pytest.mark.parametrize("mode", ["truncate", "replace"])
def test_a_failed_load_leaves_the_old_rows(target, tmp_path: Path, mode: str) -> None:
    """truncate: a NULL into a NOT NULL column fails one partition (the server refuses it); replace: a damaged
    file fails one partition. Either way the target keeps exactly its old rows, and no staging table is left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "bad"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "grp": ["a", "b"], "v": [1.0, 2.0]}), src / "a.parquet")
    if mode == "truncate":
        pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64()), "grp": ["a", "b"], "v": pa.array([None, 2.0], pa.float64())}),
                       src / "b.parquet")
    else:
        (src / "b.parquet").write_bytes(b"PAR1 this is not a parquet file PAR1")
    before = target.execute("SELECT * FROM tgt ORDER BY id")
    with pytest.raises(ConveyorError):
        job({"type": "parquet", "path": str(src)}, _my(target, table="tgt"), "files", load_mode=mode, degree=2)
    assert target.execute("SELECT * FROM tgt ORDER BY id") == before
    assert not _leftovers(target)


@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_a_value_mysql_would_truncate_fails_the_partition_by_name(target, tmp_path: Path, bulk: str) -> None:
    """LOAD DATA LOCAL turns a too-long string into a warning and loads it cut: here the partition rolls back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "long").mkdir()
    pq.write_table(pa.table({"id": pa.array([7, 8], pa.int64()), "grp": ["ok", "much too long"], "v": [1.0, 2.0]}),
                   tmp_path / "long" / "a.parquet")
    before = target.execute("SELECT * FROM tgt ORDER BY id")
    with pytest.raises(TransferError, match=r"grp|Data too long|truncated"):
        job({"type": "parquet", "path": str(tmp_path / "long")}, _my(target, table="tgt", bulk=bulk), "files", load_mode="append")
    assert target.execute("SELECT * FROM tgt ORDER BY id") == before


def test_append_commits_whole_partitions_and_a_failed_one_says_so(keyed, target, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "bad"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array(list(range(10, 20)), pa.int64()), "grp": ["a"] * 10, "v": [1.0] * 10}), src / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([30, 31], pa.int64()), "grp": ["a", "b"], "v": pa.array([2.0, None], pa.float64())}),
                   src / "b.parquet")
    with pytest.raises(TransferError) as err:
        job({"type": "parquet", "path": str(src)}, _my(target, table="tgt"), "files", load_mode="append", degree=1)
    rows = {r[0] for r in target.execute("SELECT id FROM tgt")}
    assert 30 not in rows  # the failed partition committed nothing, not even its good row
    assert rows - {-1, -2} in (set(), set(range(10, 20)))  # the other partition whole, or not at all
    assert "partition" in str(err.value) or "committed" in str(err.value)


def test_bad_input_is_one_clear_error_without_the_password(mysql_server, tmp_path: Path, monkeypatch) -> None:
    m = mysql_server
    out = {"type": "parquet", "path": str(tmp_path / "o")}
    monkeypatch.setenv("MYSQL_PWD", "wrong-" + m.password)
    with pytest.raises(ConnectError) as err:
        job(_my(m, table="keyed"), out, load_mode="create")
    assert "Access denied" in str(err.value) and m.password not in str(err.value)
    monkeypatch.setenv("MYSQL_PWD", m.password)
    with pytest.raises(SchemaError, match="mysql source: table conveyor.missing does not exist"):
        job(_my(m, table="missing"), out, load_mode="create")
    from conveyor.testing.pgserver import free_port

    with pytest.raises(ConnectError, match="is the server running|Can't connect"):
        job({**_my(m, table="keyed"), "port": free_port()}, out, load_mode="create")
    with pytest.raises(ConfigError, match="password_env: the environment variable NOPE_PW is not set"):
        job(_my(m, table="keyed", password_env="NOPE_PW"), out, load_mode="create")


def test_a_column_without_an_exact_mysql_type_is_refused_by_name(mysql_server, pg_source, tmp_path: Path) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS to_my", "CREATE TABLE to_my (id int, iv interval, tags text[])",
            "INSERT INTO to_my VALUES (1, '1 day', '{a}')")
    mysql_server.execute("DROP TABLE IF EXISTS to_my")
    with pytest.raises(SchemaError, match=r"column iv: Arrow type month_day_nano_interval has no exact MySQL type"):
        job({"type": "postgres", "port": pg_source.port, "table": "to_my"}, _my(mysql_server, table="to_my"), load_mode="create")
    assert not _leftovers(mysql_server)


def test_postgres_to_mysql_and_back_keeps_tpch_orders(mysql_server, pg_source, pg_target, tpch_orders: Path) -> None:
    """Parquet -> PostgreSQL -> MySQL -> PostgreSQL: the same 15,000 orders, value for value."""
    from tests.helpers import checksum

    pg_exec(pg_source, "DROP TABLE IF EXISTS my_orders")
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_orders_back")
    mysql_server.execute("DROP TABLE IF EXISTS orders")
    job({"type": "parquet", "path": str(tpch_orders)}, {"type": "postgres", "port": pg_source.port, "table": "my_orders"}, "files",
        load_mode="create")
    job({"type": "postgres", "port": pg_source.port, "table": "my_orders"}, _my(mysql_server, table="orders"), "ctid",
        load_mode="create", degree=2)
    job(_my(mysql_server, table="orders"), {"type": "postgres", "port": pg_target.port, "table": "my_orders_back"}, "rangeid",
        {"distribute_key": "o_orderkey"}, load_mode="create", degree=2)
    assert checksum(pg_target, "my_orders_back") == checksum(pg_source, "my_orders")
    assert checksum(pg_source, "my_orders")[0] == 15000


@pytest.fixture()
def merge_target(mysql_server):
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS mt", "CREATE TABLE mt (id BIGINT PRIMARY KEY, name VARCHAR(20), v DOUBLE, gone BOOL DEFAULT FALSE)",
              "INSERT INTO mt (id, name, v) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
    return m


def _changes(tmp_path: Path, ids: list[int], names: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "chg").mkdir(exist_ok=True)
    half = len(ids) // 2
    for i, (a, b) in enumerate(((0, half), (half, len(ids)))):
        pq.write_table(pa.table({"id": pa.array(ids[a:b], pa.int64()), "name": names[a:b], "v": pa.array([float(x) * 10 for x in ids[a:b]])}),
                       tmp_path / "chg" / f"{i}.parquet")
    return tmp_path / "chg"


@pytest.mark.parametrize("delete", ["none", "hard", "soft"])
def test_merge_updates_inserts_and_deletes_by_the_primary_key(merge_target, tmp_path: Path, delete: str) -> None:
    m = merge_target
    src = _changes(tmp_path, [2, 3, 4, 5], ["TWO", "THREE", "four", "five"])
    extra = {"merge_delete": delete, **({"merge_soft_delete_column": "gone"} if delete == "soft" else {})}
    job({"type": "parquet", "path": str(src)}, _my(m, table="mt", **extra), "files", load_mode="merge", degree=2)
    got = m.execute("SELECT id, name, v, gone FROM mt ORDER BY id")
    kept = {"none": [(1, "one", 1.0, 0)], "hard": [], "soft": [(1, "one", 1.0, 1)]}[delete]
    assert list(got) == [*kept, (2, "TWO", 20.0, 0), (3, "THREE", 30.0, 0), (4, "four", 40.0, 0), (5, "five", 50.0, 0)]
    assert not _leftovers(m)


def test_merge_refuses_duplicated_source_keys_by_value_and_changes_nothing(merge_target, tmp_path: Path) -> None:
    m = merge_target
    before = m.execute("SELECT * FROM mt ORDER BY id")
    src = _changes(tmp_path, [2, 7, 7, 2, 9, 7], ["a", "b", "c", "d", "e", "f"])
    with pytest.raises(SchemaError, match=r"the source has the same key \(id\) more than once: \(7\) x3; \(2\) x2"):
        job({"type": "parquet", "path": str(src)}, _my(m, table="mt"), "files", load_mode="merge", degree=2)
    assert m.execute("SELECT * FROM mt ORDER BY id") == before
    assert not _leftovers(m)


def test_merge_into_a_case_insensitive_key_takes_the_sources_spelling_and_refuses_two_spellings(mysql_server, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    m = mysql_server
    m.execute("DROP TABLE IF EXISTS mci", "CREATE TABLE mci (name VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, v DOUBLE) "
              "DEFAULT CHARSET=utf8mb4", "INSERT INTO mci VALUES ('bob', 1), ('Zoë', 2), ('kept', 3)")
    (tmp_path / "ci").mkdir()
    pq.write_table(pa.table({"name": ["Bob", "Zoe", "new"], "v": [10.0, 20.0, 30.0]}), tmp_path / "ci" / "0.parquet")
    job({"type": "parquet", "path": str(tmp_path / "ci")}, _my(m, table="mci"), "files", load_mode="merge")
    # 'Bob' matched 'bob' under the collation, and the key now holds the source's spelling ('Zoe' = 'Zoë' likewise)
    got = m.execute("SELECT CAST(name AS BINARY), v FROM mci ORDER BY v")
    assert [(bytes(n).decode(), v) for n, v in got] == [("kept", 3.0), ("Bob", 10.0), ("Zoe", 20.0), ("new", 30.0)]
    # two source keys the target's collation takes as one: refused as such, the target as it was
    before = m.execute("SELECT CAST(name AS BINARY), v FROM mci ORDER BY v")
    (tmp_path / "ci" / "0.parquet").unlink()
    pq.write_table(pa.table({"name": ["ann", "ANN", "other"], "v": [1.5, 2.5, 3.5]}), tmp_path / "ci" / "1.parquet")
    with pytest.raises(SchemaError, match=r"source keys that differ only in letter case or accents are one key under the target's "
                                          r"collation of \(name\): \((?i:ann)\) x2"):
        job({"type": "parquet", "path": str(tmp_path / "ci")}, _my(m, table="mci"), "files", load_mode="merge")
    assert m.execute("SELECT CAST(name AS BINARY), v FROM mci ORDER BY v") == before
    assert not _leftovers(m)


def test_merge_keys_must_be_the_targets_only_unique_index(merge_target, tmp_path: Path) -> None:
    m = merge_target
    src = _changes(tmp_path, [2, 4], ["x", "y"])
    with pytest.raises(ConfigError, match=r"no unique index is exactly \(name\)"):
        job({"type": "parquet", "path": str(src)}, _my(m, table="mt", merge_keys=["name"]), "files", load_mode="merge")
    m.execute("CREATE UNIQUE INDEX by_name ON mt (name)")
    with pytest.raises(ConfigError, match="it has 2 unique indexes"):
        job({"type": "parquet", "path": str(src)}, _my(m, table="mt"), "files", load_mode="merge")
    assert not _leftovers(m)


@pytest.mark.parametrize("bulk", ["insert", "load_data"])
def test_trailing_spaces_past_a_varchar_length_are_refused_not_cut(mysql_server, tmp_path: Path, bulk: str) -> None:
    """MySQL cuts a value's excess trailing spaces to fit varchar(n) / char(n) with only a note, in any
    sql_mode: on main the insert path (DuckDB's mysql extension, which never shows the notes) stored
    'abc  ' as 'abc' and the run verified (LOAD DATA's notes were already refused). Each value's length
    is checked before MySQL sees it, on both paths; values that fit arrive as they were."""
    m = mysql_server
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": ["ab ", "abc  "]}), tmp_path / "in" / "a.parquet")
    m.execute("DROP TABLE IF EXISTS tl_my", "CREATE TABLE tl_my (id bigint, v varchar(3))")
    with pytest.raises(TransferError, match=re.escape("column v -> v: a value of 5 characters is too long for varchar(3)")):
        job({"type": "parquet", "path": str(tmp_path / "in")}, _my(m, table="tl_my", bulk=bulk), "files", load_mode="append")
    assert m.execute("SELECT count(*) FROM tl_my")[0][0] == 0
    pq.write_table(pa.table({"id": [1, 2], "v": ["ab ", "abc"]}), tmp_path / "in" / "a.parquet")
    job({"type": "parquet", "path": str(tmp_path / "in")}, _my(m, table="tl_my", bulk=bulk), "files", load_mode="append")
    assert m.execute("SELECT id, concat(v, '|') FROM tl_my ORDER BY id") == [(1, "ab |"), (2, "abc|")]


# --- date-times by the cast policy (read back in a session of another zone: +05:00) ----------------------


@pytest.fixture(scope="module")
def zoned_times(mysql_server, pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS my_times", "CREATE TABLE my_times (id int, t timestamp, tz timestamptz, t0 timestamp)",
            "INSERT INTO my_times VALUES (1, '2020-01-01 00:37:00.123456', '2020-01-01 00:37:00.123456+00', '2020-01-01 00:37:00.7')")
    return mysql_server


@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_a_timestamp_without_zone_into_a_mysql_timestamp_is_refused_and_one_with_a_zone_keeps_its_instant(zoned_times, pg_source,
                                                                                                       bulk: str) -> None:
    """MySQL's TIMESTAMP is an instant (kept in UTC, shown in the session's zone): a PostgreSQL timestamp
    has no zone, so loading it there is timestamp -> timestamptz, refused by the cast policy (on the main
    this started from it was written as UTC and read back 5 hours off in a +05:00 session); a timestamptz
    goes in as the same instant, on both bulk paths."""
    m = zoned_times
    m.execute("DROP TABLE IF EXISTS my_ts", "CREATE TABLE my_ts (id int, t timestamp(6) NULL, tz timestamp(6) NULL)")
    src = {"type": "postgres", "port": pg_source.port}
    with pytest.raises(SchemaError, match=r"column t \(timestamp\[us\] -> timestamp\(6\)\): a timestamp without time zone") as caught:
        job({**src, "query": "SELECT id, t FROM my_times"}, _my(m, table="my_ts", bulk=bulk), load_mode="append")
    assert "let MySQL cast it" in caught.value.hint and "PostgreSQL" not in caught.value.hint
    job({**src, "query": "SELECT id, tz FROM my_times"}, _my(m, table="my_ts", bulk=bulk), load_mode="append")
    assert m.execute("SET time_zone = '+05:00'", "SELECT CAST(tz AS CHAR), UNIX_TIMESTAMP(tz) FROM my_ts") == [
        ("2020-01-01 05:37:00.123456", Decimal("1577839020.123456"))]


def test_a_datetime_with_fewer_fractional_digits_is_refused_not_cut(zoned_times, pg_source) -> None:
    """DATETIME(0) keeps no fraction: MariaDB cut 00:37:00.7 to 00:37:00 without a word."""
    m = zoned_times
    m.execute("DROP TABLE IF EXISTS my_dt0", "CREATE TABLE my_dt0 (id int, t0 datetime)")
    with pytest.raises(SchemaError, match=r"column t0 .*fractional seconds 0 < 6"):
        job({"type": "postgres", "port": pg_source.port, "query": "SELECT id, t0 FROM my_times"}, _my(m, table="my_dt0"), load_mode="append")


def test_create_makes_columns_for_uuid_time_and_json_and_leaves_no_staging_label(mysql_server, pg_source) -> None:
    """create / replace refused uuid ("no exact MySQL type") in the very table they were making, and the
    swapped-in table kept its "staging table" comment; replace keeps the replaced table's own comment."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS to_my2", "CREATE TABLE to_my2 (id int primary key, u uuid, t time, j jsonb)",
            "INSERT INTO to_my2 VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '12:34:56.789', '{\"a\": 1}')")
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS to_my2")
    src = {"type": "postgres", "port": pg_source.port, "table": "to_my2"}
    job(src, _my(m, table="to_my2"), load_mode="create")
    assert m.execute("SELECT id, u, CAST(t AS CHAR), j FROM to_my2") == [(1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "12:34:56.789000", '{"a": 1}')]
    comment = "SELECT table_comment FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'to_my2'"
    assert m.execute(comment) == [("",)]
    m.execute("ALTER TABLE to_my2 COMMENT = 'kept''s'")
    job(src, _my(m, table="to_my2"), load_mode="replace")
    assert m.execute(comment) == [("kept's",)] and not _leftovers(m)


# --- MySQL -> PostgreSQL as COPY text lines (conveyor/connectors/mysql/textcopy.py) -----------------------


@pytest.fixture(scope="module")
def text_types(types_table):
    """The types table less its FLOAT, DOUBLE and BIT columns (whose MySQL text is not exact): every column can travel as text."""
    m = types_table
    m.execute("DROP TABLE IF EXISTS types_text", "CREATE TABLE types_text AS SELECT id, ti, tu, bo, si, mi, bi, bu, d, d38, d65, c, vc, vb, "
              "tx, bl, dt, dtm, ts, tm, yr, js, en, st FROM types",
              "INSERT INTO types_text (id, tx, vc, bl) VALUES (4, CONCAT('tab', CHAR(9), 'cr', CHAR(13), 'lf', CHAR(10), 'bs', CHAR(92), "
              "'N', CHAR(92), 'N'), '\\\\N', X'5c4e0a09')")
    return m


def test_mysql_to_postgres_passes_text_lines_through_and_they_equal_the_arrow_paths(text_types, pg_target) -> None:
    """The same table through the pass-through and through Arrow batches: PostgreSQL holds the same rows, value
    for value (escapes, a literal \\N, NULLs, bytes, wide decimals, times past 24 h, the unsigned maximum)."""
    m = text_types
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_text_pass", "DROP TABLE IF EXISTS my_text_arrow")
    sink = {"type": "postgres", "port": pg_target.port}
    passed = job(_my(m, table="types_text"), {**sink, "table": "my_text_pass"}, load_mode="create", strategy="rangeid",
                 strategy_params={"distribute_key": "id", "partitions": 2}, degree=2)
    assert passed.sink_plan.native == "pgcopy-text", passed.sink_plan.path
    arrow = job(_my(m, table="types_text"), {**sink, "table": "my_text_arrow", "copy_path": "arrow"}, load_mode="create")
    assert arrow.sink_plan.native is None
    assert pg_exec(pg_target, "SELECT count(*) FROM my_text_pass")[0][0] == 4
    for a, b in (("my_text_pass", "my_text_arrow"), ("my_text_arrow", "my_text_pass")):
        assert pg_exec(pg_target, f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) d")[0][0] == 0, (a, b)
    assert pg_exec(pg_target, "SELECT tx, vc, encode(bl, 'hex'), bu::text FROM my_text_pass WHERE id IN (1, 4) ORDER BY id") == [
        ("line\nbreak \"q\" 's' \\ back", "héllo 🦆", "00ff00", "18446744073709551615"),
        ("tab\tcr\rlf\nbs\\N\\N", "\\N", "5c4e0a09", None)]


def test_the_pass_through_is_not_taken_where_text_is_not_exact_or_a_length_is_checked(types_table, text_types, pg_target) -> None:
    m = types_table
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_float", "DROP TABLE IF EXISTS my_narrow",
            "CREATE TABLE my_narrow (id int, vc varchar(20))")
    floats = job(_my(m, query="SELECT id, f, db FROM types"), {"type": "postgres", "port": pg_target.port, "table": "my_float"},
                 load_mode="create")
    assert floats.sink_plan.native is None and "column f (float)" in floats.sink_plan.path, floats.sink_plan.path
    narrow = job(_my(m, query="SELECT id, vc FROM types_text"), {"type": "postgres", "port": pg_target.port, "table": "my_narrow"},
                 load_mode="append")
    assert narrow.sink_plan.native is None and "length is checked" in narrow.sink_plan.path, narrow.sink_plan.path


def test_a_zero_date_in_the_pass_through_is_refused_by_its_column_or_read_as_null(mysql_server, pg_target) -> None:
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS zeroes_pg", "CREATE TABLE zeroes_pg (id INT, d DATE)", "SET SESSION sql_mode = ''",
              "INSERT INTO zeroes_pg VALUES (1, '2024-01-01'), (2, '0000-00-00')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_zero", "CREATE TABLE my_zero (id int, d date)")
    sink = {"type": "postgres", "port": pg_target.port, "table": "my_zero"}
    with pytest.raises(ConveyorError, match=r'"0000-00-00" \(column d, line 2'):
        job(_my(m, table="zeroes_pg"), sink, load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM my_zero")[0][0] == 0
    report = job(_my(m, table="zeroes_pg", zero_dates="null"), sink, load_mode="append")
    assert report.sink_plan.native == "pgcopy-text"
    assert pg_exec(pg_target, "SELECT id, d FROM my_zero ORDER BY id") == [(1, __import__("datetime").date(2024, 1, 1)), (2, None)]


def test_the_pass_through_takes_text_columns_of_other_character_sets(mysql_server, pg_target) -> None:
    """An ascii column (the MySQL sink's own uuid is CHAR(36) ascii) beside utf8mb4 ones: the server's COPY line refused to
    CONCAT them ("Illegal mix of collations for operation 'concat'", naming no column; the corpus's misc table)."""
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS charsets_pg", "CREATE TABLE charsets_pg (id INT, u CHAR(36) CHARACTER SET ascii, "
              "l VARCHAR(10) CHARACTER SET latin1, t VARCHAR(30) CHARACTER SET utf8mb4)",
              "INSERT INTO charsets_pg VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'caf\u00e9', '\u20ac \\\\ tab\\there'), "
              "(2, NULL, NULL, NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_charsets", "CREATE TABLE my_charsets (id int, u text, l text, t text)")
    report = job(_my(m, table="charsets_pg"), {"type": "postgres", "port": pg_target.port, "table": "my_charsets"}, load_mode="append")
    assert report.sink_plan.native == "pgcopy-text"
    assert pg_exec(pg_target, "SELECT id, u, l, t FROM my_charsets ORDER BY id") == [
        (1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "caf\u00e9", "\u20ac \\ tab\there"), (2, None, None, None)]


@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_negative_zero_is_refused_by_name_unless_stored_as_zero_by_policy(mysql_server, pg_source, bulk: str) -> None:
    """MariaDB stores a DOUBLE -0.0 as 0 (its sign lost, checked below): refused naming the column, the target as it was;
    sink.negative_zero=zero stores it as 0 by the user's choice."""
    m = mysql_server
    pg_exec(pg_source, "DROP TABLE IF EXISTS nz_src", "CREATE TABLE nz_src (id int PRIMARY KEY, f float8, r real)",
            "INSERT INTO nz_src VALUES (1, 1.5, 2.5), (2, '-0', 1), (3, NULL, '-0')")
    m.execute("DROP TABLE IF EXISTS nz", "CREATE TABLE nz (id INT PRIMARY KEY, f DOUBLE, r FLOAT)", "INSERT INTO nz VALUES (9, 9, 9)")
    with pytest.raises(TransferError, match=r"column f \(double\) holds -0.0, which MySQL stores as 0") as caught:
        job({"type": "postgres", "port": pg_source.port, "table": "nz_src"}, _my(m, table="nz", bulk=bulk), load_mode="append")
    assert "sink.negative_zero=zero" in (caught.value.hint or "")
    assert m.execute("SELECT id FROM nz") == [(9,)]
    job({"type": "postgres", "port": pg_source.port, "table": "nz_src"}, _my(m, table="nz", bulk=bulk, negative_zero="zero"),
        load_mode="append")
    assert m.execute("SELECT id, ATAN2(f, -1) > 0 FROM nz WHERE id = 2") == [(2, 1)]  # +0: MariaDB kept no sign


@pytest.mark.parametrize("keep_definition", [True, False])
def test_create_from_mysql_into_postgres_carries_the_key_not_null_and_comments(mysql_server, pg_target, keep_definition: bool) -> None:
    """MySQL -> PostgreSQL create made no primary key and no NOT NULL (22 of 22 tables of the employees sample), against
    docs/definitions.md: the key, NOT NULL and comments are carried now, and MySQL's own SQL (a default, AUTO_INCREMENT,
    another index) is said in the definition line, not carried. sink.definition=false: the columns and the key only."""
    m = mysql_server
    m.execute("DROP TABLE IF EXISTS my_def")
    m.execute("CREATE TABLE my_def (a INT NOT NULL, b VARCHAR(10) NOT NULL DEFAULT 'x' COMMENT 'the b', id INT NOT NULL AUTO_INCREMENT, "
              "c TEXT, PRIMARY KEY (b, a), UNIQUE KEY my_def_id (id)) COMMENT = 'a table of mine'")
    m.execute("INSERT INTO my_def (a, b, c) VALUES (1, 'p', NULL), (2, 'q', 'z'), (1, 'q', 'y')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS my_def_pg")
    report = job(_my(m, table="my_def"), {"type": "postgres", "port": pg_target.port, "table": "my_def_pg", "definition": keep_definition},
                 load_mode="create")
    key = pg_exec(pg_target, "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, ord) "
                             "JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = 'my_def_pg'::regclass AND a.attrelid = i.indrelid "
                             "AND i.indisprimary")
    assert key == [(["b", "a"],)]
    shape = pg_exec(pg_target, "SELECT attname, attnotnull, col_description(attrelid, attnum) FROM pg_attribute "
                               "WHERE attrelid = 'my_def_pg'::regclass AND attnum > 0 ORDER BY attnum")
    comment = pg_exec(pg_target, "SELECT obj_description('my_def_pg'::regclass, 'pg_class')")[0][0]
    if keep_definition:
        assert shape == [("a", True, None), ("b", True, "the b"), ("id", True, None), ("c", False, None)]
        assert comment == "a table of mine"
        said = report.sink_plan.definition
        assert said.startswith("definition carried: 3 NOT NULL, 2 comment(s); not carried: 1 default(s); column id's AUTO_INCREMENT; "
                               "1 other index(es) (MySQL's SQL)"), said
    else:  # the key's columns are NOT NULL with the key; nothing else
        assert shape == [("a", True, None), ("b", True, None), ("id", False, None), ("c", False, None)] and comment is None
    assert pg_exec(pg_target, "SELECT a, b, c FROM my_def_pg ORDER BY b, a") == [(1, "p", None), (1, "q", "y"), (2, "q", "z")]
