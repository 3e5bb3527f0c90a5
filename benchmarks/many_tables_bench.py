"""Many small tables, PostgreSQL -> PostgreSQL: one whole-schema Conveyor job against ``pg_dump -j | pg_restore -j`` and
pgcopydb ``clone`` on the same schema (``make bench`` runs it; alone:

    python benchmarks/many_tables_bench.py [--tables 200] [--degree 2] [--repeat 1]

A schema of N tables (default 200) of 1,000 to 100,000 rows (geometric: about 4.3 M rows in all), each with a
bigint primary key and six other columns of four shapes (integers, numeric, text, timestamptz, date, boolean, jsonb,
uuid), made by SQL in a source server; a second server is the target, a new database for each tool (both servers
this machine's PostgreSQL, fsync off, as in bench.py). Each tool copies definitions, rows and the primary keys:

- Conveyor: ``conveyor run source.tables=[many.*] load_mode=create`` (the CLI, the whole process timed; its default
  ``verify=count`` of every table included) and ``pipeline=pg_migrate``'s first run (the whole database: pg_dump's
  pre- and post-data, the rows);
- ``pg_dump -Fd -j N`` then ``pg_restore -j N`` (directory format, the only one they parallelise), with pg_dump's
  default compression (gzip) and with ``-Z0``;
- pgcopydb 0.10 ``clone --table-jobs N --index-jobs N`` (Debian's; skipped when it is not installed).

Every target is compared with the source (count and an md5 of every row, per table). Reported: wall seconds,
CPU-seconds (client / source / target) and the per-table cost (wall seconds / tables). Output: a JSON file under
``.bench/``.
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

from bench import CORES, client_cpu, psql, server_cpu

from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent
SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_wal_size": "2GB"}
SHAPES = [
    "a int, b numeric(12,2), c text, d timestamptz, e date, f boolean",
    "a bigint, b text, c text, d jsonb, e uuid, f double precision",
    "a smallint, b numeric, c varchar(40), d timestamp, e int, f text",
    "a int, b int, c int, d bigint, e real, f date",
]
VALUES = [
    "g % 1000, (g * 7 % 100000) / 100.0, md5(g::text), timestamptz '2020-01-01' + g * interval '1 minute', "
    "date '2000-01-01' + g % 9000, g % 3 = 0",
    "g * 31, repeat('x', g % 20), 'row ' || g, jsonb_build_object('k', g, 'v', md5(g::text)), md5(g::text)::uuid, g / 7.0",
    "(g % 30000)::smallint, g * 1.5, left(md5(g::text), 30), timestamp '2021-06-01' + g * interval '1 second', g, NULL",
    "g, g + 1, g + 2, g::bigint * 1000003, g / 3.0, date '1990-01-01' + g % 12000",
]


def sizes(n: int) -> list[int]:
    """1,000 to 100,000 rows, geometric over the n tables."""
    return [int(1000 * 100 ** (i / max(n - 1, 1))) for i in range(n)]


def make_schema(src: PgServer, n: int) -> int:
    psql(src, "CREATE DATABASE many")
    statements = ["CREATE SCHEMA many"]
    for i, rows in enumerate(sizes(n)):
        shape = i % len(SHAPES)
        statements.append(f"CREATE TABLE many.t{i:03d} (id bigint PRIMARY KEY, {SHAPES[shape]})")
        statements.append(f"INSERT INTO many.t{i:03d} SELECT g, {VALUES[shape]} FROM generate_series(1, {rows}) g")
    psql(src, "; ".join(statements), db="many")
    psql(src, "VACUUM ANALYZE", db="many")
    return sum(sizes(n))


def checksums(server: PgServer, db: str) -> dict[str, str]:
    tables = psql(server, "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = 'many' "
                          "AND tablename NOT LIKE '\\_conveyor%' ORDER BY 1",
                  db=db).split()
    query = " UNION ALL ".join(f"SELECT '{t}', count(*) || ':' || md5(coalesce(string_agg(md5(x::text), '' ORDER BY md5(x::text)), '')) "
                               f"FROM {t} x" for t in tables)
    return dict(line.split("|", 1) for line in psql(server, query, db=db).splitlines()) if tables else {}


def keys(server: PgServer, db: str) -> int:
    return int(psql(server, "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                            "WHERE n.nspname = 'many' AND c.contype = 'p' AND c.conrelid::regclass::text NOT LIKE 'many._conveyor%'", db=db))


class Cell:
    """One tool's copy into a new database of the target, timed with the CPU of the client and both servers."""

    def __init__(self, src: PgServer, dst: PgServer, n: int, expected: dict[str, str], work: Path) -> None:
        self.src, self.dst, self.n, self.expected, self.work = src, dst, n, expected, work

    def measure(self, tool: str, target_db: str, run: Any) -> dict:
        psql(self.dst, f"DROP DATABASE IF EXISTS {target_db}")
        psql(self.dst, f"CREATE DATABASE {target_db}")
        before = (client_cpu(), server_cpu(self.src), server_cpu(self.dst))
        t0 = time.perf_counter()
        run(target_db)
        wall = time.perf_counter() - t0
        after = (client_cpu(), server_cpu(self.src), server_cpu(self.dst))
        got = checksums(self.dst, target_db)
        phases = {}
        report = self.work / target_db / "report.json"
        if report.exists():  # Conveyor's own account of where the time went
            phases = {k: round(v, 2) for k, v in json.loads(report.read_text()).get("phases", {}).items()}
        return {"tool": tool, "wall_s": round(wall, 2), **({"phases": phases} if phases else {}), "per_table_ms": round(1000 * wall / self.n, 1),
                "cpu": {k: round(a - b, 2) for k, a, b in zip(("client", "source", "target"), after, before)},
                "equal": got == self.expected, "tables": len(got), "primary_keys": keys(self.dst, target_db)}


