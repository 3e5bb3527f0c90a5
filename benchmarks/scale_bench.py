"""How cost grows with size: TPC-H lineitem at two scale factors (SF1 and SF10 by default: 6 M and 60 M rows), each job
beside its baseline in the same run (``make bench-scale``; alone:

    python benchmarks/scale_bench.py [--sfs 1,10] [--repeat 1] [--out DIR]

Three jobs, each the shipped pipeline run as a user runs it (the ``conveyor`` command, ``runtime=local``: this
process's threads, so that the peak memory measured is the job's own), and each baseline as a process of its own:

- PostgreSQL -> PostgreSQL: ``pipeline=pg_to_pg`` (truncate; the pass-through) against the ``psql | psql`` binary COPY
  pipe (one stream) into the same truncated table;
- Parquet -> PostgreSQL: ``pipeline=parquet_to_postgres`` (append into an empty table) against DuckDB's CLI
  (``INSERT INTO ... SELECT * FROM read_parquet(...)`` through its postgres extension);
- PostgreSQL -> Parquet: ``pipeline=postgres_to_parquet`` (zstd) against DuckDB's CLI (``COPY (SELECT * FROM ...) TO
  ... (FORMAT parquet, COMPRESSION zstd)``).

The source table is TPC-H's own DDL (char(n) columns, numeric(15,2)), loaded from ``tpchgen-cli`` Parquet files of
~1.5 M rows each (4 per SF1), so a larger scale factor is more files of the same size. Each cell records wall seconds,
the CPU-seconds of the client process tree (``wait4``'s rusage) and of both servers, and the client's peak resident
memory (the largest process of the tree: ``ru_maxrss``). Every target is verified: a PostgreSQL target by count and
an md5 of every row against the source; a Parquet target by its row count and sums over four columns (l_orderkey,
l_linenumber, l_extendedprice, the lengths of l_comment) read by DuckDB against the source's.

Targets (issue 71): a job's time at the larger scale factor at most 1.05x its linear share (10.5x SF1's for SF10),
its peak memory within 10% of SF1's. Disk: SF10 needs about 25 GB free under the temp folder (the source table, the
target table, the Parquet files in and out). Output: ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench import TPCH_DDL, DuckBaseline, checksum, psql, server_cpu, versions

from conveyor.connectors.postgres.passthrough import psql_program
from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent
SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_wal_size": "2GB"}
#: what a Parquet target is checked by, against the same query on the source (DuckDB and PostgreSQL agree on each)
PARQUET_SUMS = "count(*), sum(l_orderkey), sum(l_linenumber), sum(l_extendedprice), sum(length(l_comment))"


#: the child's parent while it runs: a small process of its own, so that the child's peak resident memory is its own (a
#: forked child's high-water mark starts at its parent's and exec keeps it: forked from this process, every job would
#: read at least this process's ~120 MB)
_SPAWN = """
import json, os, sys, time
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.execvp(args[0], args)
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
                  "code": os.waitstatus_to_exitcode(status)}))
