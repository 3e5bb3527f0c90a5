"""Rows routed on the client into a partitioned target's leaves (sink.routing=leaves).

Every routed load is compared with the same rows routed by the server through the parent (a twin
tree, sink.routing=parent): the same rows in the same leaves, row for row, and the content
checksum of the source. PostgreSQL also checks each row written straight into a partition against
its bounds, so a wrong leaf fails the load; these tests check the placement itself as well.
"""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigError, SchemaError, TransferError
from conveyor.pipelines.job import run_job
from tests.helpers import checksum, job, pg_exec
from tests.runtime.faults import ray_spec, with_fault_source

pytestmark = pytest.mark.pg_versions  # on PostgreSQL 15 and 18

ROWS = 30000


@pytest.fixture(scope="module")
def keys(pg_source):
    """Every key type the client routes, with NULLs, negatives, zero dates and times before 2000."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS rt_keys",
            "CREATE TABLE rt_keys AS SELECT g AS id, "
            "CASE WHEN g % 97 = 0 THEN NULL ELSE ((g * 7919) % 65536 - 32768)::int2 END AS small, "
            "CASE WHEN g % 89 = 0 THEN NULL ELSE g * 104729::int8 * (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END) * 40961 END AS big, "
            "date '1999-12-25' + (g % 400) AS day, "
            "timestamp '1999-12-31 23:00' + g * interval '17 minutes 3.000123 seconds' AS at, "
            "timestamptz '2026-03-29 00:30+00' + g * interval '1 minute' AS at_tz, "
            "(ARRAY['eu', 'us', 'ap', 'it''s', NULL])[1 + g % 5] AS region, md5(g::text) AS h "
            "FROM generate_series(1, 30000) g")
    return pg_source


def _placement(server, table: str) -> list[tuple]:
    """(leaf name without its tree's prefix, id) for every row: where each row went."""
    return sorted(pg_exec(server, f"SELECT split_part(tableoid::regclass::text, '__', 2), id FROM {table}"))


def _twin(server, name: str, ddl: list[str]) -> None:
    """The same partition tree twice (name and name_p); ddl uses {t} for the tree's prefix."""
    for t in (name, f"{name}_p"):
        pg_exec(server, f"DROP TABLE IF EXISTS {t} CASCADE", *[d.format(t=t) for d in ddl])


def _load_both(src, dst, name: str, strategy: str = "rangeid", params: dict | None = None, **options):
    params = params if params is not None else {"distribute_key": "id", "partitions": 3}
    reports = {}
    for t, routing in ((name, "leaves"), (f"{name}_p", "parent")):
        reports[routing] = job({"type": "postgres", "port": src.port, "table": "rt_keys"},
                               {"type": "postgres", "port": dst.port, "table": t, "routing": routing}, strategy, params, **options)
        assert checksum(dst, t) == checksum(src, "rt_keys")
    assert _placement(dst, name) == _placement(dst, f"{name}_p")
    return reports


COLS = "id int, small int2, big int8, day date, at timestamp, at_tz timestamptz, region text, h text"


def test_hash_partitions_of_every_key_type_get_the_rows_the_server_would_give_them(keys, pg_target) -> None:
    """PostgreSQL's partition hash (lookup3 with its seed, hash_combine64 over several columns, a
    NULL column adding nothing), computed by numpy, for int2, int8, date, timestamp and timestamptz."""
    for column in ("small", "big", "day", "at", "at_tz", "small, big, day"):
        ddl = [f"CREATE TABLE {{t}} ({COLS}) PARTITION BY HASH ({column})",
               *[f"CREATE TABLE {{t}}__{r} PARTITION OF {{t}} FOR VALUES WITH (MODULUS 5, REMAINDER {r})" for r in range(5)]]
        _twin(pg_target, "rt_hash", ddl)
        report = _load_both(keys, pg_target, "rt_hash", load_mode="append")["leaves"]
        assert "rows routed on the client into 5 partitions (hash on" in report.sink_plan.path_reason
        counts = [n for _, n in pg_exec(pg_target, "SELECT tableoid, count(*) FROM rt_hash GROUP BY 1")]
        assert len(counts) == 5 and min(counts) > ROWS / 10  # spread over every partition, not all in one


def test_range_list_hash_levels_with_defaults_hold_every_row_where_the_server_puts_it(keys, pg_target) -> None:
    ddl = [f"CREATE TABLE {{t}} ({COLS}) PARTITION BY RANGE (at)",
           "CREATE TABLE {t}__old PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO ('2000-01-01')",
           "CREATE TABLE {t}__a PARTITION OF {t} FOR VALUES FROM ('2000-01-01') TO ('2000-03-01') PARTITION BY HASH (big)",
           *[f"CREATE TABLE {{t}}__a{r} PARTITION OF {{t}}__a FOR VALUES WITH (MODULUS {m}, REMAINDER {r})"
             for m, r in ((4, 0), (4, 1), (4, 3))],
           "CREATE TABLE {t}__b PARTITION OF {t} FOR VALUES FROM ('2000-03-01') TO ('2000-05-01') PARTITION BY LIST (region)",
           "CREATE TABLE {t}__b_eu PARTITION OF {t}__b FOR VALUES IN ('eu', 'it''s')",
           "CREATE TABLE {t}__b_null PARTITION OF {t}__b FOR VALUES IN (NULL, 'ap')",
           "CREATE TABLE {t}__b_rest PARTITION OF {t}__b DEFAULT",
           "CREATE TABLE {t}__c PARTITION OF {t} FOR VALUES FROM ('2000-05-01') TO ('2000-06-01') PARTITION BY LIST (small)",
           "CREATE TABLE {t}__c1 PARTITION OF {t}__c FOR VALUES IN (-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)",
           "CREATE TABLE {t}__c_rest PARTITION OF {t}__c DEFAULT",
           "CREATE TABLE {t}__late PARTITION OF {t} FOR VALUES FROM ('2000-06-01') TO (MAXVALUE) PARTITION BY RANGE (day)",
           "CREATE TABLE {t}__late_a PARTITION OF {t}__late FOR VALUES FROM (MINVALUE) TO ('2000-06-15')",
           "CREATE TABLE {t}__late_b PARTITION OF {t}__late FOR VALUES FROM ('2000-06-15') TO ('2000-12-01')",
           "CREATE TABLE {t}__late_rest PARTITION OF {t}__late DEFAULT",
           "CREATE TABLE {t}__default PARTITION OF {t} DEFAULT"]
    _twin(pg_target, "rt_multi", ddl)
    # the hash level lacks remainders 2 of 4: those rows fit no partition there, and it has no default
    with pytest.raises(TransferError) as caught:
        _load_both(keys, pg_target, "rt_multi", load_mode="append")
    assert "no partition of relation public.rt_multi__a found for" in caught.value.message and "partition key big" in caught.value.message
    assert "DEFAULT partition" in caught.value.hint
    pg_exec(pg_target, "CREATE TABLE rt_multi__a2 PARTITION OF rt_multi__a FOR VALUES WITH (MODULUS 4, REMAINDER 2)",
            "CREATE TABLE rt_multi_p__a2 PARTITION OF rt_multi_p__a FOR VALUES WITH (MODULUS 4, REMAINDER 2)",
            "TRUNCATE rt_multi", "TRUNCATE rt_multi_p")
    reports = _load_both(keys, pg_target, "rt_multi", load_mode="append", degree=2)
    assert "rows routed on the client into 14 partitions (range on at > hash on big)" in reports["leaves"].sink_plan.path_reason
    assert "rows routed on the client" not in reports["parent"].sink_plan.path_reason
    leaves = {leaf for leaf, _ in _placement(pg_target, "rt_multi")}
    assert leaves == {"old", "a0", "a1", "a2", "a3", "b_eu", "b_null", "b_rest", "c1", "c_rest", "late_a", "late_b", "late_rest"}
    assert not pg_exec(pg_target, "SELECT 1 FROM rt_multi__default")  # 'late' takes every later row


def test_a_row_outside_every_bound_fails_by_the_partition_key_and_a_truncate_keeps_the_old_rows(keys, pg_target) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS rt_gap CASCADE",
            f"CREATE TABLE rt_gap ({COLS}) PARTITION BY RANGE (day)",
            "CREATE TABLE rt_gap__a PARTITION OF rt_gap FOR VALUES FROM ('1999-01-01') TO ('2000-06-01')",
            "CREATE TABLE rt_gap__b PARTITION OF rt_gap FOR VALUES FROM ('2000-06-02') TO ('2001-06-01')",
            "INSERT INTO rt_gap (id, day) VALUES (0, '2000-01-01')")
    before = checksum(pg_target, "rt_gap")
    with pytest.raises(TransferError) as caught:  # 2000-06-01 falls between the two partitions
        job({"type": "postgres", "port": keys.port, "table": "rt_keys"},
            {"type": "postgres", "port": pg_target.port, "table": "rt_gap", "routing": "leaves"}, load_mode="truncate")
    msg = caught.value.message
    assert "no partition of relation public.rt_gap found for 75 row(s) (partition key day)" in msg, msg
    assert "2000-06-01" not in msg and "run_maintenance" in caught.value.hint
    assert checksum(pg_target, "rt_gap") == before


