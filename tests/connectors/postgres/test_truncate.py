"""load_mode=truncate: a plan of one partition loads in one transaction (TRUNCATE, then COPY FREEZE
straight into the target: every row written once), a plan of several through a staging table; either
way a failure leaves the old rows, and every partition's count is checked before its rows commit.

How "written once" is seen: COPY FREEZE marks every page all-frozen in the visibility map
(pg_visibility), which rows copied in by INSERT ... SELECT from a stage never are; and on a server
with wal_level=minimal the load writes almost no WAL (pg_current_wal_lsn before and after).
"""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigError, VerificationError
from conveyor.testing.pgserver import PgServer
from tests.helpers import checksum, job, pg_exec

ROWS = 100000


@pytest.fixture(scope="module")
def tr_src(pg_source):
    pg_exec(pg_source, "DROP TABLE IF EXISTS tr_src",
            "CREATE TABLE tr_src AS SELECT g AS id, g % 97 AS grp, md5(g::text) AS h FROM generate_series(1, 100000) g")
    return pg_source


def _src(server) -> dict:
    return {"type": "postgres", "port": server.port, "table": "tr_src"}


def _dst(server, table: str, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


def _target(server, table: str) -> None:
    pg_exec(server, f"DROP TABLE IF EXISTS {table}",
            "DO $$ BEGIN CREATE ROLE tr_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            f"CREATE TABLE {table} (id int PRIMARY KEY, grp int, h text)", f"CREATE INDEX {table}_grp ON {table} (grp)",
            f"GRANT SELECT ON {table} TO tr_reader", f"INSERT INTO {table} VALUES (-1, -1, 'old row')")


def _frozen_pages(server, table: str) -> tuple[int, int]:
    pg_exec(server, "CREATE EXTENSION IF NOT EXISTS pg_visibility")
    return pg_exec(server, f"SELECT all_frozen, pg_relation_size('{table}') / current_setting('block_size')::int "
                           f"FROM pg_visibility_map_summary('{table}')")[0]


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_a_one_partition_truncate_writes_every_row_once_in_one_transaction(tr_src, pg_target, copy_path) -> None:
    _target(pg_target, "tr_once")
    report = job(_src(tr_src), _dst(pg_target, "tr_once", copy_path=copy_path), load_mode="truncate")
    assert checksum(pg_target, "tr_once") == checksum(tr_src, "tr_src")
    assert "truncate in one transaction" in report.sink_plan.path_reason and "COPY FREEZE" in report.sink_plan.path_reason
    frozen, pages = _frozen_pages(pg_target, "tr_once")
    assert pages > 100 and frozen == pages  # COPY FREEZE: the rows went straight into the target, once
    assert report.verification.ok and report.verification.source_rows == ROWS
    # the table kept what it was: its index, its grant
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_indexes WHERE tablename = 'tr_once'") == [(2,)]
    assert pg_exec(pg_target, "SELECT has_table_privilege('tr_reader', 'tr_once', 'SELECT')") == [(True,)]
    # the staged way, for contrast: the rows reach the target by INSERT ... SELECT, not frozen
    _target(pg_target, "tr_once")
    report = job(_src(tr_src), _dst(pg_target, "tr_once", copy_path=copy_path, truncate_method="staged"), load_mode="truncate")
    assert checksum(pg_target, "tr_once") == checksum(tr_src, "tr_src")
    assert "staging table" in report.sink_plan.path_reason or report.sink_plan.write_target != "tr_once"
    assert _frozen_pages(pg_target, "tr_once")[0] == 0


def test_a_failed_truncate_in_one_transaction_leaves_the_old_rows(tr_src, pg_target) -> None:
    _target(pg_target, "tr_fail")
    pg_exec(pg_target, "ALTER TABLE tr_fail ADD CONSTRAINT tr_fail_small CHECK (id < 99000)")
    before = checksum(pg_target, "tr_fail")
    with pytest.raises(Exception, match="tr_fail_small"):
        job(_src(tr_src), _dst(pg_target, "tr_fail"), load_mode="truncate")
    assert checksum(pg_target, "tr_fail") == before


@pytest.mark.parametrize("mode, strategy, params, degree", [
    ("truncate", "none", {}, 1),                                        # one transaction
    ("append", "rangeid", {"distribute_key": "id", "partitions": 3}, 2),  # each partition's own
    ("truncate", "rangeid", {"distribute_key": "id", "partitions": 3}, 2),  # staged, swapped in at the end
])
def test_rows_the_target_silently_drops_fail_the_run_before_anything_commits(tr_src, pg_target, mode, strategy, params,
                                                                            degree) -> None:
    """A BEFORE INSERT trigger that returns NULL for some rows: the server takes fewer rows than it was
    sent and says nothing. The count is checked where the rows commit (the partition's transaction, or
    the staged swap), so the run fails and the target keeps exactly its old rows."""
    _target(pg_target, "tr_drop")
    pg_exec(pg_target, "CREATE OR REPLACE FUNCTION tr_drop_some() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN IF NEW.id % 1000 = 7 THEN RETURN NULL; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER tr_drop_some BEFORE INSERT ON tr_drop FOR EACH ROW EXECUTE FUNCTION tr_drop_some()")
    before = checksum(pg_target, "tr_drop")
    with pytest.raises(VerificationError) as caught:
        job(_src(tr_src), _dst(pg_target, "tr_drop"), strategy, params, load_mode=mode, degree=degree)
    assert "tr_drop" in caught.value.message and "rows" in caught.value.message
    assert checksum(pg_target, "tr_drop") == before


def test_in_place_is_refused_by_name_where_it_cannot_hold(tr_src, pg_target) -> None:
    _target(pg_target, "tr_refuse")
    with pytest.raises(ConfigError, match="the plan has 3 partitions") as caught:
        job(_src(tr_src), _dst(pg_target, "tr_refuse", truncate_method="in_place"), "rangeid",
            {"distribute_key": "id", "partitions": 3}, load_mode="truncate", degree=2)
    assert caught.value.key == "sink.truncate_method" and "strategy=none" in caught.value.hint
    with pytest.raises(ConfigError, match="verify=checksum"):
        job(_src(tr_src), _dst(pg_target, "tr_refuse", truncate_method="in_place"), load_mode="truncate", verify="checksum")
    assert pg_exec(pg_target, "SELECT h FROM tr_refuse") == [("old row",)]


@pytest.mark.slow
def test_a_truncate_in_one_transaction_skips_the_wal_on_a_wal_level_minimal_server(tr_src) -> None:
    """wal_level=minimal: rows copied into a table truncated in the same transaction are not WAL-logged
    (the table is synced at commit; an index under wal_skip_threshold is logged whole at commit).
    The staged way skips it too (its stage is UNLOGGED and its final INSERT follows a TRUNCATE in the
    same transaction), but writes the heap twice; the frozen-pages test above tells the two apart."""
    with PgServer("walmin", password=tr_src.password, settings={"wal_level": "minimal", "max_wal_senders": "0"}) as server:
        _target(server, "tr_wal")
        lsn = pg_exec(server, "SELECT pg_current_wal_lsn()")[0][0]
        report = job(_src(tr_src), _dst(server, "tr_wal"), load_mode="truncate")
        wal = pg_exec(server, f"SELECT pg_current_wal_lsn() - '{lsn}'::pg_lsn")[0][0]
        assert checksum(server, "tr_wal") == checksum(tr_src, "tr_src")
        assert "truncate in one transaction" in report.sink_plan.path_reason
        size = pg_exec(server, "SELECT pg_total_relation_size('tr_wal')")[0][0]
        print(f"WAL bytes {wal:,} for a table of {size:,} bytes (indexes included)")
        assert size > 5e6 and wal < size * 0.2
