"""A MySQL / MariaDB sync's apply against reloading the table and against its first load (``make bench`` runs it after
the sync group; alone:

    python benchmarks/mysql_sync_bench.py --sf 1

TPC-H lineitem (primary key l_orderkey, l_linenumber) in a throwaway MariaDB with its binary log on (ROW, FULL images),
synced into a throwaway PostgreSQL by ``source=mysql incremental.method=replication`` (rangeid on l_orderkey, degree
2, runtime=local). Then for each change set (1% of the rows updated and 0.1% deleted, then 10% and 1%): the sync run
(its phases: decoding the binlog's keys, staging the changed rows, applying them), and a reload of the table by
``load_mode=replace`` with the same strategy. Each target is checked against the source by count and sums of its
numeric columns and of the rows the change marked, read on both servers. The binlog decoding's rate is the run's
changes over its ``decode`` phase.
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

sys.path.insert(0, str(Path(__file__).parent))

from bench import CORES, conveyor, psql, server_cpu
from sync_bench import cli, measured

from conveyor.testing.mysqlserver import BINLOG, MySqlServer
from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent
SUMS = "count(*), sum(l_quantity), sum(l_extendedprice), sum(l_orderkey * 10 + l_linenumber), sum({marked})"


def my_cpu(server: MySqlServer) -> float:
    pid = int(Path(f"{server.root}/pid").read_text())
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in x[11:15]) / os.sysconf("SC_CLK_TCK")


def same(my: MySqlServer, pg: PgServer, table: str) -> bool:
    """Count, sums of the numeric columns and of the key, and the rows a change marked: equal on both servers."""
    from decimal import Decimal

    mine = SUMS.format(marked="l_comment LIKE 'round%'")
    theirs = SUMS.format(marked="(l_comment LIKE 'round%')::int")
    want = [Decimal(str(v)) for v in my.execute(f"SELECT {mine} FROM lineitem")[0]]
    got = [Decimal(v) for v in psql(pg, f"SELECT {theirs} FROM {table}").split("|")]
    return want == got


def timed(run, my: MySqlServer, pg: PgServer) -> tuple[float, dict[str, float]]:
    return measured(run, source=lambda: my_cpu(my), target=lambda: server_cpu(pg))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--out", default=f".bench/mysql-sync-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-mysql-sync-bench-"))
    subprocess.run([str(BIN / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=lineitem", "--parts=8", f"--output-dir={work}"],
                   check=True)
    cells: list[dict] = []
    settings = {**BINLOG, "innodb-buffer-pool-size": "2G", "max-binlog-size": "1G"}
    with MySqlServer("sync-bench", settings=settings) as my, PgServer("mysql-sync-dst") as pg:
        os.environ["MYSQL_PWD"], os.environ["PGPASSWORD"] = my.password, pg.password
        conn = {"type": "mysql", "port": my.port, "user": my.user, "database": my.database}
        conveyor({"source": {"type": "parquet", "path": str(work / "lineitem")}, "sink": {**conn, "table": "lineitem"},
                  "strategy": {"type": "files"}, "load_mode": "create", "degree": 2})
        my.execute("ALTER TABLE lineitem ADD PRIMARY KEY (l_orderkey, l_linenumber)", "ANALYZE TABLE lineitem")
        rows = int(my.execute("SELECT count(*) FROM lineitem")[0][0])
        common = ["source=mysql", "sink=postgres", f"source.port={my.port}", f"source.user={my.user}", f"source.database={my.database}",
                  "source.table=lineitem", f"sink.port={pg.port}", "load_mode=replace", "strategy=rangeid",
                  "strategy.distribute_key=l_orderkey", "degree=2", "runtime=local"]
        sync = ["run", *common, "sink.table=lineitem", "incremental.method=replication"]
        took, cpu = timed(lambda: cli(*sync, f"hydra.run.dir={work}/first", report=work / "first.json"), my, pg)
        ok = same(my, pg, "lineitem")
        cells.append({"name": "first run (the load, then the changes made while it read)", "seconds": [round(took, 2)], "cpu": cpu,
                      "verified": ok})
        print(f"first run {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
        for r, (updated, deleted) in enumerate([(1, 0.1), (10, 1)]):
            my.execute(f"UPDATE lineitem SET l_comment = 'round {r}', l_quantity = l_quantity + 1 WHERE l_orderkey % 1000 < {updated * 10}",
                       f"DELETE FROM lineitem WHERE l_orderkey % 1000 >= 500 AND l_orderkey % 1000 < {500 + deleted * 10}")
            change = f"{updated:g}% updated, {deleted:g}% deleted"
            took, cpu = timed(lambda r=r: cli(*sync, f"hydra.run.dir={work}/apply{r}", report=work / f"apply{r}.json"), my, pg)
            applied = json.loads((work / f"apply{r}.json").read_text())["sync"]["runs"][0]
            ok = same(my, pg, "lineitem")
            decode = applied["phases"].get("decode", 0.0)
            cells.append({"name": f"sync run: apply the change ({change})", "round": r, "seconds": [round(took, 2)], "cpu": cpu,
                          "changes": applied["changes"], "keys": applied["keys"], "phases": applied["phases"],
                          "changes_per_second": round(applied["changes"] / took),
                          "decoded_changes_per_second": round(applied["changes"] / decode) if decode else None, "verified": ok})
            print(f"apply {r} ({change}): {took:.2f} s, {applied['changes']:,} changes, cpu {cpu}, phases {applied['phases']}, "
                  f"decoding {applied['changes'] / decode if decode else 0:,.0f} changes/s, {'ok' if ok else 'MISMATCH'}", flush=True)
            reload = ["run", *common, "sink.table=lineitem_reload"]
            took, cpu = timed(lambda r=r, reload=reload: cli(*reload, f"hydra.run.dir={work}/reload{r}", report=work / f"reload{r}.json"), my, pg)
            ok = same(my, pg, "lineitem_reload")
            cells.append({"name": "reload: conveyor replace, rangeid degree 2", "round": r, "seconds": [round(took, 2)], "cpu": cpu,
                          "verified": ok})
            print(f"reload {r}: {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
    (out / "mysql_sync.json").write_text(json.dumps({"sf": args.sf, "rows": rows, "cores": CORES, "cells": cells}, indent=2))
    print(f"results: {out / 'mysql_sync.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
