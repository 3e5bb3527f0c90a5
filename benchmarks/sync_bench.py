"""A sync job's apply against reloading the table, and its lag under a steady write load (``make bench`` runs it
after bench.py with ``--groups sync``; alone:

    python benchmarks/sync_bench.py --sf 1 --repeat 2

TPC-H lineitem (its own DDL, primary key l_orderkey, l_linenumber) in a source server with wal_level=logical and
a PostgreSQL target loaded by the job's first run. The baseline is PostgreSQL's own logical replication into a
second database of the target server: a subscription (``copy_data``: its first load, timed until the table is
ready) that is disabled while Conveyor runs and enabled, and timed until it has applied up to the source's position,
for each change set. Each round makes one change set at the source (1% of the rows updated and 0.1% deleted, then
10% and 1%), then times, on the same changes: the sync run, the subscription's apply, and a reload of the table by
``load_mode=replace`` (ctid, degree 2); each checked against the source's checksum. Then ``incremental.follow=1``
runs for ``--follow-seconds`` while a writer commits small transactions, and its report's lag is sampled. Before that
(``--follow-applies``), the same change sets are applied by a running ``incremental.follow=1``, one iteration each: a
sync kept running, as the subscription's worker is, pays no process start per change set.
pgcopydb's ``--follow`` is not run: see benchmarks/results/ for why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench import CORES, TPCH_DDL, checksum, client_cpu, conveyor, psql, server_cpu

from conveyor.testing.pgserver import PgServer

BIN = Path(sys.executable).parent


def cli(*args: str, report: Path) -> dict:
    proc = subprocess.run([str(BIN / "conveyor"), "--report", str(report), *args], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(report.read_text())


def measured(run, **meters) -> tuple[float, dict[str, float]]:
    """``run``'s wall seconds, and the CPU-seconds each meter (a function: CPU-seconds so far) counted meanwhile, the
    client's (this process and its children) too."""
    meters = {"client": client_cpu, **meters}
    before = {k: m() for k, m in meters.items()}
    t0 = time.perf_counter()
    run()
    took = time.perf_counter() - t0
    return took, {k: round(m() - before[k], 2) for k, m in meters.items()}


def timed(run, src: PgServer, dst: PgServer) -> tuple[float, dict[str, float]]:
    return measured(run, source=lambda: server_cpu(src), target=lambda: server_cpu(dst))


