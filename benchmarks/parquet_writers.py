"""Writing Parquet from Arrow: pyarrow's ParquetWriter (what the Parquet sink uses) against DuckDB's
``COPY ... TO`` fed the same Arrow table, at the same output (zstd, row groups of 1,048,576 rows,
column statistics, decimals as integers where they fit), on TPC-H tables made by tpchgen-cli.

    python benchmarks/parquet_writers.py --sf 1 --tables lineitem,orders --repeat 3

Each writer runs in this one process on one thread (a partition's task writes its own file; the job's
degree gives the parallelism), best of N; CPU-seconds are this process's. Each file is read back and
compared with the table written, value for value, before its time counts.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 1024 * 1024


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pyarrow_writer(table: pa.Table, path: Path) -> None:
    with pq.ParquetWriter(path, table.schema, compression="zstd", store_decimal_as_integer=True) as w:
        for start in range(0, table.num_rows, ROW_GROUP):
            w.write_table(table.slice(start, ROW_GROUP))


def duckdb_writer(table: pa.Table, path: Path, threads: int = 1) -> None:
    con = duckdb.connect(config={"threads": threads})
    try:
        con.register("src", table)
        con.execute(f"COPY (SELECT * FROM src) TO '{path}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {ROW_GROUP})")
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--tables", default="lineitem,orders")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-pqw-"))
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), f"--tables={args.tables}",
                    f"--output-dir={work}"], check=True)
    print("| table | writer | best s | all s | CPU-s (best run) | MB | row groups | same values |\n|---|---|---:|---|---:|---:|---:|---|")
    for name in args.tables.split(","):
        src = next(work.glob(f"{name}*.parquet"), None) or next((work / name).glob("*.parquet"))
        table = pq.read_table(src).combine_chunks()
        for label, write in (("pyarrow ParquetWriter", pyarrow_writer), ("duckdb COPY TO (1 thread)", duckdb_writer),
                             ("duckdb COPY TO (2 threads)", lambda t, p: duckdb_writer(t, p, 2))):
            out = work / f"{name}-{label.split()[0]}.parquet"
            runs = []
            for _ in range(args.repeat):
                out.unlink(missing_ok=True)
                c0, t0 = cpu(), time.perf_counter()
                write(table, out)
                runs.append((time.perf_counter() - t0, cpu() - c0))
            back = pq.read_table(out)
            same = back.cast(table.schema).equals(table) if back.schema != table.schema else back.equals(table)
            meta = pq.ParquetFile(out).metadata
            best = min(runs)
            print(f"| {name} | {label} | {best[0]:.2f} | {' '.join(f'{r[0]:.2f}' for r in runs)} | {best[1]:.1f} | "
                  f"{out.stat().st_size / 1e6:.0f} | {meta.num_row_groups} | {'yes' if same else 'NO: ' + str(back.schema)[:80]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
