"""A time(n) / timestamp(n) target that keeps fewer fractional digits than its source's type: each value is checked.

PostgreSQL rounds a value with more digits than the target keeps ('12:00:00.125' into time(2) is 12:00:00.13). On
the main this started from such a pair was refused by its types alone: a time(2) column written to Parquet (as
microseconds) could not be loaded back into its own time(2) table, nor a timestamp(6) table whose values were whole
milliseconds into timestamp(3). Each value is now checked on the client (one vectorized remainder per batch): the
values that fit load exactly, one that does not is refused by name and the target keeps its rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.errors import TransferError
from tests.helpers import job, pg_exec

pytestmark = pytest.mark.usefixtures("pg_password")

TARGET = "CREATE TABLE fr_t (id int, t time(2), ts timestamp(3), tz timestamptz(0))"


def _parquet(path: Path, t: list, ts: list, tz: list) -> dict:
    pq.write_table(pa.table({"id": pa.array(range(len(t)), pa.int32()), "t": pa.array(t, pa.time64("us")),
                             "ts": pa.array(ts, pa.timestamp("us")), "tz": pa.array(tz, pa.timestamp("us", tz="UTC"))}), path)
    return {"type": "parquet", "path": str(path)}


def test_values_that_fit_a_coarser_target_load_and_one_that_does_not_is_refused(pg_target, tmp_path: Path) -> None:
    pg_exec(pg_target, "DROP TABLE IF EXISTS fr_t", TARGET, "INSERT INTO fr_t VALUES (-1, '01:00', '2000-01-01', '2000-01-01+00')")
    utc = dt.timezone.utc
    fits = _parquet(tmp_path / "fits.parquet", [dt.time(12, 0, 0, 120000), dt.time(23, 59, 59, 990000), None],
                    [dt.datetime(2024, 2, 29, 12, 34, 56, 123000), dt.datetime(1960, 1, 1, 0, 0, 0, 1000), None],
                    [dt.datetime(2024, 1, 1, 10, tzinfo=utc), dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=utc), None])
    for writer in ("pgpq", "adbc"):
        job(fits, {"type": "postgres", "port": pg_target.port, "table": "fr_t", "writer": writer}, load_mode="truncate")
        assert pg_exec(pg_target, "SELECT id, t::text, ts::text, tz AT TIME ZONE 'UTC' FROM fr_t ORDER BY id") == [
            (0, "12:00:00.12", "2024-02-29 12:34:56.123", dt.datetime(2024, 1, 1, 10)),
            (1, "23:59:59.99", "1960-01-01 00:00:00.001", dt.datetime(1969, 12, 31, 23, 59, 59)),
            (2, None, None, None)]
    before = pg_exec(pg_target, "SELECT * FROM fr_t ORDER BY id")
    for column, bad in (("t", [dt.time(12, 0, 0, 125000)] * 3), ("ts", None), ("tz", None)):
        t = bad or [dt.time(1)] * 3
        ts = [dt.datetime(2024, 1, 1, 0, 0, 0, 1500)] * 3 if column == "ts" else [dt.datetime(2024, 1, 1)] * 3
        tz = [dt.datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=utc)] * 3 if column == "tz" else [dt.datetime(2024, 1, 1, tzinfo=utc)] * 3
        with pytest.raises(TransferError, match=rf"column {column} -> {column}: the value .* has more fractional digits than "):
            job(_parquet(tmp_path / f"bad_{column}.parquet", t, ts, tz), {"type": "postgres", "port": pg_target.port, "table": "fr_t"},
                load_mode="truncate")
        assert pg_exec(pg_target, "SELECT * FROM fr_t ORDER BY id") == before


def test_postgres_of_a_finer_precision_takes_the_checked_path(pg_source, pg_target) -> None:
    """time(6) -> time(2) between PostgreSQL servers: the pass-through would round (it was refused by type before); the
    Arrow path checks each value."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS fr_src", "CREATE TABLE fr_src (id int, t time, ts timestamp, tz timestamptz)",
            "INSERT INTO fr_src VALUES (1, '12:00:00.12', '2024-01-01 00:00:00.123', '2024-01-01 00:00:00+00'), (2, NULL, NULL, NULL)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS fr_t", TARGET)
    report = job({"type": "postgres", "port": pg_source.port, "table": "fr_src"}, {"type": "postgres", "port": pg_target.port, "table": "fr_t"},
                 load_mode="truncate")
    assert report.sink_plan.native is None and "fractional seconds are checked" in report.plan.path
    assert pg_exec(pg_target, "SELECT id, t::text, ts::text FROM fr_t ORDER BY id") == [(1, "12:00:00.12", "2024-01-01 00:00:00.123"),
                                                                                    (2, None, None)]
    pg_exec(pg_source, "UPDATE fr_src SET t = '12:00:00.125' WHERE id = 1")
    with pytest.raises(TransferError, match=r"column t -> t: the value 12:00:00.125000 has more fractional digits than time\(2\)"):
        job({"type": "postgres", "port": pg_source.port, "table": "fr_src"}, {"type": "postgres", "port": pg_target.port, "table": "fr_t"},
            load_mode="truncate")