def test_levels_the_client_cannot_route_are_routed_by_the_server_and_the_plan_says_so(keys, pg_target, cli) -> None:
    ddl = [f"CREATE TABLE {{t}} ({COLS}) PARTITION BY LIST (region)",
           "CREATE TABLE {t}__eu PARTITION OF {t} FOR VALUES IN ('eu') PARTITION BY RANGE (h)",
           "CREATE TABLE {t}__eu_lo PARTITION OF {t}__eu FOR VALUES FROM (MINVALUE) TO ('8')",
           "CREATE TABLE {t}__eu_hi PARTITION OF {t}__eu FOR VALUES FROM ('8') TO (MAXVALUE)",
           "CREATE TABLE {t}__rest PARTITION OF {t} DEFAULT PARTITION BY HASH (h)",
           *[f"CREATE TABLE {{t}}__rest{r} PARTITION OF {{t}}__rest FOR VALUES WITH (MODULUS 3, REMAINDER {r})" for r in range(3)]]
    _twin(pg_target, "rt_text", ddl)
    report = _load_both(keys, pg_target, "rt_text", load_mode="append")["leaves"]
    assert "rows routed on the client into 2 partitions (list on region)" in report.sink_plan.path_reason
    assert "the server routes below public.rt_text__eu (it is partitioned by a range of text" in report.sink_plan.path_reason
    assert {leaf for leaf, _ in _placement(pg_target, "rt_text")} == {"eu_lo", "eu_hi", "rest0", "rest1", "rest2"}
    res = cli("plan", "pipeline=pg_to_pg", f"source.port={keys.port}", "source.table=rt_keys", f"sink.port={pg_target.port}",
              "sink.table=rt_text", "sink.routing=leaves", "load_mode=append")
    assert res.code == 0, res.err
    assert "rows routed on the client into 2 partitions (list on region)" in " ".join(res.out.split())