"""


def timed(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """``args`` run as a child: its wall seconds, the CPU-seconds of its process tree and its peak RSS (MB: the largest
    process of the tree)."""
    done = subprocess.run([sys.executable, "-S", "-c", _SPAWN, json.dumps(args)], env=env, capture_output=True, text=True)
    got = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {"code": done.returncode}
    if done.returncode or got["code"]:
        raise RuntimeError(f"{' '.join(args[:4])} failed ({got['code']}): {done.stderr[-3000:]}")
    return got


class Scale:
    def __init__(self, src: PgServer, dst: PgServer, duck: DuckBaseline, work: Path, repeat: int, repeat_smallest: int, smallest: float,
                 jobs: list[str]) -> None:
        self.src, self.dst, self.duck, self.work, self.repeat = src, dst, duck, work, repeat
        self.repeat_smallest, self.smallest, self.jobs = repeat_smallest, smallest, jobs
        self.cells: list[dict[str, Any]] = []
        program, program_env = psql_program() or ("psql", {})
        self.psql, self.env = program, {**os.environ, **program_env, "PGPASSWORD": src.password}

    def cell(self, sf: float, job: str, tool: str, run: list[str], reset: Any, verify: Any, rows: int) -> None:
        if job not in self.jobs:
            return
        for i in range(self.repeat if sf != self.smallest else max(self.repeat, self.repeat_smallest)):
            reset()
            before = (server_cpu(self.src), server_cpu(self.dst))
            got = timed(run, self.env)
            after = (server_cpu(self.src), server_cpu(self.dst))
            ok = verify()
            cell = {"sf": sf, "job": job, "tool": tool, "round": i + 1, "rows": rows, "wall_s": round(got["wall_s"], 2),
                    "cpu": {"client": round(got["cpu_s"], 2), "source": round(after[0] - before[0], 2), "target": round(after[1] - before[1], 2)},
                    "peak_rss_mb": round(got["peak_rss_mb"]), "verified": ok}
            self.cells.append(cell)
            print(f"SF{sf:g} {job:16} {tool:44} {cell['wall_s']:8.2f} s  CPU {cell['cpu']}  peak {cell['peak_rss_mb']} MB  "
                  f"{'ok' if ok else 'NOT VERIFIED'}", flush=True)

    def run_sf(self, sf: float) -> None:
        files = self.work / f"sf{sf:g}"
        parts = max(1, round(4 * sf))
        if not files.exists():
            subprocess.run([str(BIN / "tpchgen-cli"), "parquet", "-s", str(sf), "--tables=lineitem", f"--parts={parts}",
                            f"--output-dir={files}"], check=True, capture_output=True)
        files = files / "lineitem"
        psql(self.src, f"DROP TABLE IF EXISTS lineitem; CREATE TABLE lineitem ({TPCH_DDL['lineitem']})")
        load = timed([str(BIN / "conveyor"), "run", "pipeline=parquet_to_postgres", f"source.path={files}", f"sink.port={self.src.port}",
                      "sink.table=lineitem", "runtime=local", "verify=none", f"hydra.run.dir={self.work}/runs/{time.time_ns()}"], self.env)
        psql(self.src, "VACUUM ANALYZE lineitem")
        rows = int(psql(self.src, "SELECT count(*) FROM lineitem"))
        print(f"SF{sf:g}: {rows:,} rows in {parts} files, loaded into the source in {load['wall_s']:.1f} s", flush=True)
        expect = checksum(self.src, "lineitem") if {"pg->pg", "parquet->pg"} & set(self.jobs) else ""
        sums = psql(self.src, f"SELECT {PARQUET_SUMS} FROM lineitem").split("|")

        def fresh() -> None:
            psql(self.dst, f"DROP TABLE IF EXISTS lineitem; CREATE TABLE lineitem ({TPCH_DDL['lineitem']})")
            psql(self.dst, "CHECKPOINT")

        def pg_ok() -> bool:
            return checksum(self.dst, "lineitem") == expect

        run_dir = lambda: f"hydra.run.dir={self.work}/runs/{time.time_ns()}"  # noqa: E731
        conveyor = [str(BIN / "conveyor"), "run", "runtime=local"]

        # PostgreSQL -> PostgreSQL
        pipe = (f"{self.psql} -X -q -h 127.0.0.1 -p {self.src.port} -U postgres -c 'COPY lineitem TO STDOUT (FORMAT binary)' | "
                f"{self.psql} -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p {self.dst.port} -U postgres -c 'COPY lineitem FROM STDIN (FORMAT binary)'")
        self.cell(sf, "pg->pg", "baseline psql-to-psql pipe (binary COPY, 1 stream)", ["bash", "-o", "pipefail", "-c", pipe], fresh, pg_ok, rows)
        self.cell(sf, "pg->pg", "conveyor run pipeline=pg_to_pg",
                  [*conveyor, "pipeline=pg_to_pg", f"source.port={self.src.port}", "source.table=lineitem", f"sink.port={self.dst.port}",
                   "sink.table=lineitem", run_dir()], fresh, pg_ok, rows)

        # Parquet -> PostgreSQL
        self.cell(sf, "parquet->pg", "baseline duckdb CLI read_parquet -> postgres",
                  self.duck.cli_args("dst", self.duck.parquet_to_pg_sql(files, "lineitem")), fresh, pg_ok, rows)
        self.cell(sf, "parquet->pg", "conveyor run pipeline=parquet_to_postgres",
                  [*conveyor, "pipeline=parquet_to_postgres", f"source.path={files}", f"sink.port={self.dst.port}", "sink.table=lineitem",
                   run_dir()], fresh, pg_ok, rows)
        psql(self.dst, "DROP TABLE IF EXISTS lineitem")

        # PostgreSQL -> Parquet
        out = self.work / "out"

        def clear() -> None:
            shutil.rmtree(out, ignore_errors=True)

        def pq_ok() -> bool:
            import duckdb

            got = duckdb.sql(f"SELECT {PARQUET_SUMS} FROM read_parquet('{out}/**/*.parquet')").fetchone()
            return [str(v) for v in got] == sums

        def duck_out() -> None:
            clear()
            out.mkdir(parents=True)

        self.cell(sf, "pg->parquet", "baseline duckdb CLI postgres -> COPY TO zstd",
                  self.duck.cli_args("src", self.duck.pg_to_parquet_sql("lineitem", out)),
                  duck_out, pq_ok, rows)
        self.cell(sf, "pg->parquet", "conveyor run pipeline=postgres_to_parquet",
                  [*conveyor, "pipeline=postgres_to_parquet", f"source.port={self.src.port}", "source.table=lineitem", f"sink.path={out}",
                   run_dir()], clear, pq_ok, rows)
        clear()
        psql(self.src, "DROP TABLE lineitem")
        shutil.rmtree(files.parent, ignore_errors=True)


def render(results: dict[str, Any]) -> str:
    cells, sfs = results["cells"], results["settings"]["sfs"]
    best: dict[tuple[float, str, str], dict] = {}
    for c in cells:
        key = (c["sf"], c["job"], c["tool"])
        if key not in best or c["wall_s"] < best[key]["wall_s"]:
            best[key] = c
    lines = [f"machine: {results['versions']}", "",
             "| SF | job | tool | best s | all s | CPU-s client / source / target | client peak MB | verified |",
             "|---|---|---|---:|---|---|---:|---|"]
    for (sf, job, tool), c in best.items():
        mine = [x for x in cells if (x["sf"], x["job"], x["tool"]) == (sf, job, tool)]
        runs = " ".join(f"{x['wall_s']:.2f}" for x in mine)
        ok = all(x["verified"] for x in mine)
        cpu = c["cpu"]
        lines.append(f"| {sf:g} | {job} | {tool} | {c['wall_s']:.2f} | {runs} | {cpu['client']:.1f} / {cpu['source']:.1f} / {cpu['target']:.1f} | "
                     f"{c['peak_rss_mb']} | {'ok' if ok else '**no**'} |")
    if len(sfs) >= 2:
        small, large = sfs[0], sfs[-1]
        factor = large / small
        lines += ["", f"Growth from SF{small:g} to SF{large:g} ({factor:g}x the rows; targets: time at most {1.05 * factor:g}x, "
                      "client peak memory within 10%):", "",
                  "| job | tool | time ratio | | peak memory change | | vs baseline at each SF |", "|---|---|---:|---|---:|---|---|"]
        for (sf, job, tool), c in best.items():
            if sf != small or (large, job, tool) not in best:
                continue
            big = best[(large, job, tool)]
            ratio = big["wall_s"] / c["wall_s"]
            mem = big["peak_rss_mb"] / c["peak_rss_mb"] - 1
            base = next((k for k in best if k[0] == small and k[1] == job and k[2].startswith("baseline")), None)
            vs = ""
            if base is not None and not tool.startswith("baseline"):
                vs = " / ".join(f"SF{s:g} {best[(s, job, tool)]['wall_s'] / best[(s, job, base[2])]['wall_s']:.2f}x"
                                for s in (small, large) if (s, job, base[2]) in best)
            ours = not tool.startswith("baseline")  # the targets are Conveyor's; a baseline's growth is given beside them
            lines.append(f"| {job} | {tool} | {ratio:.2f}x | {('met' if ratio <= 1.05 * factor else '**missed**') if ours else ''} | "
                         f"{mem:+.1%} | {('met' if abs(mem) <= 0.10 else '**missed**') if ours else ''} | {vs} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sfs", default="1,10", help="the scale factors, smallest first")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cell (all kept, the best compared)")
    ap.add_argument("--repeat-smallest", type=int, default=3,
                    help="runs of each cell at the smallest scale factor (a few seconds each: one run's noise is a large share of it)")
    ap.add_argument("--jobs", default="pg->pg,parquet->pg,pg->parquet", help="which of the three jobs to run")
    ap.add_argument("--out", default=f".bench/scale-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--render", metavar="RESULTS_JSON", help="only render a run's results.json again")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0
    sfs = [float(x) for x in args.sfs.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-scale-bench-"))
    scale = None
    try:
        with PgServer("scale-src", settings=SETTINGS) as src, PgServer("scale-dst", settings=SETTINGS) as dst:
            duck = DuckBaseline(src, dst, work)
            scale = Scale(src, dst, duck, work, args.repeat, args.repeat_smallest, sfs[0], args.jobs.split(","))
            for sf in sfs:
                scale.run_sf(sf)
    finally:  # what was measured is kept even when a later cell fails
        results = {"settings": {**vars(args), "sfs": sfs}, "versions": versions(), "cells": scale.cells if scale else [],
                   "server_settings": SETTINGS}
        (out / "results.json").write_text(json.dumps(results, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    text = render(results)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
