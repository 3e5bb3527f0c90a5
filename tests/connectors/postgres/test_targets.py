"""Targets that scale: partitioned tables (range, list, hash, multi-level, default), pg_partman,
non-heap access methods. Every load is checked for exact coverage (count + content checksum).

Citus is not installable here: a table access method made on the heap handler
(`CREATE ACCESS METHOD x TYPE TABLE HANDLER heap_tableam_handler`) stands in for a columnar one;
it exercises the catalog paths (pg_am, USING, relam), not columnar storage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.errors import ConfigError, PlanningError, SchemaError, TransferError
from tests.helpers import checksum, job, pg_exec

ROWS = 20000


@pytest.fixture(scope="module")
def events(pg_source):
    """20,000 events over 2026 (two days a row apart... a timestamp, a region and an id)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tg_events",
            "CREATE TABLE tg_events AS SELECT g AS id, timestamp '2026-01-01' + (g % 365) * interval '1 day' AS ts, "
            "(ARRAY['eu','us','ap'])[1 + g % 3] AS region, md5(g::text) AS h FROM generate_series(1, 20000) g")
    return pg_source


def _src(server, table: str = "tg_events") -> dict:
    return {"type": "postgres", "port": server.port, "table": table}


def _dst(server, table: str, **kw) -> dict:
    return {"type": "postgres", "port": server.port, "table": table, **kw}


def _same(src, dst, table: str, target: str) -> None:
    assert checksum(dst, target) == checksum(src, table)


def test_range_hash_list_and_default_partitions_hold_every_row_once(events, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_multi CASCADE",
            "CREATE TABLE tg_multi (id int, ts timestamp, region text, h text) PARTITION BY RANGE (ts)",
            "CREATE TABLE tg_multi_h1 PARTITION OF tg_multi FOR VALUES FROM ('2026-01-01') TO ('2026-07-01') PARTITION BY HASH (id)",
            "CREATE TABLE tg_multi_h1_0 PARTITION OF tg_multi_h1 FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
            "CREATE TABLE tg_multi_h1_1 PARTITION OF tg_multi_h1 FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
            "CREATE TABLE tg_multi_h2 PARTITION OF tg_multi FOR VALUES FROM ('2026-07-01') TO ('2026-10-01') PARTITION BY LIST (region)",
            "CREATE TABLE tg_multi_h2_eu PARTITION OF tg_multi_h2 FOR VALUES IN ('eu')",
            "CREATE TABLE tg_multi_h2_rest PARTITION OF tg_multi_h2 DEFAULT",
            "CREATE TABLE tg_multi_default PARTITION OF tg_multi DEFAULT")
    for mode in ("truncate", "append"):
        if mode == "append":
            pg_exec(pg_target, "TRUNCATE tg_multi")
        job(_src(events), _dst(pg_target, "tg_multi"), "rangeid", {"distribute_key": "id", "partitions": 4}, load_mode=mode, degree=2)
        _same(events, pg_target, "tg_events", "tg_multi")
    leaves = dict(pg_exec(pg_target, "SELECT tableoid::regclass::text, count(*) FROM tg_multi GROUP BY 1"))
    assert set(leaves) == {"tg_multi_h1_0", "tg_multi_h1_1", "tg_multi_h2_eu", "tg_multi_h2_rest", "tg_multi_default"}
    assert leaves["tg_multi_default"] == pg_exec(events, "SELECT count(*) FROM tg_events WHERE ts >= '2026-10-01'")[0][0]


def test_a_row_outside_every_bound_fails_clearly_and_leaves_the_target_as_it_was(events, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_nodef CASCADE",
            "CREATE TABLE tg_nodef (id int, ts timestamp, region text, h text) PARTITION BY RANGE (ts)",
            "CREATE TABLE tg_nodef_a PARTITION OF tg_nodef FOR VALUES FROM ('2026-01-01') TO ('2026-12-01')",
            "INSERT INTO tg_nodef VALUES (0, '2026-02-02', 'eu', 'old row')")
    before = checksum(pg_target, "tg_nodef")
    with pytest.raises(TransferError) as caught:
        job(_src(events), _dst(pg_target, "tg_nodef"), "rangeid", {"distribute_key": "id", "partitions": 4}, load_mode="truncate", degree=2)
    assert "no partition of relation" in caught.value.message and "tg_nodef" in caught.value.message
    assert "DEFAULT partition" in caught.value.hint and "run_maintenance" in caught.value.hint
    assert "2026-12" not in caught.value.message  # the failing row's key value is not repeated in the message
    assert checksum(pg_target, "tg_nodef") == before