class subscription:
    """PostgreSQL's own logical replication of lineitem from ``src`` into the database ``sub`` of ``dst``."""

    db = "sub"

    def __init__(self, src: PgServer, dst: PgServer) -> None:
        self.src, self.dst = src, dst
        psql(dst, f"CREATE DATABASE {self.db}")
        psql(dst, f"CREATE TABLE lineitem ({TPCH_DDL['lineitem']}, PRIMARY KEY (l_orderkey, l_linenumber))", db=self.db)
        psql(src, "CREATE PUBLICATION bench_pub FOR TABLE lineitem")

    def start(self) -> None:
        """Subscribe with copy_data; back once the table's initial copy is done (its state 'r', ready)."""
        psql(self.dst, f"CREATE SUBSCRIPTION bench_sub CONNECTION 'host=127.0.0.1 port={self.src.port} user=postgres "
                       f"password={self.src.password} dbname=postgres' PUBLICATION bench_pub", db=self.db)
        self._wait("SELECT count(*) = 1 AND bool_and(srsubstate = 'r') FROM pg_subscription_rel", 3600)
        self.catch_up()

    def pause(self) -> None:
        psql(self.dst, "ALTER SUBSCRIPTION bench_sub DISABLE", db=self.db)
        self._wait("SELECT count(*) = 0 FROM pg_stat_subscription WHERE pid IS NOT NULL", 120)

    def catch_up(self) -> None:
        """Enable it, and wait until its slot confirms the source's position now (every change before it applied)."""
        at = psql(self.src, "SELECT pg_current_wal_lsn()")
        psql(self.dst, "ALTER SUBSCRIPTION bench_sub ENABLE", db=self.db)
        deadline = time.monotonic() + 3600
        while psql(self.src, f"SELECT coalesce(confirmed_flush_lsn >= '{at}', false) FROM pg_replication_slots WHERE slot_name = 'bench_sub'") != "t":
            if time.monotonic() > deadline:
                raise RuntimeError("the subscription did not catch up in an hour")
            time.sleep(0.05)

    def drop(self) -> None:
        psql(self.dst, "ALTER SUBSCRIPTION bench_sub ENABLE", db=self.db)
        psql(self.dst, "DROP SUBSCRIPTION bench_sub", db=self.db)
        psql(self.src, "DROP PUBLICATION bench_pub")

    def _wait(self, sql: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while psql(self.dst, sql, db=self.db) != "t":
            if time.monotonic() > deadline:
                raise RuntimeError(f"waited {seconds:g} s for: {sql}")
            time.sleep(0.05)


def follow_applies(cells: list[dict], work: Path, sync: list[str], src: PgServer, dst: PgServer) -> None:
    """The same change sets applied by a running ``incremental.follow=1`` (as the subscription's worker runs all along):
    each change made while it is held still (SIGSTOP), its next iteration's own seconds (from reading the targets' position to the slot
    advanced: no process start, no Hydra, no wait for the next second) from the report, the target checked after."""
    report = work / "follow-applies.json"
    proc = subprocess.Popen([str(BIN / "conveyor"), "--report", str(report), *sync, "incremental.follow=1",
                             f"hydra.run.dir={work}/follow-applies"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made: list[tuple[str, str]] = []
    try:
        time.sleep(8)  # its first run (nothing to apply) and a wait
        for r, (updated, deleted) in enumerate([(1, 0.1), (10, 1), (1, 0.1), (10, 1)], start=100):
            # the process held still while the change is made: an iteration that began during it would wait for its commit
            # (a run's snapshot comes after every transaction open when it begins), where the subscription is timed from
            # a committed change
            proc.send_signal(signal.SIGSTOP)
            try:
                psql(src, f"UPDATE lineitem SET l_comment = 'round {r}', l_quantity = l_quantity + 1 WHERE l_orderkey % 1000 < {updated * 10}; "
                          f"DELETE FROM lineitem WHERE l_orderkey % 1000 >= {500 + r} AND l_orderkey % 1000 < {500 + r + deleted * 10}")
            finally:
                proc.send_signal(signal.SIGCONT)
            # applied within the wait (the runs' seconds say how long each took); the checksums after it, not beside the run
            time.sleep(4 if updated == 1 else 16)
            made.append((f"{updated:g}% updated, {deleted:g}% deleted", checksum(src, "lineitem")))
            if checksum(dst, "lineitem") != made[-1][1]:
                raise RuntimeError(f"follow did not apply change set {r} within the wait")
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=120)
    runs = [run for run in json.loads(report.read_text())["sync"]["runs"] if run["changes"]]
    if len(runs) != len(made):
        raise RuntimeError(f"follow applied {len(made)} change sets in {len(runs)} runs")
    for run, (change, _) in zip(runs, made):
        cells.append({"name": f"follow=1: one iteration applies the change ({change})", "seconds": [run["seconds"]], "changes": run["changes"],
                      "phases": run["phases"], "verified": True})
        print(f"follow iteration ({change}): {run['seconds']:.2f} s, {run['changes']:,} changes, phases {run['phases']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--follow-seconds", type=float, default=30)
    ap.add_argument("--writes-per-second", type=float, default=50)
    ap.add_argument("--writers", type=int, default=1, help="connections the write load is spread over (3,000/s needs 2 here)")
    ap.add_argument("--follow-applies", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the change sets applied by a running incremental.follow=1 (one iteration each)")
    ap.add_argument("--out", default=f".bench/sync-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="conveyor-sync-bench-"))
    subprocess.run([str(BIN / "tpchgen-cli"), "parquet", "-s", str(args.sf), "--tables=lineitem", "--parts=8", f"--output-dir={work}"],
                   check=True)
    cells: list[dict] = []
    with PgServer("sync-src", logical=True) as src, PgServer("sync-dst") as dst:
        os.environ["PGPASSWORD"] = src.password
        psql(src, f"CREATE TABLE lineitem ({TPCH_DDL['lineitem']}, PRIMARY KEY (l_orderkey, l_linenumber))")
        conveyor({"source": {"type": "parquet", "path": str(work / "lineitem")}, "sink": {"type": "postgres", "port": src.port, "table": "lineitem"},
                  "strategy": {"type": "files"}, "load_mode": "append", "degree": 2})
        psql(src, "VACUUM ANALYZE lineitem")
        rows = int(psql(src, "SELECT count(*) FROM lineitem"))
        common = ["source=postgres", "sink=postgres", f"source.port={src.port}", "source.table=lineitem", f"sink.port={dst.port}",
                  "load_mode=replace", "strategy=ctid", "degree=2", "runtime=local"]
        sync = ["run", *common, "sink.table=lineitem", "incremental.method=replication", "verify=count"]
        took, cpu = timed(lambda: cli(*sync, f"hydra.run.dir={work}/first", report=work / "first.json"), src, dst)
        cells.append({"name": "first run (the load in the slot's snapshot)", "seconds": [took], "cpu": cpu})
        print(f"first run {took:.2f} s", flush=True)
        sub = subscription(src, dst)
        took, cpu = timed(lambda: sub.start(), src, dst)
        cells.append({"name": "baseline: the subscription's copy_data (its first load)", "seconds": [took], "cpu": cpu,
                      "verified": checksum(dst, "lineitem", sub.db) == checksum(src, "lineitem")})
        print(f"subscription copy_data {took:.2f} s", flush=True)
        sub.pause()
        for r, (updated, deleted) in enumerate([(1, 0.1), (10, 1)] * args.repeat):
            # updated% of the orders' lines updated, deleted% deleted (by order key, from orders the updates left alone)
            psql(src, f"UPDATE lineitem SET l_comment = 'round {r}', l_quantity = l_quantity + 1 WHERE l_orderkey % 1000 < {updated * 10}; "
                      f"DELETE FROM lineitem WHERE l_orderkey % 1000 >= 500 AND l_orderkey % 1000 < {500 + deleted * 10}")
            expect = checksum(src, "lineitem")
            change = f"{updated:g}% updated, {deleted:g}% deleted"
            took, cpu = timed(lambda r=r: cli(*sync, f"hydra.run.dir={work}/apply{r}", report=work / f"apply{r}.json"), src, dst)
            applied = json.loads((work / f"apply{r}.json").read_text())["sync"]["runs"][0]
            ok = checksum(dst, "lineitem") == expect
            cells.append({"name": f"sync run: apply the change ({change})", "round": r, "seconds": [took], "cpu": cpu,
                          "changes": applied["changes"], "keys": applied["keys"], "phases": applied["phases"],
                          "changes_per_second": round(applied["changes"] / took), "verified": ok})
            print(f"apply {r} ({change}): {took:.2f} s, {applied['changes']:,} changes ({applied['changes'] / took:,.0f}/s), cpu {cpu}, "
                  f"phases {applied['phases']}, {'ok' if ok else 'MISMATCH'}", flush=True)
            took, cpu = timed(sub.catch_up, src, dst)
            ok = checksum(dst, "lineitem", sub.db) == expect
            sub.pause()
            cells.append({"name": f"baseline: the subscription applies the change ({change})", "round": r, "seconds": [took], "cpu": cpu,
                          "verified": ok})
            print(f"subscription {r} ({change}): {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
            if updated == 10:
                reload = ["run", *common, "sink.table=lineitem_reload"]
                took, cpu = timed(lambda r=r, reload=reload: cli(*reload, f"hydra.run.dir={work}/reload{r}", report=work / f"reload{r}.json"),
                                  src, dst)
                ok = checksum(dst, "lineitem_reload") == expect
                cells.append({"name": "reload: conveyor replace, ctid degree 2", "round": r, "seconds": [took], "cpu": cpu, "verified": ok})
                print(f"reload {r}: {took:.2f} s, cpu {cpu}, {'ok' if ok else 'MISMATCH'}", flush=True)
        sub.drop()
        if args.follow_applies:
            follow_applies(cells, work, sync, src, dst)
        # the lag under a steady write load, while --follow runs
        stop = threading.Event()
        written = [0] * args.writers

        def writer(w: int) -> None:
            """Single-row updates, paced to the rate's share of this writer (not slept after each: a steady rate)."""
            import psycopg

            with psycopg.connect(src.dsn(), autocommit=True) as con:
                i, start = 0, time.monotonic()
                deadline = start + args.follow_seconds + 30
                while not stop.is_set() and time.monotonic() < deadline:
                    n = i * args.writers + w
                    con.execute(f"UPDATE lineitem SET l_comment = 'w{n}' WHERE l_orderkey = {1 + (n * 7919) % (rows // 4)} "
                                "AND l_linenumber = 1")
                    i += 1
                    written[w] = i
                    ahead = start + i * args.writers / args.writes_per_second - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)

        report = work / "follow.json"
        follow = subprocess.Popen([str(BIN / "conveyor"), "--report", str(report), *sync, "incremental.follow=1",
                                   f"hydra.run.dir={work}/follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(args.writers)]
        for thread in threads:
            thread.start()
        time.sleep(args.follow_seconds)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        time.sleep(3)
        follow.send_signal(2)
        follow.communicate(timeout=120)
        runs = json.loads(report.read_text())["sync"]["runs"]
        lags = sorted(r["lag_seconds"] for r in runs)
        lag_bytes = sorted(r["lag_bytes"] for r in runs)
        cells.append({"name": f"--follow 1 s under {args.writes_per_second:.0f} single-row updates/s", "runs": len(runs),
                      "lag_seconds_median": lags[len(lags) // 2], "lag_seconds_max": lags[-1], "lag_bytes_median": lag_bytes[len(lag_bytes) // 2],
                      "lag_bytes_max": lag_bytes[-1], "writes": sum(written),
                      "writes_per_second": round(sum(written) / args.follow_seconds),
                      "verified": checksum(dst, "lineitem") == checksum(src, "lineitem")})
        print(f"follow: {len(runs)} runs, lag median {lags[len(lags) // 2]:.2f} s max {lags[-1]:.2f} s, bytes median "
              f"{lag_bytes[len(lag_bytes) // 2]:,} max {lag_bytes[-1]:,}; {sum(written)} writes "
              f"({sum(written) / args.follow_seconds:,.0f}/s)", flush=True)
    (out / "sync.json").write_text(json.dumps({"sf": args.sf, "rows": rows, "cores": CORES, "cells": cells}, indent=2))
    print(f"results: {out / 'sync.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
