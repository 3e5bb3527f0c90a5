"""bench.py's raydata group: PostgreSQL -> PostgreSQL through Ray Data, on one local Ray instance (started once, not
timed), in rounds with the jobs it is measured against:

- ``conveyor run`` of the same job on the Ray runtime (ctid, the same partitions and degree): its default path (the
  native pass-through) and its Arrow path, which is the path a Dataset takes (blocks are Arrow);
- ``conveyor.ray_data``: the table read as a Dataset (``crd.reading``) and written with ``crd.write`` (append);
- Ray Data's own ``read_sql`` / ``write_sql`` (psycopg connections; ``executemany`` per block), orders only and one
  run (it is slow).

The goal: the Dataset path within 1.25x of ``conveyor run``'s Arrow path. The client CPU-seconds of these cells
are the driver's only: Ray's worker processes are not the benchmark's children.
"""

from __future__ import annotations

import logging
import os
from typing import Any


def run(bench: Any, table: str, partitions: int, degree: int, cores: int, conveyor: Any, read_sql_too: bool) -> None:
    import ray

    import conveyor.ray_data as crd

    target = f"rd_{table}"
    reset, verify = bench.fresh_target(bench.dst, table, target)
    src = {"type": "postgres", "port": bench.src.port, "table": table}
    dst = {"type": "postgres", "port": bench.dst.port, "table": target}
    strategy = {"type": "ctid", "partitions": partitions}
    group = f"raydata pg->pg {table} ctid {partitions} partitions"
    ray.init(address="local", num_cpus=cores, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             object_store_memory=512 * 1024 * 1024)
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False

        def job(path: str) -> Any:
            cfg = {"source": src, "sink": {**dst, "copy_path": path}, "strategy": strategy, "load_mode": "append", "degree": degree,
                   "runtime": {"type": "ray", "max_retries": 0}}
            return lambda: conveyor(cfg)

        def dataset() -> None:
            with crd.reading(source=src, strategy=strategy, degree=degree) as ds:
                report = crd.write(ds, sink=dst, load_mode="append")
            assert report.verification.ok and report.rows == report.handed

        jobs = [(f"conveyor run runtime=ray passthrough degree={degree}", job("passthrough"), verify, {"method": "run-passthrough"}),
                (f"conveyor run runtime=ray arrow degree={degree}", job("arrow"), verify, {"method": "run-arrow"}),
                ("conveyor.ray_data read -> write", dataset, verify,
                 {"method": "ray-data", "goal": {"against": f"conveyor run runtime=ray arrow degree={degree}", "at_most": 1.25,
                                                 "what": "within 1.25x of conveyor run on the same (Arrow) path"}})]
        bench.rounds(group, jobs, reset)
        if read_sql_too:
            repeat, bench.repeat = bench.repeat, 1
            try:
                bench.measure(group, "ray.data read_sql -> write_sql (Ray Data's own)", lambda: _read_write_sql(bench, table, target), reset,
                              verify, method="ray-sql")
            finally:
                bench.repeat = repeat
    finally:
        ray.shutdown()


def _read_write_sql(bench: Any, table: str, target: str) -> None:
    import psycopg
    import ray.data

    password = os.environ.get("PGPASSWORD", "")

    def connect(port: int) -> Any:
        return lambda: psycopg.connect(host="127.0.0.1", port=port, user="postgres", password=password, dbname="postgres")

    with psycopg.connect(host="127.0.0.1", port=bench.src.port, user="postgres", password=password, dbname="postgres") as con:
        columns = [r[0] for r in con.execute(f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 "
                                             "AND NOT attisdropped ORDER BY attnum").fetchall()]
    ds = ray.data.read_sql(f"SELECT * FROM {table}", connect(bench.src.port))
    ds.write_sql(f"INSERT INTO {target} VALUES ({', '.join(['%s'] * len(columns))})", connect(bench.dst.port))