def test_a_pg_partman_parent_loads_every_row_and_says_where_uncovered_rows_went(pg_source, pg_target, capsys) -> None:
    """A parent made by partman.create_parent (monthly, premake 3: partitions up to three months
    from now): rows of later months go to the default partition partman created, the run says so,
    and partman's partition_data_time then moves them into the partitions it makes."""
    control = list(Path("/usr/share/postgresql").glob("*/extension/pg_partman.control"))
    assert control, "pg_partman is not installed: scripts/ensure-postgres.sh (make test) installs postgresql-<version>-partman"
    pg_exec(pg_source, "DROP TABLE IF EXISTS tg_future",
            "CREATE TABLE tg_future AS SELECT g AS id, date_trunc('month', now())::timestamp + (g % 730) * interval '1 day' AS ts, "
            "md5(g::text) AS h FROM generate_series(1, 20000) g")
    pg_exec(pg_target, "CREATE SCHEMA IF NOT EXISTS partman", "CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman",
            "DROP TABLE IF EXISTS public.tg_partman CASCADE", "DELETE FROM partman.part_config WHERE parent_table = 'public.tg_partman'",
            "CREATE TABLE public.tg_partman (id int, ts timestamp NOT NULL, h text) PARTITION BY RANGE (ts)")
    pg_exec(pg_target, "SELECT partman.create_parent(p_parent_table => 'public.tg_partman', p_control => 'ts', p_type => 'native', "
                       "p_interval => 'monthly', p_premake => 3)")
    covered_until = pg_exec(pg_target, "SELECT max(upper(r)) FROM (SELECT tsrange((regexp_match(pg_get_expr(c.relpartbound, c.oid), "
                                       "'FROM \\(''([^'']+)''\\) TO'))[1]::timestamp, (regexp_match(pg_get_expr(c.relpartbound, c.oid), "
                                       "'TO \\(''([^'']+)''\\)'))[1]::timestamp) r FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                       "WHERE i.inhparent = 'public.tg_partman'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT') x")[0][0]
    job(_src(pg_source, "tg_future"), _dst(pg_target, "tg_partman"), "rangeid", {"distribute_key": "id", "partitions": 4},
        load_mode="append", degree=2)
    _same(pg_source, pg_target, "tg_future", "tg_partman")
    in_default = pg_exec(pg_target, "SELECT count(*) FROM public.tg_partman_default")[0][0]
    assert in_default == pg_exec(pg_source, f"SELECT count(*) FROM tg_future WHERE ts >= '{covered_until}'")[0][0] > 0
    err = capsys.readouterr().err
    assert f"public.tg_partman_default, the default partition of public.tg_partman, holds {in_default:,} rows" in err
    # partman's own way to empty its default: make the missing partitions and move the rows there
    pg_exec(pg_target, "SELECT partman.partition_data_time('public.tg_partman', p_batch_count => 40)")
    assert pg_exec(pg_target, "SELECT count(*) FROM public.tg_partman_default")[0][0] == 0
    _same(pg_source, pg_target, "tg_future", "tg_partman")


def test_create_and_replace_take_an_access_method(events, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_am_new", "DROP TABLE IF EXISTS tg_am_swap",
            "DROP ACCESS METHOD IF EXISTS tg_columnar", "CREATE ACCESS METHOD tg_columnar TYPE TABLE HANDLER heap_tableam_handler",
            "CREATE TABLE tg_am_swap (id int, ts timestamp, region text, h text)")
    job(_src(events), _dst(pg_target, "tg_am_new", access_method="tg_columnar"), load_mode="create")
    job(_src(events), _dst(pg_target, "tg_am_swap", access_method="tg_columnar"), load_mode="replace")
    ams = dict(pg_exec(pg_target, "SELECT c.relname, a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
                                  "WHERE c.relname IN ('tg_am_new', 'tg_am_swap')"))
    assert ams == {"tg_am_new": "tg_columnar", "tg_am_swap": "tg_columnar"}
    _same(events, pg_target, "tg_events", "tg_am_new")
    _same(events, pg_target, "tg_events", "tg_am_swap")
    # replace again without the key keeps the access method the table now has
    job(_src(events), _dst(pg_target, "tg_am_swap"), load_mode="replace")
    assert pg_exec(pg_target, "SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relname = 'tg_am_swap'") == [("tg_columnar",)]
    with pytest.raises(SchemaError, match=r"table access method .columnar. does not exist \(there: heap, (.*, )?tg_columnar"):
        job(_src(events), _dst(pg_target, "tg_am_x", access_method="columnar"), load_mode="create")
    with pytest.raises(ConfigError, match="applies to load_mode=create or replace"):
        job(_src(events), _dst(pg_target, "tg_am_swap", access_method="tg_columnar"), load_mode="append")


def test_a_non_heap_source_refuses_ctid_and_auto_falls_back(pg_source, pg_target) -> None:
    pg_exec(pg_source, "DROP TABLE IF EXISTS tg_col_src", "DROP ACCESS METHOD IF EXISTS tg_src_columnar",
            "CREATE ACCESS METHOD tg_src_columnar TYPE TABLE HANDLER heap_tableam_handler",
            "CREATE TABLE tg_col_src (id int, h text) USING tg_src_columnar",
            "INSERT INTO tg_col_src SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_col_dst", "CREATE TABLE tg_col_dst (id int, h text)")
    with pytest.raises(PlanningError, match="tg_src_columnar table"):
        job(_src(pg_source, "tg_col_src"), _dst(pg_target, "tg_col_dst"), "ctid", load_mode="append")
    report = job(_src(pg_source, "tg_col_src"), _dst(pg_target, "tg_col_dst"), "auto", {"distribute_key": "id"}, load_mode="truncate", degree=2)
    assert "rangeid" in report.plan.note and len(report.plan.partitions) > 1
    _same(pg_source, pg_target, "tg_col_src", "tg_col_dst")


def _most_streams_while(server, table: str, run) -> int:
    """The most COPYs into ``table`` seen at once on ``server`` (pg_stat_activity, polled) while ``run()`` runs."""
    import threading
    import time

    seen, done = [0], threading.Event()

    def poll() -> None:
        deadline = time.monotonic() + 300
        while not done.is_set() and time.monotonic() < deadline:
            n = pg_exec(server, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'conveyor' "
                                f"AND query ILIKE '%COPY%{table}%' AND state = 'active'")[0][0]
            seen[0] = max(seen[0], n)
            time.sleep(0.02)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        run()
    finally:
        done.set()
        watcher.join(10)
    return seen[0]


@pytest.fixture(scope="module")
def eight_files(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("eight")
    for i in range(8):
        pq.write_table(pa.table({"n": pa.array(range(i * 1500, (i + 1) * 1500), pa.int64())}), folder / f"f{i}.parquet")
    return folder


@pytest.mark.parametrize("cap", [0, 1, 2])
def test_max_streams_caps_the_writers_into_one_target(pg_target, eight_files, cap) -> None:
    """8 files at degree 4 into a table whose row trigger sleeps (each COPY lasts about a second, so
    they overlap): with sink.max_streams=N never more than N COPYs run at once; without, more do."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_capped", "CREATE TABLE tg_capped (n bigint)",
            "CREATE OR REPLACE FUNCTION tg_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.0005); RETURN NEW; END $$",
            "CREATE TRIGGER tg_slow BEFORE INSERT ON tg_capped FOR EACH ROW EXECUTE FUNCTION tg_slow()")
    most = _most_streams_while(pg_target, "tg_capped", lambda: job({"type": "parquet", "path": str(eight_files)},
                                                                   _dst(pg_target, "tg_capped", max_streams=cap), "files",
                                                                   load_mode="append", degree=4))
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT n) FROM tg_capped")[0] == (12000, 12000)
    if cap:
        assert 1 <= most <= cap, most
    else:
        assert most > 2, most  # the watcher does see overlapping COPYs when nothing caps them


def _indexes(server, table: str) -> list[str]:
    return sorted(r[0] for r in pg_exec(server, f"SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = '{table}'::regclass"))


def test_the_index_rebuild_recipe_leaves_the_target_exactly_as_before_plus_the_rows(events, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_idx", "DROP ROLE IF EXISTS tg_reader", "CREATE ROLE tg_reader",
            "CREATE UNLOGGED TABLE tg_idx (id int PRIMARY KEY, ts timestamp, region text, h text)",
            "CREATE INDEX tg_idx_ts ON tg_idx (ts)", "CREATE UNIQUE INDEX tg_idx_h ON tg_idx (h)",
            "CREATE INDEX tg_idx_region_lower ON tg_idx (lower(region)) WHERE region <> 'eu'",
            "GRANT SELECT ON tg_idx TO tg_reader", "INSERT INTO tg_idx VALUES (-1, now(), 'old', 'old row')")
    indexes = _indexes(pg_target, "tg_idx")
    assert len(indexes) == 4
    job(_src(events), _dst(pg_target, "tg_idx", rebuild_indexes=True), "rangeid", {"distribute_key": "id", "partitions": 4},
        load_mode="truncate", degree=2)
    _same(events, pg_target, "tg_events", "tg_idx")
    assert _indexes(pg_target, "tg_idx") == indexes
    assert pg_exec(pg_target, "SELECT relpersistence FROM pg_class WHERE relname = 'tg_idx'") == [("u",)]
    assert pg_exec(pg_target, "SELECT has_table_privilege('tg_reader', 'tg_idx', 'SELECT')") == [(True,)]
    assert pg_exec(pg_target, "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                              "WHERE i.indrelid = 'tg_idx'::regclass AND NOT i.indisvalid") == [(0,)]
    # a rebuild that fails (the unique index meets a duplicate) rolls back the whole swap: old rows, old indexes
    pg_exec(events, "DROP TABLE IF EXISTS tg_dup", "CREATE TABLE tg_dup AS SELECT id, ts, region, CASE WHEN id IN (5, 6) THEN 'same' "
                    "ELSE h END AS h FROM tg_events")
    before = checksum(pg_target, "tg_idx")
    with pytest.raises(TransferError, match="tg_idx_h"):
        job(_src(events, "tg_dup"), _dst(pg_target, "tg_idx", rebuild_indexes=True), load_mode="truncate")
    assert checksum(pg_target, "tg_idx") == before and _indexes(pg_target, "tg_idx") == indexes
    with pytest.raises(ConfigError, match="applies to load_mode=truncate"):
        job(_src(events), _dst(pg_target, "tg_idx", rebuild_indexes=True), load_mode="append")


@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_an_aligned_plan_writes_each_range_straight_into_its_partition(events, pg_target, copy_path) -> None:
    """strategy=rangeid strategy.align=true: one source range per target partition (monthly; June
    has none, so its rows go to the default), each written straight into its partition: only the
    ranges no partition matches (the open ends, June) go through the parent, as a statement-level
    trigger on the parent counts. Rows exact either way."""
    months = [f"2026-{m:02d}-01" for m in range(1, 13)] + ["2027-01-01"]
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_aligned CASCADE", "DROP TABLE IF EXISTS tg_parent_copies",
            "CREATE TABLE tg_parent_copies (at timestamptz DEFAULT now())",
            "CREATE TABLE tg_aligned (id int, ts timestamp, region text, h text) PARTITION BY RANGE (ts)",
            *[f"CREATE TABLE tg_aligned_{i} PARTITION OF tg_aligned FOR VALUES FROM ('{months[i]}') TO ('{months[i + 1]}')"
              for i in range(12) if i != 5],
            "CREATE TABLE tg_aligned_default PARTITION OF tg_aligned DEFAULT",
            "CREATE OR REPLACE FUNCTION tg_count_parent() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO tg_parent_copies DEFAULT VALUES; RETURN NULL; END $$",
            "CREATE TRIGGER tg_count_parent AFTER INSERT ON tg_aligned FOR EACH STATEMENT EXECUTE FUNCTION tg_count_parent()")
    report = job(_src(events), _dst(pg_target, "tg_aligned", copy_path=copy_path), "rangeid", {"align": True}, load_mode="append", degree=2)
    _same(events, pg_target, "tg_events", "tg_aligned")
    assert "aligned with the target's 11 range partitions on ts" in report.plan.note
    assert len(report.plan.partitions) == 14  # below January, the 12 months (June among them), from 2027 on
    assert pg_exec(pg_target, "SELECT count(*) FROM tg_parent_copies") == [(3,)]  # the two open ends and June
    in_default = pg_exec(pg_target, "SELECT min(ts)::date::text, max(ts)::date::text FROM tg_aligned_default")[0]
    assert in_default == ("2026-06-01", "2026-06-30")
    # the same job planned by the source's own ranges sends every partition through the parent
    pg_exec(pg_target, "TRUNCATE tg_aligned", "TRUNCATE tg_parent_copies")
    job(_src(events), _dst(pg_target, "tg_aligned", copy_path=copy_path), "rangeid", {"distribute_key": "ts", "partitions": 4},
        load_mode="append", degree=2)
    _same(events, pg_target, "tg_events", "tg_aligned")
    assert pg_exec(pg_target, "SELECT count(*) FROM tg_parent_copies") == [(4,)]


def test_align_is_refused_by_name_where_the_target_has_no_range_partitions(events, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_flat", "CREATE TABLE tg_flat (id int, ts timestamp, region text, h text)")
    with pytest.raises(PlanningError, match="strategy.align: the target is not a table partitioned by range on one column"):
        job(_src(events), _dst(pg_target, "tg_flat"), "rangeid", {"align": True}, load_mode="append")
    with pytest.raises(ConfigError, match="the target is partitioned on 'ts', not on distribute_key 'id'"):
        job(_src(events), _dst(pg_target, "tg_aligned"), "rangeid", {"align": True, "distribute_key": "id"}, load_mode="append")


def test_a_columnar_target_gets_partitions_of_whole_stripes(pg_source, pg_target, caplog) -> None:
    """Citus columnar makes one stripe per transaction (up to stripe_row_limit rows): the plan keeps
    each partition at least a stripe long. The heap-handler stand-in has no columnar.options, so
    sink.stripe_rows says the stripe's rows (with Citus they are read from columnar.options)."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tg_wide", "CREATE TABLE tg_wide AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 400000) g",
            "ANALYZE tg_wide")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_stripes", "DROP TABLE IF EXISTS tg_heap", "DROP ACCESS METHOD IF EXISTS tg_striped",
            "CREATE ACCESS METHOD tg_striped TYPE TABLE HANDLER heap_tableam_handler",
            "CREATE TABLE tg_stripes (id int, h text) USING tg_striped", "CREATE TABLE tg_heap (id int, h text)")
    heap = job(_src(pg_source, "tg_wide"), _dst(pg_target, "tg_heap", stripe_rows=250000), "ctid", load_mode="append", degree=2)
    assert len(heap.plan.partitions) == 2  # a heap target: a range per stream (a small table)
    caplog.set_level("INFO", logger="conveyor")
    columnar = job(_src(pg_source, "tg_wide"), _dst(pg_target, "tg_stripes", stripe_rows=250000), "ctid", load_mode="append", degree=2)
    assert len(columnar.plan.partitions) == 1 and all(r.rows >= 250000 for r in columnar.results)
    assert "1 partition(s) instead of 2: the tg_striped target public.tg_stripes (a stripe holds one transaction's rows, up to 250,000" in caplog.text
    _same(pg_source, pg_target, "tg_wide", "tg_stripes")
    # create with an access method, and a plan that asks for more partitions than stripes allow: said, then done as asked
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_stripes_new")
    made = job(_src(pg_source, "tg_wide"), _dst(pg_target, "tg_stripes_new", access_method="tg_striped", stripe_rows=100000), "ctid",
               {"partitions": 10}, load_mode="create", degree=2)
    assert len(made.plan.partitions) == 10
    assert "partitions=10 of about 40,000 rows each: the tg_striped target public.tg_stripes_new" in caplog.text
    _same(pg_source, pg_target, "tg_wide", "tg_stripes_new")


