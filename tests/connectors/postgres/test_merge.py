"""load_mode=merge into PostgreSQL: partitions stage in parallel, one transaction applies them.

Each case compares the target with the expected table PostgreSQL computes from the same rows
(count + order-independent content checksum).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import ConfigError, SchemaError
from tests.helpers import checksum, job, pg_exec

SRC = ("CREATE TABLE mg_src AS SELECT g AS id, 'new-' || g AS h, g * 2 AS n FROM generate_series(500, 1500) g")
OLD = ("INSERT INTO {t} SELECT g, 'old-' || g, g FROM generate_series(1, 1000) g")


@pytest.fixture
def merge_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS mg_src", SRC)
    return pg_source


def _target(server, table: str, extra: str = "") -> None:
    pg_exec(server, f"DROP TABLE IF EXISTS {table}", f"CREATE TABLE {table} (id int PRIMARY KEY, h text, n int{extra})",
            OLD.format(t=f"{table} (id, h, n)"))


def _expected(server, name: str, sql: str) -> None:
    pg_exec(server, f"DROP TABLE IF EXISTS {name}", f"CREATE TABLE {name} AS {sql}")


def _merge(src, dst, table: str, **sink) -> object:
    return job({"type": "postgres", "port": src.port, "table": "mg_src"}, {"type": "postgres", "port": dst.port, "table": table, **sink},
               "rangeid", {"distribute_key": "id", "partitions": 4}, load_mode="merge", degree=2)


def test_merge_updates_matched_rows_inserts_new_ones_and_keeps_the_rest(merge_src, pg_target) -> None:
    _target(pg_target, "mg_dst")
    report = _merge(merge_src, pg_target, "mg_dst")
    assert report.rows == 1001 and report.verification.ok
    _expected(pg_target, "mg_exp", "SELECT g AS id, CASE WHEN g < 500 THEN 'old-' || g ELSE 'new-' || g END AS h, "
                                   "CASE WHEN g < 500 THEN g ELSE g * 2 END AS n FROM generate_series(1, 1500) g")
    assert checksum(pg_target, "mg_dst") == checksum(pg_target, "mg_exp")
    # merging the same source again changes nothing
    _merge(merge_src, pg_target, "mg_dst")
    assert checksum(pg_target, "mg_dst") == checksum(pg_target, "mg_exp")
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_conveyor\\_stage\\_%'") == [(0,)]


def test_merge_update_limits_what_a_matched_row_takes(merge_src, pg_target) -> None:
    _target(pg_target, "mg_cols")
    _merge(merge_src, pg_target, "mg_cols", merge_update=["n"])
    _expected(pg_target, "mg_exp_cols", "SELECT g AS id, CASE WHEN g <= 1000 THEN 'old-' || g ELSE 'new-' || g END AS h, "
                                        "CASE WHEN g < 500 THEN g ELSE g * 2 END AS n FROM generate_series(1, 1500) g")
    assert checksum(pg_target, "mg_cols") == checksum(pg_target, "mg_exp_cols")


def test_merge_deletes_or_marks_rows_the_source_no_longer_has(merge_src, pg_target) -> None:
    _target(pg_target, "mg_hard")
    _merge(merge_src, pg_target, "mg_hard", merge_delete="hard")
    assert checksum(pg_target, "mg_hard") == checksum(merge_src, "mg_src")
    _target(pg_target, "mg_soft", ", deleted boolean NOT NULL DEFAULT false")
    pg_exec(pg_target, "UPDATE mg_soft SET deleted = true WHERE id = 700")  # deleted before, back in the source
    _merge(merge_src, pg_target, "mg_soft", merge_delete="soft", merge_soft_delete_column="deleted")
    assert pg_exec(pg_target, "SELECT deleted, count(*), min(id), max(id) FROM mg_soft GROUP BY 1 ORDER BY 1") == [
        (False, 1001, 500, 1500), (True, 499, 1, 499)]


def test_merge_from_parquet_uses_a_key_that_is_not_the_primary_key(pg_target, tmp_path: Path) -> None:
    pq.write_table(pa.table({"code": ["a", "b", "c"], "v": [10, 20, 30]}), tmp_path / "f.parquet")
    pg_exec(pg_target, "DROP TABLE IF EXISTS mg_codes", "CREATE TABLE mg_codes (id serial PRIMARY KEY, code text, v int)",
            "INSERT INTO mg_codes (code, v) VALUES ('a', 1), ('z', 26)")
    job({"type": "parquet", "path": str(tmp_path)}, {"type": "postgres", "port": pg_target.port, "table": "mg_codes", "merge_keys": ["code"]},
        "files", load_mode="merge")
    assert pg_exec(pg_target, "SELECT code, v FROM mg_codes ORDER BY code") == [("a", 10), ("b", 20), ("c", 30), ("z", 26)]


def test_duplicate_or_null_source_keys_are_refused_by_name_and_change_nothing(pg_source, pg_target) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS mg_src", SRC, "INSERT INTO mg_src VALUES (600, 'again', 0), (601, 'again', 0), (601, 'thrice', 0)")
    _target(pg_target, "mg_dup")
    before = checksum(pg_target, "mg_dup")
    with pytest.raises(SchemaError, match=r"the same key \(id\) more than once: \(601\) x3; \(600\) x2"):
        _merge(pg_source, pg_target, "mg_dup")
    assert checksum(pg_target, "mg_dup") == before
    pg_exec(pg_source, "DROP TABLE IF EXISTS mg_src", SRC, "ALTER TABLE mg_src ALTER id DROP NOT NULL", "INSERT INTO mg_src VALUES (NULL, 'x', 0)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS mg_null", "CREATE TABLE mg_null (id int, h text, n int)", OLD.format(t="mg_null (id, h, n)"))
    with pytest.raises(SchemaError, match=r"1 source rows have a NULL in the key \(id\)"):
        _merge(pg_source, pg_target, "mg_null", merge_keys=["id"])
    assert pg_exec(pg_target, "SELECT count(*) FROM mg_null") == [(1000,)]


def test_merge_is_refused_before_anything_moves_where_it_cannot_work(merge_src, pg_target, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS mg_nokey", "CREATE TABLE mg_nokey (id int, h text, n int)")
    with pytest.raises(ConfigError, match="has no primary key to merge on"):
        _merge(merge_src, pg_target, "mg_nokey")
    with pytest.raises(ConfigError, match="merge_update: id is a key"):
        _merge(merge_src, pg_target, "mg_nokey", merge_keys=["id"], merge_update=["id"])
    with pytest.raises(ConfigError, match="load_mode=merge: sink parquet does not do it"):
        job({"type": "postgres", "port": merge_src.port, "table": "mg_src"}, {"type": "parquet", "path": str(tmp_path / "o")},
            load_mode="merge")


@pytest.mark.parametrize("verify", ["count", "checksum"])
def test_a_key_the_target_calls_equal_arrives_as_the_source_holds_it(pg_source, pg_target, verify: str) -> None:
    # numeric 1.0 = 1.000: the matched row is updated, and its key takes the source's digits, not the target's old ones
    pg_exec(pg_source, "DROP TABLE IF EXISTS mg_num", "CREATE TABLE mg_num (k numeric PRIMARY KEY, v text)",
            "INSERT INTO mg_num VALUES (1.000, 'one'), (2.5, 'two and a half')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS mg_num_dst", "CREATE TABLE mg_num_dst (k numeric PRIMARY KEY, v text)",
            "INSERT INTO mg_num_dst VALUES (1.0, 'old'), (7, 'kept')")
    job({"type": "postgres", "port": pg_source.port, "table": "mg_num"}, {"type": "postgres", "port": pg_target.port, "table": "mg_num_dst"},
        "none", load_mode="merge", verify=verify)
    assert pg_exec(pg_target, "SELECT k::text, v FROM mg_num_dst ORDER BY k") == [("1.000", "one"), ("2.5", "two and a half"), ("7", "kept")]


def test_an_identity_key_generated_always_is_matched_not_written(pg_source, pg_target) -> None:
    # an UPDATE can set such a column only to DEFAULT: the merge matches on it and updates the other columns
    pg_exec(pg_source, "DROP TABLE IF EXISTS mg_ident", "CREATE TABLE mg_ident (id int PRIMARY KEY, v text)",
            "INSERT INTO mg_ident VALUES (1, 'one'), (2, 'two')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS mg_ident_dst",
            "CREATE TABLE mg_ident_dst (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)",
            "INSERT INTO mg_ident_dst (v) VALUES ('old one'), ('old two'), ('three')")
    job({"type": "postgres", "port": pg_source.port, "table": "mg_ident"},
        {"type": "postgres", "port": pg_target.port, "table": "mg_ident_dst"}, "none", load_mode="merge")
    assert pg_exec(pg_target, "SELECT id, v FROM mg_ident_dst ORDER BY id") == [(1, "one"), (2, "two"), (3, "three")]
