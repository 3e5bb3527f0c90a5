"""The keys a sync run reads out of the slot's messages (pgoutput, read column-wise in the client): keys
of several columns and types whose text needs quoting anywhere (quotes, backslashes, tabs, newlines,
braces, commas, the empty string, 'NULL', non-ASCII), keys moved by an update, a TRUNCATE followed by
new rows, and databases in another encoding than UTF-8 (LATIN1 at both ends: the key's bytes travel
as the server wrote them and are read back by the server). Real servers; every target compared with its
source row by row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import pg_exec, run_cli, wait_until

pytestmark = pytest.mark.pg_versions  # on PostgreSQL 15 and 18

#: text keys that any quoting, escaping or encoding mistake on the way would change or merge
ODD = ["a\"b", "back\\slash", "tab\there", "new\nline", "cr\rhere", "{brace,comma}", "", "NULL", "sp ace ", "ünï", "ß€"]
LATIN1 = ["a\"b", "back\\slash", "tab\there", "{x}", "", "NULL", "é", "ßÿ", "Ñandú"]


@pytest.fixture
def dbs(pg_source, pg_target):
    for server in (pg_source, pg_target):
        pg_exec(server, "DROP DATABASE IF EXISTS sk_latin1")
        pg_exec(server, "CREATE DATABASE sk_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    yield pg_source
    for db in ("postgres", "sk_latin1"):
        wait_until(lambda db=db: not pg_exec(pg_source, "SELECT 1 FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' AND active",
                                             dbname=db), "the slots to be released", 30)
        pg_exec(pg_source, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'conveyor%' "
                           "AND NOT active AND database = current_database()", dbname=db)
    pg_exec(pg_source, "DROP DATABASE sk_latin1")
    pg_exec(pg_target, "DROP DATABASE sk_latin1")
    pg_exec(pg_target, "DROP TABLE IF EXISTS _conveyor_sync")


def _rows(server, table: str, dbname: str = "postgres") -> list[str]:
    return sorted(r[0] for r in pg_exec(server, f"SELECT _r::text FROM {table} _r", dbname=dbname))


def _literal(text: str) -> str:
    return "E'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r") + "'"


def _sync(tmp_path: Path, args: list[str], name: str) -> dict:
    report = tmp_path / f"{name}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{name}", timeout=300)
    assert r.code == 0, r.err
    return json.loads(report.read_text())


@pytest.mark.parametrize("dbname, texts", [("postgres", ODD), ("sk_latin1", LATIN1)], ids=["utf8", "latin1"])
def test_keys_of_every_shape_are_read_from_the_messages_exactly(dbs, pg_target, tmp_path: Path, dbname: str, texts: list[str]) -> None:
    src = dbs
    table = "sk_" + dbname.removeprefix("sk_")
    values = ", ".join(f"({_literal(t)}, {i}, date '2026-01-01' + {i}, gen_random_uuid(), 'v{i}')" for i, t in enumerate(texts))
    more = ", ".join(f"({_literal(t)}, {100 + i}.5, date '2026-01-01', gen_random_uuid(), 'new')" for i, t in enumerate(texts))
    pg_exec(src, f"DROP TABLE IF EXISTS {table}",
            f"CREATE TABLE {table} (t text, n numeric(10, 2), d date, u uuid, v text, PRIMARY KEY (t, n, d))",
            f"INSERT INTO {table} (t, n, d, u, v) VALUES {values}",
            f"INSERT INTO {table} SELECT 'bulk' || g, g, date '2026-01-01', gen_random_uuid(), 'b' || g FROM generate_series(1, 3000) g",
            dbname=dbname)
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", f"source.dbname={dbname}", f"source.table={table}",
            f"sink.port={pg_target.port}", f"sink.dbname={dbname}", f"sink.table={table}", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    assert _rows(pg_target, table, dbname) == _rows(src, table, dbname)
    # every odd key: its row updated; half of them moved to another odd key; one deleted; new rows of odd keys; bulk rows
    # updated, moved and deleted
    moves = [f"UPDATE {table} SET t = {_literal(t + '|moved')} WHERE t = {_literal(t)}" for t in texts[::2]]
    pg_exec(src, f"UPDATE {table} SET v = v || ' updated' WHERE t NOT LIKE 'bulk%'", *moves,
            f"DELETE FROM {table} WHERE t = {_literal(texts[1])}",
            f"INSERT INTO {table} (t, n, d, u, v) VALUES {more}",
            f"UPDATE {table} SET v = 'bulk updated' WHERE t LIKE 'bulk%' AND n::int % 3 = 0",
            f"UPDATE {table} SET n = -n WHERE t LIKE 'bulk%' AND n::int % 7 = 0",
            f"DELETE FROM {table} WHERE t LIKE 'bulk%' AND n::int % 11 = 0", dbname=dbname)
    report = _sync(tmp_path, args, "changes")
    run = report["sync"]["runs"][0]
    assert run["changes"] > 3000 // 3 and run["keys"] >= run["changes"] - 2 * len(texts), run
    assert _rows(pg_target, table, dbname) == _rows(src, table, dbname)
    # a TRUNCATE, then rows again: the table is loaded again, whole
    pg_exec(src, f"TRUNCATE {table}", f"INSERT INTO {table} (t, n, d, u, v) VALUES {values}", dbname=dbname)
    _sync(tmp_path, args, "truncated")
    assert _rows(pg_target, table, dbname) == _rows(src, table, dbname)


@pytest.mark.parametrize("copy_path", ["passthrough", "arrow"])
def test_a_latin1_database_copies_into_a_utf8_one_and_back_exactly(dbs, pg_target, tmp_path: Path, copy_path: str) -> None:
    """Every connection speaks UTF-8 whatever the database's own encoding: a LATIN1 table copied into a UTF-8 database and
    back arrives as it was (the relayed COPY's text converted by the servers at both ends); a character LATIN1 lacks is
    refused by the target, by name."""
    src = dbs
    values = ", ".join(f"({i}, {_literal(t)})" for i, t in enumerate(LATIN1))
    pg_exec(src, "DROP TABLE IF EXISTS enc_t", "CREATE TABLE enc_t (id int PRIMARY KEY, t text)", f"INSERT INTO enc_t VALUES {values}",
            dbname="sk_latin1")
    common = ["run", "source=postgres", "sink=postgres", "load_mode=replace", "strategy=none", f"sink.copy_path={copy_path}"]
    there = [*common, f"source.port={src.port}", "source.dbname=sk_latin1", "source.table=enc_t", f"sink.port={pg_target.port}",
             "sink.table=enc_t"]
    r = run_cli(*there, f"hydra.run.dir={tmp_path}/there")
    assert r.code == 0, r.err
    assert _rows(pg_target, "enc_t") == _rows(src, "enc_t", "sk_latin1")
    pg_exec(pg_target, "INSERT INTO enc_t VALUES (100, 'only in UTF-8: €')")
    back = [*common, f"source.port={pg_target.port}", "source.table=enc_t", f"sink.port={src.port}", "sink.dbname=sk_latin1",
            "sink.table=enc_t"]
    r = run_cli(*back, f"hydra.run.dir={tmp_path}/back")
    assert r.code != 0 and 'has no equivalent in encoding "LATIN1"' in r.err and "Traceback" not in r.err, r.err
    assert _rows(src, "enc_t", "sk_latin1") == sorted(r for r in _rows(pg_target, "enc_t") if "€" not in r)  # as it was
    pg_exec(pg_target, "DELETE FROM enc_t WHERE id = 100")
    r = run_cli(*back, f"hydra.run.dir={tmp_path}/back2")
    assert r.code == 0, r.err
    assert _rows(src, "enc_t", "sk_latin1") == _rows(pg_target, "enc_t")


def test_a_key_rewritten_as_an_equal_value_arrives_as_the_source_holds_it(dbs, pg_target, tmp_path: Path) -> None:
    """A key updated to a value its type calls equal but stores otherwise (numeric 1.0 -> 1.00: the same key, another
    scale) is applied as the source holds it: the target's key is rewritten too, not kept as it was."""
    src = dbs
    pg_exec(src, "DROP TABLE IF EXISTS sk_eq", "CREATE TABLE sk_eq (n numeric PRIMARY KEY, v text)",
            "INSERT INTO sk_eq SELECT g / 10.0, 'v' || g FROM generate_series(1, 100) g")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=sk_eq", f"sink.port={pg_target.port}",
            "sink.table=sk_eq", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(src, "UPDATE sk_eq SET n = n::numeric(10, 3) WHERE n < 2", "UPDATE sk_eq SET n = 5.00, v = 'both' WHERE n = 5")
    assert pg_exec(src, "SELECT n::text FROM sk_eq WHERE n = 1")[0][0] == "1.000"
    _sync(tmp_path, args, "rescaled")
    assert _rows(pg_target, "sk_eq") == _rows(src, "sk_eq")


def test_keys_under_a_nondeterministic_collation_are_one_key_and_arrive_as_the_source_holds_them(dbs, pg_target, tmp_path: Path) -> None:
    """A text key whose collation calls 'Bob' and 'bob' equal (ICU, deterministic = false), moved from one to the other: the
    run's keys are one key under that collation (each was looked up twice and staged twice, and every run failed its
    verification), and the target's key is rewritten as the source holds it."""
    import psycopg

    src = dbs
    made = "CREATE COLLATION IF NOT EXISTS sk_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
    try:
        for server in (src, pg_target):
            pg_exec(server, made)
    except psycopg.errors.FeatureNotSupported as exc:  # a server built without ICU (PostgreSQL 18's wheel here)
        pytest.skip(f"this server has no ICU collations: {exc}")
    pg_exec(src, "DROP TABLE IF EXISTS sk_coll", "CREATE TABLE sk_coll (k text COLLATE sk_ci PRIMARY KEY, v text)",
            "INSERT INTO sk_coll SELECT 'Key' || g, 'v' || g FROM generate_series(1, 50) g")
    args = ["run", "source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=sk_coll", f"sink.port={pg_target.port}",
            "sink.table=sk_coll", "load_mode=replace", "incremental.method=replication", "strategy=none"]
    _sync(tmp_path, args, "first")
    pg_exec(src, "UPDATE sk_coll SET k = lower(k) WHERE k IN ('key1', 'key2')", "UPDATE sk_coll SET k = upper(k), v = 'both' WHERE k = 'key3'",
            "DELETE FROM sk_coll WHERE k = 'KEY4'", "INSERT INTO sk_coll VALUES ('NEW', 'n')")
    report = _sync(tmp_path, args, "moved")
    assert report["sync"]["runs"][0]["keys"] == 5
    assert _rows(pg_target, "sk_coll") == _rows(src, "sk_coll")
    pg_exec(pg_target, "DROP TABLE IF EXISTS sk_coll")