def test_auto_routes_through_the_parent_where_rows_in_the_leaves_would_behave_otherwise(keys, pg_target) -> None:
    base = [f"CREATE TABLE rt_auto ({COLS}) PARTITION BY RANGE (id)",
            "CREATE TABLE rt_auto__a PARTITION OF rt_auto FOR VALUES FROM (MINVALUE) TO (10000)",
            "CREATE TABLE rt_auto__b PARTITION OF rt_auto FOR VALUES FROM (10000) TO (MAXVALUE)"]
    src = {"type": "postgres", "port": keys.port, "table": "rt_keys"}
    dst = {"type": "postgres", "port": pg_target.port, "table": "rt_auto"}
    pg_exec(pg_target, "DROP TABLE IF EXISTS rt_auto CASCADE", *base)
    # no index anywhere: the pass-through through the parent costs less than decoding to route (make bench)
    assert "through the parent (no partition has an index" in job(src, dst, load_mode="append").sink_plan.path_reason
    pg_exec(pg_target, "TRUNCATE rt_auto", "CREATE INDEX ON rt_auto (day)")
    assert "rows routed on the client into 2 partitions (range on id)" in job(src, dst, load_mode="append").sink_plan.path_reason
    base.append("CREATE INDEX ON rt_auto (day)")
    # a statement-level trigger on the parent fires only for a COPY that names the parent
    pg_exec(pg_target, "DROP TABLE IF EXISTS rt_auto CASCADE", *base, "CREATE TABLE rt_auto_log (n int)",
            "CREATE OR REPLACE FUNCTION rt_auto_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO rt_auto_log VALUES (1); RETURN NULL; END $$",
            "CREATE TRIGGER rt_auto_stmt AFTER INSERT ON rt_auto FOR EACH STATEMENT EXECUTE FUNCTION rt_auto_log()")
    report = job(src, dst, load_mode="append")
    assert "through the parent (public.rt_auto has a statement-level INSERT trigger" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT count(*) FROM rt_auto_log")[0][0] == 1
    with pytest.raises(SchemaError, match="sink.routing=leaves is not possible: public.rt_auto has a statement-level INSERT trigger"):
        job(src, {**dst, "routing": "leaves"}, load_mode="append")
    with pytest.raises(ConfigError, match="sink.copy_path=passthrough"):
        pg_exec(pg_target, "DROP TRIGGER rt_auto_stmt ON rt_auto")
        job(src, {**dst, "routing": "leaves", "copy_path": "passthrough"}, load_mode="append")
    assert checksum(pg_target, "rt_auto") == checksum(keys, "rt_keys")
    # a partition key the rows do not carry: the server fills it from its default, then routes
    pg_exec(pg_target, "DROP TABLE IF EXISTS rt_zone CASCADE", f"CREATE TABLE rt_zone ({COLS}, zone text DEFAULT 'eu') PARTITION BY LIST (zone)",
            "CREATE TABLE rt_zone__eu PARTITION OF rt_zone FOR VALUES IN ('eu')", "CREATE TABLE rt_zone__rest PARTITION OF rt_zone DEFAULT",
            "CREATE INDEX ON rt_zone (id)")
    zone = {**dst, "table": "rt_zone"}
    with pytest.raises(SchemaError, match="sink.routing=leaves is not possible: the partition key column zone is not loaded"):
        job(src, {**zone, "routing": "leaves"}, load_mode="append")
    report = job(src, zone, load_mode="append")
    assert "through the parent (the partition key column zone is not loaded" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT count(*) FROM rt_zone__eu")[0][0] == ROWS


