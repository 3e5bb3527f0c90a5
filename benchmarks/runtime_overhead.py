"""The Ray runtime's fixed overhead against the local runtime on the same job.

Loads TPC-H orders into a throwaway PostgreSQL server, then times the same PostgreSQL ->
PostgreSQL job (ctid, N partitions, degree 2) on: the local runtime; the Ray runtime starting
its own instance (what `conveyor run runtime=ray` pays); and the Ray runtime on an instance
started beforehand (per-task overhead only). Best of N each.

    python benchmarks/runtime_overhead.py --sf 1 --partitions 8 --repeat 3
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.pipelines.job import run_job
from conveyor.testing.pgserver import PgServer


def timed(cfg: dict, before) -> float:  # noqa: ANN001
    before()
    start = time.perf_counter()
    report = run_job(build_job(OmegaConf.create(cfg)))
    assert report.rows > 0
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=orders",
                    "--parts=4", f"--output-dir={work}"], check=True)
    with PgServer("bench") as pg:
        os.environ["PGPASSWORD"] = pg.password
        local = {"type": "local", "max_retries": 0}
        run_job(build_job(OmegaConf.create({
            "source": {"type": "parquet", "path": str(work / "orders")}, "sink": {"type": "postgres", "port": pg.port, "table": "src"},
            "strategy": {"type": "files"}, "runtime": local, "load_mode": "create", "degree": 2})))
        import psycopg

        def truncate() -> None:
            with psycopg.connect(pg.dsn(), autocommit=True) as con:
                con.execute("DROP TABLE IF EXISTS dst")
                con.execute("CREATE TABLE dst (LIKE src)")

        def job(runtime: dict) -> dict:
            return {"source": {"type": "postgres", "port": pg.port, "table": "src"},
                    "sink": {"type": "postgres", "port": pg.port, "table": "dst"},
                    "strategy": {"type": "ctid", "partitions": args.partitions}, "runtime": runtime,
                    "load_mode": "append", "degree": 2}

        results = {"local": [timed(job(local), truncate) for _ in range(args.repeat)]}
        results["ray, own instance (start-up included)"] = [timed(job({"type": "ray", "max_retries": 0}), truncate) for _ in range(args.repeat)]
        import ray

        start = time.perf_counter()
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False, object_store_memory=256 * 1024 * 1024)
        init = time.perf_counter() - start
        results["ray, instance already up"] = [timed(job({"type": "ray", "max_retries": 0}), truncate) for _ in range(args.repeat)]
        ray.shutdown()
    best = {k: min(v) for k, v in results.items()}
    print(f"\nPostgreSQL -> PostgreSQL, TPC-H orders SF{args.sf}, ctid {args.partitions} partitions, degree 2, best of {args.repeat}\n")
    print("| runtime | best s | all s | vs local |\n|---|---:|---|---:|")
    for k, v in results.items():
        print(f"| {k} | {best[k]:.2f} | {' '.join(f'{t:.2f}' for t in v)} | {best[k] / best['local']:.2f}x |")
    warm = best["ray, instance already up"]
    print(f"\nray.init() alone: {init:.2f} s; start-up paid per run: {best['ray, own instance (start-up included)'] - warm:.2f} s; "
          f"per-task overhead once up: {(warm - best['local']) / args.partitions * 1000:.0f} ms/partition")
    return 0


if __name__ == "__main__":
    sys.exit(main())
