"""PostgreSQL -> PostgreSQL and Parquet -> PostgreSQL against the raw psql binary COPY pipe.

Starts two throwaway servers (fsync off, synchronous_commit off, large max_wal_size), loads
TPC-H orders (tpchgen-cli) into the source, then times each job best-of-N next to its baseline
measured in the same run, and prints ratios (baseline seconds / job seconds: >1 is faster).

    python benchmarks/pg_copy.py --sf 1 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from conveyor.config import build_job
from conveyor.connectors.postgres.passthrough import psql_program
from conveyor.pipelines.job import run_job
from conveyor.testing.pgserver import PgServer


def psql(server: PgServer, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": server.password}
    return subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", *args],
                          env=env, check=True, capture_output=True, **kw)


def sql(server: PgServer, statement: str) -> str:
    return psql(server, "-At", "-c", statement, text=True).stdout.strip()


def best(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = fn()
        times.append(t)
    return times


def pipe(src: PgServer, dst: PgServer, table: str) -> float:
    sql(dst, f"TRUNCATE {table}")
    program, program_env = psql_program() or ("psql", {})  # the binary itself, as the pass-through runs it (not Debian's wrapper)
    env = {**os.environ, **program_env, "PGPASSWORD": src.password}
    start = time.perf_counter()
    out = subprocess.Popen([program, "-X", "-q", "-h", "127.0.0.1", "-p", str(src.port), "-U", "postgres", "-c",
                            f"COPY {table} TO STDOUT (FORMAT binary)"], stdout=subprocess.PIPE, env=env)
    subprocess.run([program, "-X", "-q", "-h", "127.0.0.1", "-p", str(dst.port), "-U", "postgres", "-c",
                    f"COPY {table} FROM STDIN (FORMAT binary)"], stdin=out.stdout, env=env, check=True)
    out.wait()
    return time.perf_counter() - start


def conveyor(cfg: dict, before=None) -> float:
    if before:
        before()
    start = time.perf_counter()
    report = run_job(build_job(OmegaConf.create(cfg)))
    elapsed = time.perf_counter() - start
    assert report.rows > 0
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=".bench/pg_copy.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=orders",
                    "--parts=4", f"--output-dir={work}"], check=True)
    results: dict[str, list[float]] = {}
    with PgServer("bench-src") as src, PgServer("bench-dst") as dst:
        os.environ["PGPASSWORD"] = src.password
        base = {"runtime": {"type": "local", "max_retries": 0}}
        conveyor({**base, "source": {"type": "parquet", "path": str(work / "orders")},
                  "sink": {"type": "postgres", "port": src.port, "table": "orders"}, "strategy": {"type": "files"},
                  "load_mode": "create", "degree": 2})
        sql(src, "VACUUM ANALYZE orders")
        psql(dst, "-c", sql(src, "SELECT 'CREATE TABLE orders (' || string_agg(quote_ident(attname) || ' ' || "
                                 "format_type(atttypid, atttypmod), ', ' ORDER BY attnum) || ')' FROM pg_attribute "
                                 "WHERE attrelid = 'orders'::regclass AND attnum > 0"))
        rows = int(sql(src, "SELECT count(*) FROM orders"))
        truncate = lambda: sql(dst, "TRUNCATE orders")  # noqa: E731
        results["pipe psql|psql (baseline)"] = best(lambda: pipe(src, dst, "orders"), args.repeat)
        for path in ("passthrough", "arrow"):
            for method, degree in (("none", 1), ("ctid", 1), ("ctid", 2)):
                cfg = {**base, "source": {"type": "postgres", "port": src.port, "table": "orders"},
                       "sink": {"type": "postgres", "port": dst.port, "table": "orders", "copy_path": path},
                       "strategy": {"type": method}, "load_mode": "append", "degree": degree}
                results[f"pg->pg {path} {method} degree={degree}"] = best(lambda cfg=cfg: conveyor(cfg, truncate), args.repeat)
        for degree in (1, 2):
            cfg = {**base, "source": {"type": "parquet", "path": str(work / "orders")},
                   "sink": {"type": "postgres", "port": dst.port, "table": "orders"}, "strategy": {"type": "files"},
                   "load_mode": "append", "degree": degree}
            results[f"parquet->pg files degree={degree}"] = best(lambda cfg=cfg: conveyor(cfg, truncate), args.repeat)
        assert int(sql(dst, "SELECT count(*) FROM orders")) == rows
    baseline = min(results["pipe psql|psql (baseline)"])
    print(f"\nTPC-H orders SF{args.sf}: {rows:,} rows; best of {args.repeat}; ratio = pipe seconds / job seconds\n")
    print("| job | best s | all s | rows/s | vs pipe |\n|---|---:|---|---:|---:|")
    for name, times in results.items():
        b = min(times)
        print(f"| {name} | {b:.2f} | {' '.join(f'{t:.2f}' for t in times)} | {rows / b:,.0f} | {baseline / b:.2f}x |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"sf": args.sf, "rows": rows, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