def test_the_analyze_recipe_leaves_fresh_statistics_and_the_target_as_before_plus_the_rows(events, pg_target) -> None:
    """sink.analyze=true: ANALYZE after the load's commit, so the planner knows the new rows at once
    (not when autovacuum gets to them): the estimate for a range of days matches the rows loaded."""
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_an", "CREATE TABLE tg_an (id int PRIMARY KEY, ts timestamp, region text, h text)",
            "ALTER TABLE tg_an SET (autovacuum_enabled = false)", "GRANT SELECT ON tg_an TO PUBLIC")
    before = pg_exec(pg_target, "SELECT relacl::text, relpersistence, (SELECT count(*) FROM pg_index WHERE indrelid = 'tg_an'::regclass) "
                                "FROM pg_class WHERE oid = 'tg_an'::regclass")
    job(_src(events), _dst(pg_target, "tg_an", analyze=True), "rangeid", {"distribute_key": "id", "partitions": 4}, load_mode="append", degree=2)
    _same(events, pg_target, "tg_events", "tg_an")
    analyzed, reltuples = pg_exec(pg_target, "SELECT s.last_analyze IS NOT NULL, c.reltuples FROM pg_stat_user_tables s "
                                             "JOIN pg_class c ON c.oid = s.relid WHERE s.relname = 'tg_an'")[0]
    assert analyzed and reltuples == ROWS
    plan = pg_exec(pg_target, "EXPLAIN (FORMAT JSON) SELECT * FROM tg_an WHERE ts < '2026-02-01'")[0][0]
    estimate = plan[0]["Plan"]["Plan Rows"]
    actual = pg_exec(pg_target, "SELECT count(*) FROM tg_an WHERE ts < '2026-02-01'")[0][0]
    assert abs(estimate - actual) <= actual * 0.2, (estimate, actual)
    assert pg_exec(pg_target, "SELECT relacl::text, relpersistence, (SELECT count(*) FROM pg_index WHERE indrelid = 'tg_an'::regclass) "
                              "FROM pg_class WHERE oid = 'tg_an'::regclass") == before