def _run(args: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {(done.stderr or done.stdout)[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--degree", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each tool (the best is reported beside every run)")
    ap.add_argument("--cells", default="conveyor,migrate,pg_dump,pg_dump_z0,pgcopydb")
    ap.add_argument("--out", default=f".bench/many-tables-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-many-bench-"))
    d = args.degree
    cells: list[dict] = []
    with PgServer("many-src", settings=SETTINGS, logical=True) as src, PgServer("many-dst", settings=SETTINGS) as dst:
        env = {**os.environ, "PGPASSWORD": src.password}
        rows = make_schema(src, args.tables)
        cell = Cell(src, dst, args.tables, checksums(src, "many"), work)
        common = [f"source.port={src.port}", "source.dbname=many", f"sink.port={dst.port}", f"degree={d}", "runtime=local"]

        def conveyor_job(db: str) -> None:
            psql(dst, "CREATE SCHEMA many", db=db)  # part of the timed cell: what a user does first
            _run([str(BIN / "conveyor"), "run", "source=postgres", "sink=postgres", "source.tables=[many.*]", "sink.schema=many",
                  "load_mode=create", f"sink.dbname={db}", *common, f"hydra.run.dir={work}/{db}"], env)

        def conveyor_migrate(db: str) -> None:
            _run([str(BIN / "conveyor"), "run", "pipeline=pg_migrate", f"sink.dbname={db}", *common, f"hydra.run.dir={work}/{db}"], env)

        def pg_dump_restore(db: str, compress: list[str] | None = None) -> None:
            folder = work / f"dump-{db}"
            shutil.rmtree(folder, ignore_errors=True)
            _run(["pg_dump", "-Fd", *(compress or []), "-j", str(d), "-f", str(folder), "-n", "many", "-d", src.dsn("many")], env)
            _run(["pg_restore", "-j", str(d), "--no-owner", "-d", dst.dsn(db), str(folder)], env)

        def pgcopydb_clone(db: str) -> None:
            folder = work / f"pgcopydb-{db}"
            shutil.rmtree(folder, ignore_errors=True)
            _run(["pgcopydb", "clone", "--source", src.url("many"), "--target", dst.url(db), "--table-jobs", str(d),
                  "--index-jobs", str(d), "--dir", str(folder)], env)

        tools = {"conveyor": ("conveyor run source.tables=[many.*] load_mode=create", conveyor_job),
                 "migrate": ("conveyor pipeline=pg_migrate (first run)", conveyor_migrate),
                 "pg_dump": (f"pg_dump -Fd -j {d} | pg_restore -j {d}", pg_dump_restore),
                 "pg_dump_z0": (f"pg_dump -Fd -Z0 -j {d} | pg_restore -j {d}", lambda db: pg_dump_restore(db, ["-Z0"])),
                 "pgcopydb": (f"pgcopydb clone --table-jobs {d} --index-jobs {d}", pgcopydb_clone)}
        wanted = [c for c in args.cells.split(",") if c != "pgcopydb" or shutil.which("pgcopydb")]
        for r in range(args.repeat):
            for name in wanted:
                label, run = tools[name]
                try:
                    result = {"run": r + 1, **cell.measure(label, f"{name}_{r}", run)}
                except Exception as exc:  # a cell that failed is reported, the others stand
                    result = {"run": r + 1, "tool": label, "error": str(exc)[-1500:]}
                cells.append(result)
                print(json.dumps(result), flush=True)
    result_file = out / "many-tables.json"
    result_file.write_text(json.dumps({"tables": args.tables, "rows": rows, "degree": d, "cores": CORES, "cells": cells}, indent=2))
    print(f"results: {result_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
