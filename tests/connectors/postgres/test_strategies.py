"""Every partition method against a real server: the target holds every source row exactly once."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.pipelines.job import plan_job
from tests.helpers import checksum, pg_exec

N = 20000


@pytest.fixture(scope="module")
def skewed(pg_source):
    """ids heavily skewed (90% of rows below 1,000, the rest spread to 10 million), NULL keys, dates, text."""
    pg_exec(
        pg_source,
        "DROP TABLE IF EXISTS skewed", "DROP TABLE IF EXISTS empty_t", "DROP VIEW IF EXISTS skewed_v",
        "CREATE TABLE skewed (id bigint, grp text, day date, amount numeric(12,2), note text)",
        f"INSERT INTO skewed SELECT CASE WHEN g % 10 = 0 THEN g * 500 ELSE g % 1000 END, 'g' || (g % 7), "
        f"date '2020-01-01' + (g % 400), g * 0.01, repeat('x', g % 50) FROM generate_series(1, {N}) g",
        "INSERT INTO skewed VALUES (NULL, NULL, NULL, NULL, 'null key'), (NULL, 'g1', NULL, 1, 'null key 2')",
        "ANALYZE skewed",
        "CREATE TABLE empty_t (LIKE skewed)",
        "CREATE VIEW skewed_v AS SELECT * FROM skewed",
    )
    return pg_source


CASES = [
    ("none", {}),
    ("ctid", {}),
    ("ctid", {"partitions": 7}),
    ("rangeid", {"distribute_key": "id"}),
    ("rangeid", {"distribute_key": "id", "balance": "width", "partitions": 5}),
    ("rangeid", {"distribute_key": "day", "partitions": 3}),
    ("rangeid", {"distribute_key": "amount", "partitions": 4}),
    ("ntile", {"distribute_key": "id", "partitions": 4}),
    ("ntile", {"distribute_key": "grp", "partitions": 3}),
    ("random", {"distribute_key": "id", "partitions": 3}),
    ("datadriven", {"distribute_key": "grp"}),
    ("datadriven", {"distribute_key": "grp", "partitions": 2}),
    ("auto", {}),
    ("auto", {"distribute_key": "id"}),
]


def _job(source_table: str, pg_source, pg_target, strategy: str, params: dict, target: str = "copy", degree: int = 2, **sink):
    cfg = OmegaConf.create({
        "source": {"type": "postgres", "port": pg_source.port, "table": source_table},
        "sink": {"type": "postgres", "port": pg_target.port, "table": target, **sink},
        "strategy": {"type": strategy, **params},
        "runtime": {"type": "local", "max_retries": 0},
        "load_mode": "replace",
        "degree": degree,
    })
    from conveyor.pipelines.job import run_job

    return run_job(build_job(cfg))


@pytest.mark.parametrize(("strategy", "params"), CASES, ids=[f"{s}-{'-'.join(map(str, p.values()))}" for s, p in CASES])
@pytest.mark.parametrize("copy_path", ["auto", "arrow"])
def test_exact_coverage(skewed, pg_target, strategy: str, params: dict, copy_path: str) -> None:
    report = _job("skewed", skewed, pg_target, strategy, params, copy_path=copy_path)
    assert checksum(pg_target, "copy") == checksum(skewed, "skewed")
    assert report.rows == N + 2


@pytest.mark.parametrize("strategy", ["none", "ctid", "rangeid", "ntile", "random", "datadriven"])
def test_empty_table(skewed, pg_target, strategy: str) -> None:
    params = {} if strategy in ("none", "ctid") else {"distribute_key": "id"}
    report = _job("empty_t", skewed, pg_target, strategy, params, target="empty_copy")
    assert report.rows == 0 and checksum(pg_target, "empty_copy")[0] == 0


def test_datadriven_query_reads_one_partition_per_row(skewed, pg_target) -> None:
    params = {"distribute_key": "grp", "datadriven_query": "SELECT 'g' || i FROM generate_series(0, 6) i"}
    report = _job("skewed", skewed, pg_target, "datadriven", params)
    assert len(report.results) == 7
    # the query lists no NULL: rows with a NULL grp are, by the user's choice, not read
    assert checksum(pg_target, "copy") == checksum(skewed, "(SELECT * FROM skewed WHERE grp IS NOT NULL)")


def _plan(pg_source, strategy: str, params: dict, table: str = "skewed"):
    cfg = OmegaConf.create({
        "source": {"type": "postgres", "port": pg_source.port, "table": table},
        "sink": {"type": "parquet", "path": "/nonexistent-never-written"},
        "strategy": {"type": strategy, **params},
        "runtime": {"type": "local"},
        "degree": 4,
    })
    return plan_job(build_job(cfg))


def test_rangeid_by_rows_balances_a_skewed_key(skewed) -> None:
    by_rows = _plan(skewed, "rangeid", {"distribute_key": "id"})
    by_width = _plan(skewed, "rangeid", {"distribute_key": "id", "balance": "width"})

    def counts(plan):
        out = []
        for p in plan.partitions:
            where = plan.spec.source.where(p)
            out.append(pg_exec(skewed, f"SELECT count(*) FROM skewed{where}")[0][0])
        return out

    rows, width = counts(by_rows), counts(by_width)
    assert sum(rows) == sum(width) == N + 2
    assert max(rows) < 0.5 * (N + 2)  # no worker gets most of the rows
    assert max(width) > 0.8 * (N + 2)  # equal widths on this key do leave one worker with most rows


def test_ctid_default_is_one_range_per_stream_for_a_small_table(skewed) -> None:
    plan = _plan(skewed, "ctid", {})  # degree 4, a table of a few MB
    assert len(plan.partitions) == 4 and plan.partitions[-1].stop is None
    assert "pages" in plan.note


def test_auto_explains_its_choice(skewed) -> None:
    assert _plan(skewed, "auto", {}).note.startswith("chose ctid")
    view = _plan(skewed, "auto", {"distribute_key": "id"}, table="skewed_v")
    assert view.note.startswith("chose rangeid on id") and "view" in view.note
    assert _plan(skewed, "auto", {}, table="skewed_v").note.startswith("chose none")


def test_one_snapshot_for_every_partition(skewed, pg_target) -> None:
    """Rows inserted after the job's snapshot was exported are not read by any partition."""
    cfg = OmegaConf.create({
        "source": {"type": "postgres", "port": skewed.port, "table": "skewed"},
        "sink": {"type": "postgres", "port": pg_target.port, "table": "snap"},
        "strategy": {"type": "ctid", "partitions": 4}, "runtime": {"type": "local"}, "load_mode": "replace", "degree": 2,
    })
    spec = build_job(cfg)
    plan = plan_job(spec)
    with spec.source.session() as shipped:
        pg_exec(skewed, "INSERT INTO skewed SELECT 1, 'late', NULL, NULL, 'late' FROM generate_series(1, 500)")
        try:
            rows = sum(b.num_rows for p in plan.partitions for b in shipped.read(p))
        finally:
            pg_exec(skewed, "DELETE FROM skewed WHERE note = 'late'")
    assert rows == N + 2


@pytest.mark.parametrize("strategy", ["rangeid", "ntile", "random"])
def test_a_keyed_strategy_without_a_distribute_key_splits_by_the_primary_key(skewed, pg_source, pg_target, strategy: str) -> None:
    """A table with a primary key needs no strategy.distribute_key (it was refused, asking for one): its first column is
    used and said; a table without one is still refused by name."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS keyed_pk", "CREATE TABLE keyed_pk (k int, n int, v text, PRIMARY KEY (k, n))",
            "INSERT INTO keyed_pk SELECT g / 3, g % 3, 'v' || g FROM generate_series(1, 3000) g")
    plan = _plan(pg_source, strategy, {"partitions": 3}, table="keyed_pk")
    assert len(plan.partitions) == 3 and all(getattr(p, "column", "") == "k" for p in plan.partitions)
    _job("keyed_pk", pg_source, pg_target, strategy, {"partitions": 3}, target="keyed_pk_copy")
    assert checksum(pg_target, "keyed_pk_copy") == checksum(pg_source, "keyed_pk")
    from conveyor.errors import ConfigError

    with pytest.raises(ConfigError, match="has no primary key"):
        _plan(pg_source, strategy, {"partitions": 3}, table="skewed")
