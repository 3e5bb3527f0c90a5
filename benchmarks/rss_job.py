"""Run one Conveyor job in this process and print its wall time and this process's peak resident
memory as JSON; bench.py runs it as a child so every job's peak is its own.

    python benchmarks/rss_job.py '{"source": {...}, "sink": {...}, ...}'
    python benchmarks/rss_job.py duckdb '{"extension_directory": ..., "dsn": ..., "sql": ...}'

The second form is the baseline: DuckDB with its postgres extension (installed into
``extension_directory`` by bench.py's DuckBaseline) running ``sql`` against the server ``dsn`` names,
attached as ``dst``.
"""

from __future__ import annotations

import json
import resource
import sys
import time

from conveyor.cli import arrow_allocator_default

arrow_allocator_default()  # as the conveyor command sets it, before pyarrow is imported

from omegaconf import OmegaConf  # noqa: E402

from conveyor.config import build_job  # noqa: E402
from conveyor.pipelines.job import run_job  # noqa: E402


def peak_rss_kb() -> int:
    """This process's own peak resident set (VmHWM; getrusage's ru_maxrss keeps the parent's across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def duckdb_baseline(args: dict) -> dict:
    import duckdb

    con = duckdb.connect(config={"extension_directory": args["extension_directory"]})
    con.execute("LOAD postgres")
    con.execute(f"ATTACH '{args['dsn']}' AS dst (TYPE postgres)")
    start = time.perf_counter()
    rows = con.execute(args["sql"]).fetchone()[0]
    return {"seconds": time.perf_counter() - start, "rows": rows, "peak_rss_mb": round(peak_rss_kb() / 1024, 1)}


def main() -> int:
    if sys.argv[1] == "duckdb":
        print(json.dumps(duckdb_baseline(json.loads(sys.argv[2]))))
        return 0
    cfg = json.loads(sys.argv[1])
    start = time.perf_counter()
    report = run_job(build_job(OmegaConf.create(cfg)))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": report.rows, "peak_rss_mb": round(peak_rss_kb() / 1024, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
