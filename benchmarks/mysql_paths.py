"""MySQL -> PostgreSQL by each of Conveyor's paths beside the raw path, on one pair of throwaway servers, in
rounds (one run of each per round), with the MySQL server's CPU-seconds:

    .venv/bin/python benchmarks/mysql_paths.py --sf 0.5 --rounds 3

- raw: ``SELECT * INTO OUTFILE`` on the MySQL server, then ``psql \\copy`` of that file (the server's own
  text, where the client and the server share a file system);
- pass-through: rows as COPY text lines written by the MySQL server, read by its client
  (conveyor/connectors/mysql/textcopy.py), degree 1 and 2 (rangeid on l_orderkey, a secondary index);
- arrow: the same job with ``sink.copy_path=arrow`` (DuckDB's mysql extension, then the PostgreSQL sink).
"""

from __future__ import annotations

import argparse
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
from conveyor.testing.mysqlserver import MySqlServer
from conveyor.testing.pgserver import PgServer


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in x[11:15]) / os.sysconf("SC_CLK_TCK")


def job(cfg: dict) -> object:
    return run_job(build_job(OmegaConf.create({"runtime": {"type": "local"}, "verify": "none", **cfg})))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arrow", action="store_true", help="also the Arrow path (about twice the pass-through's time)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-mysql-paths-"))
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=lineitem", "--parts=4",
                    f"--output-dir={work}"], check=True)
    psql = (psql_program() or ("psql", {}))[0]
    with MySqlServer("paths", settings={"innodb-buffer-pool-size": "1G"}) as my, PgServer("paths-dst", password="x") as pg:
        os.environ["MYSQL_PWD"], os.environ["PGPASSWORD"] = my.password, "x"
        conn = {"type": "mysql", "port": my.port, "user": my.user, "database": my.database}
        job({"source": {"type": "parquet", "path": str(work / "lineitem")}, "sink": {**conn, "table": "li"}, "strategy": {"type": "files"},
             "load_mode": "create", "degree": 2})
        my.execute("ALTER TABLE li ADD INDEX (l_orderkey)")
        mysqld = int(Path(f"{my.root}/pid").read_text())
        sink = {"type": "postgres", "port": pg.port}
        job({"source": {**conn, "table": "li"}, "sink": {**sink, "table": "shape"}, "strategy": {"type": "none"}, "load_mode": "replace"})
        out = f"{my.root}/out.tsv"

        def raw() -> None:
            subprocess.run([psql, "-X", "-q", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-c",
                            "DROP TABLE IF EXISTS raw_li; CREATE TABLE raw_li (LIKE shape)"], check=True)
            Path(out).unlink(missing_ok=True)
            my.execute(f"SELECT * FROM li INTO OUTFILE '{out}'")
            subprocess.run([psql, "-X", "-q", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-c", f"\\copy raw_li FROM '{out}'"],
                           check=True)

        def conveyor(path: str, degree: int) -> None:
            copy_path = "auto" if path == "pass-through" else "arrow"
            job({"source": {**conn, "table": "li"}, "sink": {**sink, "table": f"t_{path}", "copy_path": copy_path},
                 "strategy": {"type": "rangeid", "distribute_key": "l_orderkey"} if degree > 1 else {"type": "none"},
                 "load_mode": "replace", "degree": degree})

        cells = [("raw: SELECT INTO OUTFILE + psql \\copy", raw)]
        for path in ("pass-through", *(("arrow",) if args.arrow else ())):
            cells += [(f"conveyor {path} degree={d}", lambda p=path, d=d: conveyor(p, d)) for d in (1, 2)]
        for rnd in range(args.rounds):
            for name, run in cells:
                before, start = cpu(mysqld), time.perf_counter()
                run()
                print(f"round {rnd}  {name:42} {time.perf_counter() - start:6.2f} s  MySQL CPU {cpu(mysqld) - before:5.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