@pytest.mark.parametrize("mode, strategy", [("truncate", "ctid"), ("truncate", "none"), ("append", "ctid")])
def test_a_target_with_an_always_identity_and_a_generated_column_takes_the_source_s_values(pg_source, pg_target, mode: str,
                                                                                           strategy: str) -> None:
    """A target made as the source was (a migration's, or a user's DDL): its GENERATED ALWAYS identity takes the source's
    ids (the staged truncate's final INSERT says OVERRIDING SYSTEM VALUE; on main it failed "cannot insert a non-DEFAULT
    value into column id"), and its generated column computes its own values from the same expression (not written)."""
    ddl = ("id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, qty int, price numeric(12, 2), "
           "total numeric GENERATED ALWAYS AS (qty * price) STORED")
    pg_exec(pg_source, "DROP TABLE IF EXISTS tg_ident", f"CREATE TABLE tg_ident ({ddl})",
            "INSERT INTO tg_ident (qty, price) SELECT g % 9 + 1, g / 7.0 FROM generate_series(1, 5000) g",
            "DELETE FROM tg_ident WHERE id % 10 = 0")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tg_ident_copy", f"CREATE TABLE tg_ident_copy ({ddl})")
    report = job(_src(pg_source, "tg_ident"), _dst(pg_target, "tg_ident_copy"), strategy=strategy,
                 strategy_params={"partitions": 3} if strategy == "ctid" else None, load_mode=mode, degree=2)
    assert report.rows == 4500 and report.verification.ok
    _same(pg_source, pg_target, "tg_ident", "tg_ident_copy")
    assert pg_exec(pg_target, "SELECT count(*) FILTER (WHERE total = qty * price), max(id) FROM tg_ident_copy") == [(4500, 4999)]
