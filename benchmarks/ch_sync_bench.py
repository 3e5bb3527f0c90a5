"""A sync into ClickHouse: a run's apply (its partitions rebuilt on the server and swapped in) against reloading the
table (``make bench`` runs it after the sync group; alone:

    python benchmarks/ch_sync_bench.py --sf 1

TPC-H lineitem (primary key l_orderkey, l_linenumber) in a PostgreSQL source with wal_level=logical, synced into a
throwaway ClickHouse (18.16) by ``incremental.method=replication`` (ctid, degree 2, runtime=local), once into a table
partitioned by ``intDiv(l_orderkey, 1000000)`` and once into one without ``PARTITION BY``. For each: the first run,
then a change of 1% of the rows updated and 0.1% deleted (spread over the whole key range: every partition is
touched), the sync run that applies it (partitioned: also 1% updated within one key range, one partition touched),
and a reload of the table by ``load_mode=replace``. Each target is checked
against the source by count and sums of numeric columns and of the rows the change marked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench import CORES, TPCH_DDL, conveyor, psql, server_cpu
from sync_bench import cli, measured

from conveyor.testing.chserver import ClickHouseServer
from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent
SUMS = "count(), sum(l_quantity), sum(l_extendedprice), sum(l_orderkey * 10 + l_linenumber), sum({marked})"


def ch_cpu(server: ClickHouseServer) -> float:
    proc = getattr(server, "_proc", None)
    if proc is None:
        return 0.0
    with open(f"/proc/{proc.pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in x[11:15]) / os.sysconf("SC_CLK_TCK")


def same(pg: PgServer, ch: ClickHouseServer, table: str) -> bool:
    """Count, sums of the numeric columns and of the key, and the rows the change marked: equal on both servers."""
    theirs = SUMS.format(marked="(l_comment LIKE 'round%')::int").replace("count()", "count(*)")
    mine = SUMS.format(marked="l_comment LIKE 'round%'")
    want = [Decimal(v) for v in psql(pg, f"SELECT {theirs} FROM lineitem").split("|")]
    got = [Decimal(v) for v in ch.execute(f"SELECT {mine} FROM {table}")[0]]
    return want == got


def timed(run, pg: PgServer, ch: ClickHouseServer) -> tuple[float, dict[str, float]]:
    return measured(run, source=lambda: server_cpu(pg), target=lambda: ch_cpu(ch))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--out", default=f".bench/ch-sync-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-ch-sync-bench-"))
    subprocess.run([str(BIN / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=lineitem", "--parts=8", f"--output-dir={work}"],
                   check=True)
    cells: list[dict] = []
    with PgServer("ch-sync-src", logical=True) as pg, ClickHouseServer() as ch:
        os.environ["PGPASSWORD"], os.environ["CLICKHOUSE_PASSWORD"] = pg.password, ch.password
        psql(pg, f"CREATE TABLE lineitem ({TPCH_DDL['lineitem']}, PRIMARY KEY (l_orderkey, l_linenumber))")
        conveyor({"source": {"type": "parquet", "path": str(work / "lineitem")}, "sink": {"type": "postgres", "port": pg.port, "table": "lineitem"},
                  "strategy": {"type": "files"}, "load_mode": "append", "degree": 2})
        psql(pg, "VACUUM ANALYZE lineitem")
        rows = int(psql(pg, "SELECT count(*) FROM lineitem"))
        for r, (name, partition) in enumerate([("partitioned", "intDiv(l_orderkey, 1000000)"), ("one partition", None)]):
            table = f"li_{r}"
            common = ["source=postgres", "sink=clickhouse", f"source.port={pg.port}", "source.table=lineitem", f"sink.port={ch.http_port}",
                      f"sink.table={table}", "load_mode=replace", "strategy=ctid", "degree=2", "runtime=local",
                      *([f"sink.partition_by='{partition}'"] if partition else []), f"incremental.slot=bench_ch_{r}"]
            sync = ["run", *common, "incremental.method=replication"]
            took, cpu = timed(lambda r=r, sync=sync: cli(*sync, f"hydra.run.dir={work}/first{r}", report=work / f"first{r}.json"), pg, ch)
            ok = same(pg, ch, table)
            cells.append({"name": f"first run ({name})", "seconds": [round(took, 2)], "cpu": cpu, "verified": ok})
            print(f"first run ({name}) {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
            changes = [("1% updated, 0.1% deleted", f"UPDATE lineitem SET l_comment = 'round {r}', l_quantity = l_quantity + 1 "
                        "WHERE l_orderkey % 1000 < 10; DELETE FROM lineitem WHERE l_orderkey % 1000 >= 500 AND l_orderkey % 1000 < 501")]
            if partition:  # the same share of rows, in one key range: one partition rewritten
                changes.append(("1% updated in one key range", f"UPDATE lineitem SET l_comment = 'round {r}b', "
                                "l_quantity = l_quantity + 1 WHERE l_orderkey < 60000"))
            for c, (change, sql) in enumerate(changes):
                psql(pg, sql)
                report = work / f"apply{r}{c}.json"
                took, cpu = timed(lambda sync=sync, report=report: cli(*sync, f"hydra.run.dir={report.with_suffix('')}", report=report),
                                  pg, ch)
                applied = json.loads(report.read_text())["sync"]["runs"][0]
                ok = same(pg, ch, table)
                detail = applied["tables"]["public.lineitem"].get("detail", "")
                cells.append({"name": f"sync run: apply {change} ({name})", "seconds": [round(took, 2)], "cpu": cpu,
                              "changes": applied["changes"], "keys": applied["keys"], "phases": applied["phases"], "rewrote": detail,
                              "verified": ok})
                print(f"apply {change} ({name}): {took:.2f} s, {applied['changes']:,} changes, {detail}, cpu {cpu}, "
                      f"phases {applied['phases']}, {'ok' if ok else 'MISMATCH'}", flush=True)
            reload = ["run", *[c for c in common if not c.startswith("incremental.")], f"sink.table={table}_reload"]
            took, cpu = timed(lambda r=r, reload=reload: cli(*reload, f"hydra.run.dir={work}/reload{r}", report=work / f"reload{r}.json"),
                              pg, ch)
            ok = same(pg, ch, f"{table}_reload")
            cells.append({"name": f"reload: conveyor replace, ctid degree 2 ({name})", "seconds": [round(took, 2)], "cpu": cpu,
                          "verified": ok})
            print(f"reload ({name}): {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
            psql(pg, f"SELECT pg_drop_replication_slot('bench_ch_{r}'); DROP PUBLICATION bench_ch_{r}")
    (out / "ch_sync.json").write_text(json.dumps({"sf": args.sf, "rows": rows, "cores": CORES, "cells": cells}, indent=2))
    print(f"results: {out / 'ch_sync.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
