"""Where PostgreSQL -> Parquet's time and memory go: DuckDB's CLI against DuckDB's own Parquet writer run the way a
Conveyor job runs (a Python process, a partition per ctid half on a thread of its own), with Conveyor's extra work added
one piece at a time, and the shipped pipeline beside them.

    python benchmarks/pg_parquet_floor.py --sf 1 --tables orders,lineitem --rounds 3

One throwaway PostgreSQL server holding TPC-H's tables in TPC-H's own DDL (char(n), numeric(15,2)); every job a process
of its own, run in rounds (one run of each per round), timed whole, with its CPU-seconds (the process and its children;
the source server) and its peak resident memory (``bench.run_process``). Every output is counted from the Parquet
footers against the table's rows. The variants (``--child``):

- ``duckdb CLI``: the baseline of the shipped-defaults group: ``COPY (SELECT * FROM src.public.T) TO ...`` (DuckDB's
  parallel scan of the attached table). It writes char(n) without its padding and a numeric NaN as 0.
- ``python duckdb``: DuckDB's ``COPY (SELECT * FROM postgres_query(...)) TO`` per ctid half, each on a thread with a
  cursor of its own (what a Conveyor task would run were its Parquet written by DuckDB, not pyarrow); nothing else
  imported but duckdb and the extension.
- ``+ NaN guard``: the partition's query as Conveyor's source sends it, failing at a numeric NaN (reading.refusing_sql).
- ``+ char(n) padded``: each char(n) column padded back to n characters (``rpad``), as Conveyor writes it: now the same
  values as the job's.
- ``+ the job's imports``: pyarrow (compute, parquet), psycopg and hydra imported first, as a job's process has them.
- ``conveyor run pipeline=postgres_to_parquet``: the shipped pipeline (DuckDB decodes into Arrow, pyarrow writes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
VARIANTS = [("python duckdb", {"guard": False, "pad": False, "imports": False}),
            ("+ NaN guard", {"guard": True, "pad": False, "imports": False}),
            ("+ char(n) padded", {"guard": True, "pad": True, "imports": False}),
            ("+ the job's imports", {"guard": True, "pad": True, "imports": True})]


def child(spec: dict) -> None:
    """One DuckDB-written job in this process: the table's ctid halves, each COPY'd to a file of its own on a thread."""
    if spec["imports"]:
        import hydra  # noqa: F401
        import psycopg  # noqa: F401
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401
    import duckdb

    db = duckdb.connect(config={"extension_directory": spec["extension_directory"], "threads": 1})
    db.execute("LOAD postgres")
    db.execute("SET pg_connection_cache = false")
    db.execute(f"ATTACH '{spec['dsn']}' AS src (TYPE postgres, READ_ONLY)")
    cols, pages, table = spec["columns"], spec["pages"], spec["table"]
    numerics = [name for name, typ, _ in cols if typ.startswith("numeric")]
    whens = " ".join(f"WHEN {n} = 'NaN' THEN ('nan{i}' || {n})::int" for i, n in enumerate(numerics))
    select = ", ".join(f"rpad({n}, {mod - 4}, ' ') AS {n}" if spec["pad"] and typ.startswith("character(") else n for n, typ, mod in cols)
    step = pages // 2 + 1
    errors: list[BaseException] = []

    def part(i: int) -> None:
        try:
            sql = f"SELECT * FROM {table} WHERE ctid >= '({i * step},0)'::tid AND ctid < '({(i + 1) * step},0)'::tid"
            if spec["guard"] and whens:
                sql += f" AND (CASE {whens} ELSE 0 END) <> 1"
            quoted = sql.replace("'", "''")
            db.cursor().execute(f"COPY (SELECT {select} FROM postgres_query('src', '{quoted}')) TO '{spec['out']}/part-{i}.parquet' "
                                "(FORMAT parquet, COMPRESSION zstd)")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=part, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--tables", default="orders,lineitem")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    sys.path.insert(0, str(HERE))
    import bench
    import pyarrow.parquet as pq

    from conveyor.testing.pgserver import PgServer

    work = Path(tempfile.mkdtemp(prefix="conveyor-floor-"))
    tables = args.tables.split(",")
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), f"--tables={','.join(tables)}",
                    "--parts=2", f"--output-dir={work}"], check=True)
    try:
        return _measure(args, work, tables, bench, pq, PgServer)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(args: argparse.Namespace, work: Path, tables: list[str], bench: Any, pq: Any, PgServer: Any) -> int:
    lines = [f"# PostgreSQL -> Parquet floor, TPC-H SF{args.sf:g} (`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M')})", ""]
    with PgServer("floor-src") as src:
        os.environ["PGPASSWORD"] = src.password
        duck = bench.DuckBaseline(src, src, work)
        for t in tables:
            bench.psql(src, f"CREATE TABLE {t} ({bench.TPCH_DDL[t]})")
            bench.conveyor({"source": {"type": "parquet", "path": str(work / t)}, "sink": {"type": "postgres", "port": src.port, "table": t},
                            "strategy": {"type": "files"}, "load_mode": "append", "degree": 2})
            bench.psql(src, f"VACUUM ANALYZE {t}")
        for t in tables:
            rows = int(bench.psql(src, f"SELECT count(*) FROM {t}"))
            pages = int(bench.psql(src, f"SELECT relpages FROM pg_class WHERE relname = '{t}'"))
            cols = [line.split("|") for line in bench.psql(src, "SELECT attname, format_type(atttypid, atttypmod), atttypmod FROM pg_attribute "
                                                               f"WHERE attrelid = '{t}'::regclass AND attnum > 0 ORDER BY attnum").splitlines()]
            out = work / f"out_{t}"
            base = {"table": t, "pages": pages, "columns": [(n, typ, int(mod)) for n, typ, mod in cols], "out": str(out),
                    "extension_directory": str(duck.extension_directory), "dsn": f"host=127.0.0.1 port={src.port} user=postgres dbname=postgres"}
            jobs = [("duckdb CLI", duck.cli_args("src", duck.pg_to_parquet_sql(t, out)))]
            jobs += [(name, [sys.executable, __file__, "--child", json.dumps({**base, **flags})]) for name, flags in VARIANTS]
            jobs.append(("conveyor run pipeline=postgres_to_parquet",
                         [str(Path(sys.executable).parent / "conveyor"), "run", "pipeline=postgres_to_parquet", f"source.port={src.port}",
                          f"source.table={t}", f"sink.path={out}", f"hydra.run.dir={work}/runs/{t}"]))
            timer = bench.Bench(src, src, args.rounds, work)  # its _timed: wall, CPU-s (the watch's taken off), peak memory
            got: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _ in jobs}

            def fresh(out: Path = out) -> None:
                subprocess.run(["rm", "-rf", str(out)], check=True)
                out.mkdir()

            for _ in range(args.rounds):
                for name, argv in jobs:
                    def run(name: str = name, argv: list[str] = argv) -> None:
                        code, err = bench.run_process(argv, {**os.environ}, cwd=work)
                        if code != 0:
                            raise RuntimeError(f"{name} failed: {err[-2000:]}")

                    seconds, cpu, _, peak = timer._timed(run, fresh)
                    written = sum(pq.ParquetFile(p).metadata.num_rows for p in out.rglob("*.parquet"))
                    if written != rows:
                        raise RuntimeError(f"{name}: {written} rows written, {rows} in {t}")
                    got[name].append((seconds, cpu["client"], cpu["source_server"], peak))
                    print(f"{t:9} {name:44} {seconds:6.2f} s  cpu client {cpu['client']:5.2f} source {cpu['source_server']:5.2f}  "
                          f"peak {peak:4.0f} MB", flush=True)
            cli = statistics.median(s for s, *_ in got["duckdb CLI"])
            lines += [f"## {t} ({rows:,} rows)", "",
                      "| job | wall s (rounds) | median vs DuckDB CLI | client CPU-s | source CPU-s | peak MB |", "|---|---|---:|---|---|---|"]
            for name, runs in got.items():
                med = statistics.median(s for s, *_ in runs)
                lines.append(f"| {name} | {' '.join(f'{r[0]:.2f}' for r in runs)} | {med / cli:.2f}x | {' '.join(f'{r[1]:.1f}' for r in runs)} | "
                             f"{' '.join(f'{r[2]:.1f}' for r in runs)} | {' '.join(f'{r[3]:.0f}' for r in runs)} |")
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