def test_a_routed_load_on_ray_is_exact_and_a_worker_killed_after_some_leaves_took_rows_leaves_none(keys, pg_target,
                                                                                                     ray_instance, tmp_path) -> None:
    ddl = [f"CREATE TABLE {{t}} ({COLS}) PARTITION BY RANGE (day)",
           *[f"CREATE TABLE {{t}}__{i} PARTITION OF {{t}} FOR VALUES FROM ('{1999 + i}-06-01') TO ('{2000 + i}-06-01') PARTITION BY HASH (id)"
             for i in range(2)],
           *[f"CREATE TABLE {{t}}__{i}_{r} PARTITION OF {{t}}__{i} FOR VALUES WITH (MODULUS 3, REMAINDER {r})" for i in range(2) for r in range(3)]]
    _twin(pg_target, "rt_ray", ddl)
    reports = _load_both(keys, pg_target, "rt_ray", "ctid", {"partitions": 4}, load_mode="append", degree=2,
                         runtime={"type": "ray", "max_retries": 0})
    assert len(reports["leaves"].results) == 4
    # a worker that dies after COPYing into some leaves (a flush after every batch): its transaction
    # goes with it, and the retry routes the partition again, every row once
    pg_exec(pg_target, "DROP TABLE IF EXISTS rt_crash CASCADE", "CREATE TABLE rt_crash (n bigint) PARTITION BY HASH (n)",
            *[f"CREATE TABLE rt_crash__{r} PARTITION OF rt_crash FOR VALUES WITH (MODULUS 4, REMAINDER {r})" for r in range(4)])
    marker = tmp_path / "crashed"
    spec = ray_spec({"type": "parquet", "path": "unused"}, {"type": "postgres", "port": pg_target.port, "table": "rt_crash",
                                                        "routing": "leaves", "routing_buffer_mb": 0}, {"type": "none"})
    report = run_job(with_fault_source(spec, rows=100000, batch=10000, crash_marker=str(marker)))
    assert marker.exists() and report.rows == 100000  # the first attempt died (Ray ran the task again)
    assert pg_exec(pg_target, "SELECT count(*), count(DISTINCT n), min(n), max(n) FROM rt_crash")[0] == (100000, 100000, 0, 99999)
    assert len(pg_exec(pg_target, "SELECT DISTINCT tableoid FROM rt_crash")) == 4


def test_a_partition_that_is_itself_partitioned_takes_its_rows_and_refuses_others(pg_target, tmp_path) -> None:
    """A Parquet load into m1, a partition of m partitioned again (list on b): StopIteration before (its tree's own row
    has a parent). Its rows reach its leaves; a row outside m1's own bound is refused by PostgreSQL, nothing kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pg_exec(pg_target, "DROP TABLE IF EXISTS sp_m", "CREATE TABLE sp_m (a int, b text, v int) PARTITION BY RANGE (a)",
            "CREATE TABLE sp_m1 PARTITION OF sp_m FOR VALUES FROM (0) TO (100) PARTITION BY LIST (b)",
            "CREATE TABLE sp_m1x PARTITION OF sp_m1 FOR VALUES IN ('x')", "CREATE TABLE sp_m1y PARTITION OF sp_m1 FOR VALUES IN ('y')",
            "CREATE TABLE sp_m2 PARTITION OF sp_m FOR VALUES FROM (100) TO (200)")
    rows = {"a": pa.array([1, 2, 3], pa.int32()), "b": ["x", "y", "x"], "v": pa.array([1, 2, 3], pa.int32())}
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(rows), tmp_path / "in" / "a.parquet")
    job({"type": "parquet", "path": str(tmp_path / "in")}, {"type": "postgres", "port": pg_target.port, "table": "sp_m1"},
        strategy="files", load_mode="append")
    assert pg_exec(pg_target, "SELECT tableoid::regclass::text, a FROM sp_m ORDER BY a") == [("sp_m1x", 1), ("sp_m1y", 2), ("sp_m1x", 3)]
    (tmp_path / "out").mkdir()
    pq.write_table(pa.table({**rows, "a": pa.array([4, 150, 5], pa.int32())}), tmp_path / "out" / "a.parquet")
    with pytest.raises(TransferError):
        job({"type": "parquet", "path": str(tmp_path / "out")}, {"type": "postgres", "port": pg_target.port, "table": "sp_m1"},
            strategy="files", load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM sp_m") == [(3,)]
